#!/usr/bin/python3
"""Fails if a source file includes a header from a folder above its own.

Each folder is one library and may include only from the folders listed for
it here (the same order as the libraries link in CMakeLists.txt):

  scripts/check-layers.py
"""
import os
import re
import sys

BELOW = {
    "base": [],
    "wire": ["base"],
    "config": ["base", "wire"],
    "kv": ["base", "wire"],
    "routing": ["base", "wire", "config", "kv"],
    "net": ["base", "wire", "config", "kv"],
    "messages": ["base", "wire", "config", "kv", "routing"],
    "actors": ["base", "wire", "config", "kv", "routing", "net", "messages"],
    "gateway": ["base", "wire", "config", "kv", "routing", "net", "messages", "actors"],
    "apps/common": ["base"],
    # llmgw-sim stands in for vLLM: formats and sockets, none of llmgw's state.
    "apps/llmgw-sim": ["base", "wire", "net", "apps/common"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    for name in sorted(BELOW, key=len, reverse=True):
        if path.startswith(name + "/"):
            return name
    return None


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    bad = []
    for top in BELOW:
        for root, _, files in os.walk(top):
            for name in files:
                if not name.endswith((".hpp", ".cpp")):
                    continue
                path = os.path.join(root, name)
                own = folder_of(path)
                with open(path) as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = folder_of(m.group(1))
                        if target is None and m.group(1).split("/")[0] in ("apps", "tests", "bench"):
                            target = m.group(1).split("/")[0]
                        if target in (None, own) or target in BELOW[own]:
                            continue
                        bad.append(f"{path}:{n}: {own}/ includes {m.group(1)} ({target}/ is not below it)")
    for line in bad:
        print(line)
    if bad:
        sys.exit(1)
    print(f"layers: {len(BELOW)} folders include only downward")


main()
