#!/usr/bin/python3
"""Writes every payload of the vLLM captures as one file of a fuzz corpus.

  scripts/make-fuzz-corpus.py CAPTURES_DIR OUT_DIR   (a build tree's vllm-captures/)
"""
import glob
import hashlib
import json
import os
import sys


def main():
    captures, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    count = 0
    for path in sorted(glob.glob(os.path.join(captures, "*.json"))):
        if "S2_churn" in path:
            continue  # 2,000 frames each: the small scenarios cover the same shapes
        with open(path) as f:
            capture = json.load(f)
        for frame in capture["frames"]:
            payload = bytes.fromhex(frame["payload_hex"])
            name = hashlib.sha1(payload).hexdigest()
            with open(os.path.join(out, name), "wb") as f:
                f.write(payload)
            count += 1
    print(f"{count} seed payloads in {out}")


if __name__ == "__main__":
    main()
