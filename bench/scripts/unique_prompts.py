#!/usr/bin/env python3
"""Control-node memory under prompts that are never the same twice.

Sends N chat requests (max_tokens 1, four clients at once) to a gateway at
127.0.0.1:8080, each a shared text plus a unique history, and prints the
resident memory of process PID (the control node) every 1000 requests.
Start a cluster first: build-release/apps/llmgw up --config deploy/local/cluster.toml

    python3 bench/scripts/unique_prompts.py N PID
"""
import http.client
import json
import random
import sys
import threading
import time

N, PID = int(sys.argv[1]), sys.argv[2]
WORDS = ["tide", "moon", "harbor", "salt", "wind", "river", "stone", "light", "field", "cloud"]


def rss_mib():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return -1


lock = threading.Lock()
sent = [0]
samples = []
random.seed(1)


def client():
    conn = http.client.HTTPConnection("127.0.0.1", 8080, timeout=30)
    while True:
        with lock:
            if sent[0] >= N:
                return
            sent[0] += 1
            n = sent[0]
            history = " ".join(random.choice(WORDS) for _ in range(200))
        shared = " ".join(WORDS[(j * 7 + n % 24) % 10] for j in range(400))
        text = f"{shared} session {n // 4} turn {n % 4}: {history}"
        body = json.dumps({"model": "llmgw-demo", "max_tokens": 1,
                           "messages": [{"role": "user", "content": text}]})
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            print("status", answer.status, file=sys.stderr)
        if n % 1000 == 0:
            with lock:
                samples.append((n, rss_mib()))


print("start", rss_mib(), "MiB", flush=True)
start = time.time()
threads = [threading.Thread(target=client) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for n, mib in sorted(samples):
    print(n, mib, "MiB")
print("end", rss_mib(), "MiB,", f"{N / (time.time() - start):.0f} requests/s")
