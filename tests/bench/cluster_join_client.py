#!/usr/bin/env python3
"""Burst client for tests/bench/cluster_join.sh, run inside the joiner's network namespace.

Starts the joiner (argv after --), so that t_join is the moment its process starts; sends a burst
of N streaming completions as soon as its HTTP port accepts connections, each retried on 503 (not
ready) every 20 ms; records each request's first token; polls /health until the state is "ready".
Prints one JSON object: first_token_s (join -> first token served), full_s (join -> every layer),
port_s (join -> the HTTP port accepts: the burst's arrival), ttft_s (per request, from its first
attempt), first_token_at_s (per request, from the join), prompt_tokens and completion_tokens
(per request, from the usage the last stream event carries), texts."""
import http.client
import json
import subprocess
import sys
import threading
import time

host, port, n, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cmd = sys.argv[sys.argv.index("--") + 1:]
PROMPT = "Once upon a time"

t_join = time.monotonic()
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(sys.argv[5], "w"))


def request(i, out):
    body = json.dumps({"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t_first_try = None
    while time.monotonic() - t_join < 600:
        try:
            c = http.client.HTTPConnection(host, port, timeout=300)
            if t_first_try is None:
                t_first_try = time.monotonic()
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status == 503:
                r.read()
                c.close()
                time.sleep(0.02)
                continue
            text, t_tok, prompt_tokens, gen_tokens = "", None, None, None
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if d.get("usage"):
                    prompt_tokens = d["usage"].get("prompt_tokens")
                    gen_tokens = d["usage"].get("completion_tokens")
                if not d.get("choices"):
                    continue
                piece = d["choices"][0].get("text", "")
                if piece and t_tok is None:
                    t_tok = time.monotonic()
                text += piece
            out[i] = {"ttft": t_tok - t_first_try if t_tok else None,
                      "first_token_at": t_tok - t_join if t_tok else None, "text": text,
                      "status": r.status, "prompt_tokens": prompt_tokens,
                      "completion_tokens": gen_tokens}
            return
        except (ConnectionError, OSError):
            time.sleep(0.02)
    out[i] = {"ttft": None, "first_token_at": None, "text": "", "status": 0, "prompt_tokens": None,
              "completion_tokens": None}


# Wait for the port (the HTTP front comes up before the weights).
while True:
    try:
        http.client.HTTPConnection(host, port, timeout=1).connect()
        port_s = time.monotonic() - t_join
        break
    except OSError:
        time.sleep(0.01)
        if proc.poll() is not None:
            print(json.dumps({"error": "joiner exited"}))
            sys.exit(1)

out = [None] * n
threads = [threading.Thread(target=request, args=(i, out)) for i in range(n)]
for t in threads:
    t.start()
full = None
while full is None and time.monotonic() - t_join < 600:
    try:
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", "/health")
        h = json.loads(c.getresponse().read())
        if h.get("state") == "ready":
            full = time.monotonic() - t_join
    except (OSError, ValueError):
        pass
    time.sleep(0.02)
for t in threads:
    t.join()
ft = [o["first_token_at"] for o in out if o and o["first_token_at"] is not None]
print(json.dumps({"first_token_s": min(ft) if ft else None, "full_s": full, "port_s": port_s,
                  "ttft_s": [o["ttft"] for o in out],
                  "first_token_at_s": [o["first_token_at"] for o in out],
                  "prompt_tokens": [o["prompt_tokens"] for o in out],
                  "completion_tokens": [o["completion_tokens"] for o in out],
                  "texts": [o["text"] for o in out]}))
proc.terminate()
proc.wait()
