#!/usr/bin/env python3
"""Records SGLang KV event streams with SGLang's own publisher and event code.

Not run by the build or the tests: the recordings beside this script are
test data, kept unchanged. This script says exactly how they were made, so
anyone can make them again (see README.md for what it needs).

SGLang's code is loaded from its files, unchanged:
  --kv-events   python/sglang/srt/disaggregation/kv_events.py
                (the structs, StorageMedium and ZmqEventPublisher)
  --events-mixin python/sglang/srt/mem_cache/events.py
                (KVCacheEventMixin: one BlockStored per page, one BlockRemoved
                per radix node)
  --utils       python/sglang/srt/mem_cache/utils.py (compute_node_hash_values,
                compute_node_event_hash_values, hash_str_to_int64)
  --page-hash   python/sglang/srt/mem_cache/hicache_storage.py of an older
                commit, for its pure-Python get_hash_str (one page:
                SHA-256 of the prior digest and the tokens as little-endian
                uint32). The newer utils.py computes the same chain in a
                C++ extension built by torch, which is not here; this script
                calls the old function page by page in its place.
The functions and classes are taken from those files by name (their source
compiled as it is), because importing the modules whole would pull in torch
and the rest of SGLang. What stands in for SGLang's radix tree is this
script's: nodes with a key, a parent and cached hashes, inserted, split and
evicted as RadixCache does, so the mixin sees what it sees in SGLang.
"""

import argparse
import ast
import enum
import json
import sys
import time
import types
from typing import Any, List, Optional

import msgspec
import zmq


def load_names(path, names, namespace):
    """Compiles the top-level definitions `names` of `path` into `namespace`."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    found = set()
    for node in tree.body:
        name = getattr(node, "name", None)
        if name in names:
            mod = ast.Module(body=[node], type_ignores=[])
            exec(compile(mod, path, "exec"), namespace)
            found.add(name)
    missing = set(names) - found
    if missing:
        sys.exit(f"{path}: no definition of {sorted(missing)}")


class Key:
    """SGLang's RadixKey as the mixin reads it."""

    def __init__(self, token_ids, cache_salt=None):
        self.token_ids = list(token_ids)
        self.cache_salt = cache_salt
        self.is_bigram = False

    def __len__(self):
        return len(self.token_ids)


class Node:
    def __init__(self, key, parent):
        self.key = key
        self.parent = parent
        self.children = {}
        self.hash_value = None
        self.event_hash_value = None


class Cache:
    """A radix tree of pages, standing in for RadixCache around the mixin."""

    def __init__(self, mixin_cls, page_size):
        self.page_size = page_size
        self.enable_kv_cache_events = True
        self.kv_event_queue = []
        self.root_node = Node(Key([]), None)
        self.root_node.hash_value = []
        self.mixin = mixin_cls
        self.live = []

    def _child_key(self, tokens, salt):
        return (salt, tuple(tokens[: self.page_size]))

    def insert(self, tokens, salt=None):
        """Inserts the whole pages of `tokens`; the mixin stores new nodes."""
        tokens = tokens[: len(tokens) // self.page_size * self.page_size]
        node = self.root_node
        while tokens:
            child = node.children.get(self._child_key(tokens, salt))
            if child is None:
                new = Node(Key(tokens, salt), node)
                node.children[self._child_key(tokens, salt)] = new
                self.live.append(new)
                self.mixin._record_store_event(self, new)
                return
            common = 0
            while (
                common < len(child.key)
                and common < len(tokens)
                and child.key.token_ids[common : common + self.page_size]
                == tokens[common : common + self.page_size]
            ):
                common += self.page_size
            if common < len(child.key):
                self._split(child, common, salt)
                child = node.children[self._child_key(tokens, salt)]
            node = child
            tokens = tokens[common:]

    def _split(self, child, at, salt):
        # As RadixCache._split_node: the first `at` tokens become a new parent;
        # the cached page hashes are split between the two, no events.
        parent = child.parent
        new = Node(Key(child.key.token_ids[:at], salt), parent)
        pages = at // self.page_size
        if child.hash_value is not None:
            new.hash_value, child.hash_value = child.hash_value[:pages], child.hash_value[pages:]
        if child.event_hash_value is not None:
            new.event_hash_value = child.event_hash_value[:pages]
            child.event_hash_value = child.event_hash_value[pages:]
        child.key = Key(child.key.token_ids[at:], salt)
        child.parent = new
        new.children[self._child_key(child.key.token_ids, salt)] = child
        parent.children[self._child_key(new.key.token_ids, salt)] = new
        self.live.append(new)

    def evict_leaf(self, node, medium=None, backed_up=False):
        """Evicts a leaf from `medium`; a node backed up on the host stays in
        the tree (HiRadixCache), to be evicted from there later."""
        assert not node.children, "only leaves are evicted"
        if not backed_up:
            del node.parent.children[self._child_key(node.key.token_ids, node.key.cache_salt)]
            self.live.remove(node)
        self.mixin._record_remove_event(self, node, medium)

    def backup(self, node, medium):
        """HiRadixCache writing a node to host memory: a store on that medium."""
        self.mixin._record_store_event(self, node, medium)

    def clear(self):
        self.root_node = Node(Key([]), None)
        self.root_node.hash_value = []
        self.live = []
        self.mixin._record_all_cleared_event(self)

    def leaf_of(self, tokens, salt=None):
        tokens = tokens[: len(tokens) // self.page_size * self.page_size]
        node = self.root_node
        while tokens:
            node = node.children[self._child_key(tokens, salt)]
            tokens = tokens[len(node.key) :]
        return node


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv-events", required=True)
    ap.add_argument("--events-mixin", required=True)
    ap.add_argument("--utils", required=True)
    ap.add_argument("--page-hash", required=True)
    ap.add_argument("--sglang-commit", required=True)
    ap.add_argument("--page-hash-commit", required=True)
    ap.add_argument("--scenario", required=True, choices=["G1_basic", "G2_dp"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    # kv_events.py is a self-contained module: import it whole.
    ev = types.ModuleType("sglang_kv_events")
    exec(compile(open(args.kv_events).read(), args.kv_events, "exec"), ev.__dict__)

    old = {"hashlib": __import__("hashlib"), "List": List}
    load_names(args.page_hash, ["get_hash_str"], old)

    def get_hash_str(token_ids, prior_hash=None, page_size=None):
        # Stands in for the C++ helper: the old function, page by page.
        tokens = list(getattr(token_ids, "token_ids", token_ids))
        out, prior = [], prior_hash
        for start in range(0, len(tokens), page_size):
            prior = old["get_hash_str"](tokens[start : start + page_size], prior)
            out.append(prior)
        return out

    utils = {"hashlib": __import__("hashlib"), "Any": Any, "List": List, "Optional": Optional,
             "get_hash_str": get_hash_str}
    load_names(args.utils, ["hash_str_to_int64", "compute_node_hash_values",
                            "compute_node_event_hash_values"], utils)
    mix = {"Any": Any}
    for name in ["AllBlocksCleared", "BlockRemoved", "BlockStored", "BlockStoredMetadata",
                 "BlockStoredWithMetadata", "StorageMedium"]:
        mix[name] = getattr(ev, name)
    for name in ["compute_node_event_hash_values", "compute_node_hash_values",
                 "hash_str_to_int64"]:
        mix[name] = utils[name]
    load_names(args.events_mixin, ["KVCacheEventMixin"], mix)
    mixin = mix["KVCacheEventMixin"]

    page = 16
    dp_rank = 1 if args.scenario == "G2_dp" else 0
    topic = "kv-events" if args.scenario == "G1_basic" else ""
    # SGLang's default: the PUB binds (a "*" endpoint), rank r on port + r,
    # and the recording SUB connects.
    probe = __import__("socket").socket()
    probe.bind(("127.0.0.1", 0))
    base = probe.getsockname()[1]
    probe.close()
    configured = f"tcp://*:{base}"
    pub = ev.ZmqEventPublisher(attn_dp_rank=dp_rank, endpoint=configured, topic=topic)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{base + dp_rank}")
    time.sleep(0.5)  # a SUB that connects misses what is sent before it joins

    cache = Cache(mixin, page)
    requests = []

    def run(tokens, salt=None):
        requests.append({"tokens": tokens, "cache_salt": salt})
        cache.insert(tokens, salt)

    batches = []

    def step():
        events = mixin.take_events(cache)
        if events:
            batch = ev.KVEventBatch(ts=time.time(), events=events)
            pub.publish(batch)
            batches.append(batch)

    system = list(range(1000, 1000 + 3 * page))
    if args.scenario == "G1_basic":
        run(system + list(range(1, 1 + 2 * page)) + [7, 7, 7])  # a partial page is not cached
        step()
        run(system + list(range(50, 50 + page)))  # splits the first node at the system prompt
        step()
        run(system + list(range(50, 50 + page)) + list(range(90, 90 + page)))  # decode-time page
        step()
        run(system[:page] + list(range(200, 200 + page)), salt="tenant-a")  # its own chain
        step()
        first = cache.leaf_of(system + list(range(1, 1 + 2 * page)))
        cache.backup(first, ev.StorageMedium.CPU)  # HiRadix host copy
        step()
        cache.evict_leaf(first, backed_up=True)  # one BlockRemoved for the node's two pages
        cache.evict_leaf(first, ev.StorageMedium.CPU)
        step()
        cache.clear()
        run(system)
        step()
    else:
        run(system + list(range(300, 300 + page)))
        step()
        run(system + list(range(400, 400 + page)))
        step()

    frames = []
    while len(frames) < len(batches) and sub.poll(5000):
        topic_b, seq_b, payload = sub.recv_multipart()
        frames.append({"topic_hex": topic_b.hex(), "seq": int.from_bytes(seq_b, "big"),
                       "seq_hex": seq_b.hex(), "payload_hex": payload.hex()})
    pub.shutdown()
    enc = msgspec.msgpack.Encoder()
    if [f["seq"] for f in frames] != list(range(len(batches))):
        sys.exit(f"incomplete stream: {len(frames)} frames for {len(batches)} batches")
    for f, b in zip(frames, batches):
        if bytes.fromhex(f["payload_hex"]) != enc.encode(b):
            sys.exit(f"frame {f['seq']} differs from its batch")

    for r in requests:
        # SGLang's id of each whole page of the request, as the mixin hashes it.
        toks = r["tokens"][: len(r["tokens"]) // page * page]
        node = types.SimpleNamespace(key=Key(toks, r["cache_salt"]), parent=None,
                                     event_hash_value=None, hash_value=None)
        hv = utils["compute_node_event_hash_values"](node, page) if r["cache_salt"] else \
            get_hash_str(toks, None, page)
        r["sglang_block_ids"] = [utils["hash_str_to_int64"](h) for h in hv]

    doc = {
        "format": "sglang-kv-event-capture/1",
        "scenario": args.scenario,
        "sglang_commit": args.sglang_commit,
        "page_hash_commit": args.page_hash_commit,
        "page_size": page,
        "topic": topic,
        "attn_dp_rank": dp_rank,
        "publisher": {"configured_endpoint": configured, "effective_endpoint": pub._endpoint},
        "capture_env": {"python": sys.version.split()[0], "msgspec": msgspec.__version__,
                        "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()},
        "frames": frames,
        "requests": requests,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
