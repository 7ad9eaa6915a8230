#!/usr/bin/python3
"""Golden vectors for vLLM's sha256_cbor block hashes.

Computes the recipe of docs/vllm.md ("Block hashes") with Debian's
python3-cbor2 (canonical encoding) and hashlib, independently of llmgw's C++
code, and writes golden/block_hashes.json. The C++ tests compare against the
committed file.

  golden/make_block_hash_vectors.py            # rewrite golden/block_hashes.json
  golden/make_block_hash_vectors.py --check    # fail if the committed file differs
  golden/make_block_hash_vectors.py --bench F  # time hashing the JSON token list in F
                                               # (seed "0", block size 16), print blocks/s
"""
import argparse
import hashlib
import json
import os
import sys
import time

import cbor2

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "block_hashes.json")


def none_hash(seed):
    return hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()


def block_extra(index, start, end, lora, salt, mm_items):
    keys = []
    if lora is not None:
        keys.append(lora)
    for ident, offset, length in mm_items:
        if offset < end and offset + length > start:
            keys.append((ident, offset - start))
    if index == 0 and salt is not None:
        keys.append(salt)
    return tuple(keys) if keys else None


def hash_blocks(seed, block_size, tokens, lora=None, salt=None, mm_items=()):
    parent = none_hash(seed)
    out = []
    for i in range(len(tokens) // block_size):
        start, end = i * block_size, (i + 1) * block_size
        extra = block_extra(i, start, end, lora, salt, mm_items)
        data = cbor2.dumps((parent, tokens[start:end], extra), canonical=True)
        digest = hashlib.sha256(data).digest()
        out.append((digest, data))
        parent = digest
    return out


def tokens_for(n, salt):
    """Deterministic token ids touching every CBOR integer width."""
    widths = [23, 255, 65535, 151642, 4_000_000_000]
    x = 0x9E3779B9 ^ salt
    out = []
    for i in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((x >> 33) % (widths[i % len(widths)] + 1))
    return out


def cases():
    yield dict(name="seed0_bs16_len0", seed="0", block_size=16, tokens=[])
    for n in (15, 16, 33, 3000):
        yield dict(name=f"seed0_bs16_len{n}", seed="0", block_size=16, tokens=tokens_for(n, n))
    for n in (15, 16, 33, 3000):
        yield dict(name=f"seed12345_bs32_len{n}", seed="12345", block_size=32,
                   tokens=tokens_for(n, n + 7))
    yield dict(name="seed0_bs16_lora", seed="0", block_size=16, tokens=tokens_for(50, 1),
               lora_name="sql-lora")
    yield dict(name="seed0_bs16_salt", seed="0", block_size=16, tokens=tokens_for(50, 2),
               cache_salt="tenant-a")
    yield dict(name="seed0_bs16_lora_salt", seed="0", block_size=16, tokens=tokens_for(50, 3),
               lora_name="sql-lora", cache_salt="tenant-b")
    yield dict(name="seed42_bs16_multimodal", seed="42", block_size=16, tokens=tokens_for(100, 4),
               mm_items=[["img-7f3a", 20, 40], ["img-c001", 70, 10]])
    yield dict(name="seed0_bs8_lora_multimodal_salt", seed="0", block_size=8,
               tokens=tokens_for(40, 5), lora_name="chat-lora", cache_salt="s",
               mm_items=[["audio-1", 3, 12]])


def build():
    out = []
    for case in cases():
        mm = [tuple(m) for m in case.get("mm_items", [])]
        blocks = hash_blocks(case["seed"], case["block_size"], case["tokens"],
                             case.get("lora_name"), case.get("cache_salt"), mm)
        entry = {
            "name": case["name"],
            "seed": case["seed"],
            "block_size": case["block_size"],
            "lora_name": case.get("lora_name"),
            "cache_salt": case.get("cache_salt"),
            "mm_items": [list(m) for m in mm],
            "none_hash": none_hash(case["seed"]).hex(),
            "tokens": case["tokens"],
            "blocks": [
                {"index": i, "key": int.from_bytes(d[-8:], "big"), "digest": d.hex(),
                 # the exact CBOR input, for the first blocks: pins the encoder
                 **({"cbor": data.hex()} if i < 3 else {})}
                for i, (d, data) in enumerate(blocks)
            ],
        }
        out.append(entry)
    doc = {
        "format": "llmgw-block-hash-vectors/1",
        "generator": "golden/make_block_hash_vectors.py (python3-cbor2 canonical, hashlib)",
        "cases": out,
    }
    return json.dumps(doc, indent=1) + "\n"


def bench(path, rounds=5):
    with open(path) as f:
        tokens = json.load(f)
    n_blocks = len(tokens) // 16
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        hash_blocks("0", 16, tokens)
        times.append(time.perf_counter() - t0)
    median = sorted(times)[len(times) // 2]
    print(json.dumps({"blocks": n_blocks, "median_seconds": median,
                      "blocks_per_second": n_blocks / median}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--bench", metavar="TOKENS_JSON")
    args = parser.parse_args()
    if args.bench:
        bench(args.bench)
        return 0
    text = build()
    if args.check:
        with open(OUT) as f:
            if f.read() != text:
                print("golden/block_hashes.json differs from what the script computes; "
                      "run golden/make_block_hash_vectors.py and review the diff", file=sys.stderr)
                return 1
        print("golden/block_hashes.json: reproduced exactly")
        return 0
    with open(OUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
