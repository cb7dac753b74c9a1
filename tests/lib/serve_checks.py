#!/usr/bin/env python3
"""serve_checks: the client side of the `strata serve` integration scenarios (stdlib only).

    serve_checks.py api URL PID        endpoints, greedy == `strata generate --temp 0`, streaming,
                                       chat, stop strings, bad input, metrics that add up
    serve_checks.py concurrent URL     20 concurrent clients, each gets its output alone
    serve_checks.py preempt URL        the same through a KV pool too small for all of them
    serve_checks.py cancel URL         a client that disconnects mid-stream frees its blocks
    serve_checks.py chunked URL        chunked request bodies (requests with a generator body,
                                       http.client with encode_chunked) get the exact completion
    serve_checks.py stall URL T_MS     a streaming client that stops reading (small receive
                                       buffer, socket kept open) is dropped after T_MS without
                                       acknowledged progress, while others are served meanwhile

Prints "ok - ..." / "not ok - ..." lines; exits 1 on any failure. Timing is never checked.
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

STRATA = os.environ.get("STRATA", "build/strata")
MODEL = os.environ.get("SERVE_MODEL", "build/test-models/stories260K.gguf")
failed = False


def ok(name):
    print(f"ok - {name}", flush=True)


def not_ok(name, why):
    global failed
    failed = True
    print(f"not ok - {name}: {why}", flush=True)


def check(name, cond, why=""):
    if cond:
        ok(name)
    else:
        not_ok(name, why or "check failed")
    return cond


_greedy_cache = {}


def greedy(prompt, n):
    """The completion `strata generate --temp 0` prints for prompt (without the prompt and the
    final newline it adds)."""
    key = (prompt, n)
    if key not in _greedy_cache:
        out = subprocess.run([STRATA, "generate", "-m", MODEL, "-p", prompt, "-n", str(n),
                              "--temp", "0", "--threads", "1"], capture_output=True, check=True).stdout
        assert out.startswith(prompt.encode()) and out.endswith(b"\n"), out
        _greedy_cache[key] = out[len(prompt.encode()):-1].decode("utf-8", "replace")
    return _greedy_cache[key]


class Server:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port

    def request(self, method, path, body=None, headers=None, timeout=20):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def post(self, path, obj, **kw):
        return self.request("POST", path, obj, **kw)

    def json(self, method, path, body=None, **kw):
        st, h, data = self.request(method, path, body, **kw)
        try:
            return st, h, json.loads(data)
        except ValueError:
            return st, h, {"_raw": data.decode("utf-8", "replace")}

    def raw(self, data, read=True, timeout=10):
        """Send raw bytes on a fresh connection, return what comes back until EOF."""
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        s.sendall(data)
        out = b""
        if read:
            try:
                while True:
                    k = s.recv(65536)
                    if not k:
                        break
                    out += k
            except socket.timeout:
                pass
        s.close()
        return out

    def metrics(self):
        st, _, data = self.request("GET", "/metrics")
        return st, data.decode()


def sse_events(body):
    events = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            events.append(block[6:])
    return events


def stream_text(events, chat=False):
    text, finish, usage = "", None, None
    for e in events:
        if e == "[DONE]":
            break
        o = json.loads(e)
        if o.get("usage"):
            usage = o["usage"]
        for c in o.get("choices", []):
            text += (c.get("delta", {}).get("content") or "") if chat else c.get("text", "")
            finish = c.get("finish_reason") or finish
    return text, finish, usage


def is_openai_error(obj):
    e = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(e, dict) and isinstance(e.get("message"), str) and "type" in e \
        and "param" in e and "code" in e


PROM_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|NaN|\+Inf)$')


def parse_prometheus(text):
    """{(name, labels): value}; raises ValueError on a malformed line."""
    out, types = {}, {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            types[name] = typ
            continue
        if line.startswith("#"):
            continue
        m = PROM_LINE.match(line)
        if not m:
            raise ValueError(f"bad line: {line!r}")
        out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    for name, typ in types.items():
        if typ != "histogram":
            continue
        buckets = [(k[1], v) for k, v in out.items() if k[0] == name + "_bucket"]
        vals = [v for _, v in buckets]
        if vals != sorted(vals):
            raise ValueError(f"{name}: buckets not cumulative")
        if out.get((name + "_bucket", '{le="+Inf"}')) != out.get((name + "_count", "")):
            raise ValueError(f"{name}: +Inf bucket != count")
    return out


def outcome(m, what):
    return m.get(("strata_requests_total", '{outcome="%s"}' % what), 0)


PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park", "One day",
           "There was a big red ball", "The sun was shining", "Tim had a toy car",
           "Sue liked to sing", "A bird flew", "The cat sat on the mat", "Mom said",
           "They played all day", "Ben found a box", "It was a rainy day",
           "The girl was happy", "He ran to the tree", "Anna saw a fish", "The boy",
           "She wanted a cookie", "At night"]


# ------------------------------------------------------------------ scenario: api

def scenario_api(url, pid):
    s = Server(url)
    counts = {"done": 0, "invalid": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def done(obj):
        counts["done"] += 1
        counts["prompt_tokens"] += obj["usage"]["prompt_tokens"]
        counts["completion_tokens"] += obj["usage"]["completion_tokens"]

    st, _, h = s.json("GET", "/health")
    check("health: 200 with pid and processes", st == 200 and h.get("pid") == pid
          and isinstance(h.get("processes"), int) and h.get("status") == "ok", f"{st} {h}")
    st, _, m = s.json("GET", "/v1/models")
    check("models: list with the model", st == 200 and m["object"] == "list"
          and m["data"][0]["object"] == "model", f"{st} {m}")

    for prompt, n in [("Once upon a time", 40), ("The little dog", 25), ("One day", 60)]:
        want = greedy(prompt, n)
        st, _, r = s.json("POST", "/v1/completions",
                          {"model": "x", "prompt": prompt, "max_tokens": n, "temperature": 0})
        if st == 200:
            done(r)
        ch = r.get("choices", [{}])[0]
        check(f"completion greedy == generate ({prompt!r}, {n})",
              st == 200 and ch.get("text") == want and r["object"] == "text_completion"
              and ch.get("finish_reason") in ("stop", "length") and r["usage"]["total_tokens"]
              == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"],
              f"{st} got {ch.get('text')!r} want {want!r}")
        st, hd, body = s.post("/v1/completions", {"prompt": prompt, "max_tokens": n,
                                                  "temperature": 0, "stream": True,
                                                  "stream_options": {"include_usage": True}})
        ev = sse_events(body)
        text, finish, usage = stream_text(ev)
        if st == 200 and usage:
            done({"usage": usage})
        check(f"stream greedy == generate ({prompt!r}, {n})",
              st == 200 and hd.get("Content-Type", "").startswith("text/event-stream")
              and ev and ev[-1] == "[DONE]" and text == want and finish in ("stop", "length")
              and usage and usage["completion_tokens"] >= 1,
              f"{st} got {text!r} want {want!r} events {ev[-3:]}")

    st, _, r = s.json("POST", "/v1/chat/completions",
                      {"messages": [{"role": "system", "content": "Tell a story."},
                                    {"role": "user", "content": "Once upon a time"}],
                       "max_tokens": 20, "temperature": 0})
    if st == 200:
        done(r)
    want = greedy("System: Tell a story.\nUser: Once upon a time\nAssistant:", 20)
    msg = r.get("choices", [{}])[0].get("message", {})
    check("chat completion (plain template) == generate of the rendered prompt",
          st == 200 and r["object"] == "chat.completion" and msg.get("role") == "assistant"
          and msg.get("content") == want, f"{st} {r} want {want!r}")
    st, _, body = s.post("/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "Once upon a time"}],
                          "max_tokens": 10, "temperature": 0, "stream": True})
    ev = sse_events(body)
    first = json.loads(ev[0]) if ev else {}
    text, finish, _ = stream_text(ev, chat=True)
    counts["done"] += st == 200
    check("chat stream: role first, chunks, [DONE]",
          st == 200 and first.get("object") == "chat.completion.chunk"
          and first["choices"][0]["delta"].get("role") == "assistant" and ev[-1] == "[DONE]"
          and text == greedy("User: Once upon a time\nAssistant:", 10), f"{st} {ev[:2]}")

    # stop strings: cut before the first occurrence, never shown while streaming
    full = greedy("Once upon a time", 40)
    st, _, r = s.json("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40,
                                                   "temperature": 0, "stop": ["Lily", "zzz"]})
    if st == 200:
        done(r)
    ch = r.get("choices", [{}])[0]
    check("stop string cuts the completion", st == 200 and ch.get("text") ==
          full[:full.index("Lily")] and ch.get("finish_reason") == "stop", f"{st} {ch}")
    st, _, body = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40,
                                              "temperature": 0, "stop": "Lily", "stream": True})
    text, finish, _ = stream_text(sse_events(body))
    counts["done"] += st == 200
    check("stop string while streaming", text == full[:full.index("Lily")] and finish == "stop",
          f"{text!r} {finish}")

    # seeded sampling is reproducible
    req = {"prompt": "The cat", "max_tokens": 30, "temperature": 0.8, "top_p": 0.9, "seed": 42}
    a = s.json("POST", "/v1/completions", req)[2]
    b = s.json("POST", "/v1/completions", req)[2]
    for x in (a, b):
        if "usage" in x:
            done(x)
    check("same seed, same sampled text", a.get("choices") and
          a["choices"][0]["text"] == b["choices"][0]["text"], f"{a} {b}")

    # ---- bad input: each gets OpenAI's error shape, and the server keeps serving
    def bad(name, status, *args, body_raw=None, **kw):
        if body_raw is not None:
            st, _, data = s.request("POST", "/v1/completions", body_raw)
            try:
                obj = json.loads(data)
            except ValueError:
                obj = {}
        else:
            st, _, obj = s.json(*args, **kw)
        counts["invalid"] += 1
        check(f"bad input: {name} -> {status}", st == status and is_openai_error(obj),
              f"{st} {obj}")
        return obj

    bad("malformed JSON", 400, body_raw=b'{"prompt": "x",')
    bad("truncated JSON", 400, body_raw=b'{"prompt": "Once upon')
    bad("not an object", 400, body_raw=b'[1, 2, 3]')
    bad("wrong type for max_tokens", 400, "POST", "/v1/completions",
        {"prompt": "x", "max_tokens": "5"})
    bad("wrong type for messages", 400, "POST", "/v1/chat/completions", {"messages": "hi"})
    bad("negative max_tokens", 400, "POST", "/v1/completions", {"prompt": "x", "max_tokens": -5})
    o = bad("huge max_tokens", 400, "POST", "/v1/completions",
            {"prompt": "x", "max_tokens": 10 ** 9})
    check("huge max_tokens message has the numbers", "512" in o["error"]["message"], str(o))
    o = bad("prompt over the context", 400, "POST", "/v1/completions",
            {"prompt": [1] + [300] * 599})
    check("context message names both numbers", "512" in o["error"]["message"]
          and "600" in o["error"]["message"], str(o))
    bad("invalid UTF-8", 400, body_raw=b'{"prompt": "\xff\xfe bad"}')
    bad("n=2", 400, "POST", "/v1/completions", {"prompt": "x", "n": 2})
    bad("unknown path", 404, "GET", "/v1/engines")
    st, _, r = s.json("POST", "/v1/completions",
                      {"prompt": "x", "max_tokens": 2, "frobnicate": {"a": [1]}, "logprobs": None})
    if st == 200:
        done(r)
    check("unknown fields are ignored", st == 200, f"{st} {r}")
    big = b'{"prompt": "' + b"a" * (2 << 20) + b'"}'
    raw = s.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                % len(big) + big[:1000])
    counts["invalid"] += 1
    check("bad input: body over the limit -> 413 (not read)", raw.startswith(b"HTTP/1.1 413")
          and b'"error"' in raw, raw[:200])

    # slow client: sends half a request and stalls -> 408, others are served meanwhile
    sock = socket.create_connection((s.host, s.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{\"pr")
    st, _, r = s.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 3})
    if st == 200:
        done(r)
    sock.settimeout(10)
    got = b""
    try:
        while True:
            k = sock.recv(4096)
            if not k:
                break
            got += k
    except socket.timeout:
        pass
    sock.close()
    counts["invalid"] += 1
    check("bad input: slow client -> 408 while others are served",
          got.startswith(b"HTTP/1.1 408") and b'"error"' in got and st == 200, got[:200])

    # too many connections: the server runs with --max-conns 8
    idle = [socket.create_connection((s.host, s.port)) for _ in range(8)]
    time.sleep(0.2)
    extra = s.raw(b"", read=True, timeout=5)
    for c in idle:
        c.close()
    check("too many connections -> 503 with Retry-After", extra.startswith(b"HTTP/1.1 503")
          and b"Retry-After: 1" in extra and b'"error"' in extra, extra[:300])
    time.sleep(0.2)
    st, _, h = s.json("GET", "/health")
    check("still serving after the bad input", st == 200, f"{st}")

    # ---- metrics
    st, text = s.metrics()
    try:
        m = parse_prometheus(text)
        ok("metrics parse as Prometheus text (histograms cumulative, +Inf == count)")
    except ValueError as e:
        not_ok("metrics parse as Prometheus text", str(e))
        return
    fin = outcome(m, "stop") + outcome(m, "length")
    check("metrics: finished requests add up", fin == counts["done"],
          f"stop+length {fin}, sent {counts['done']}")
    check("metrics: invalid requests add up", outcome(m, "invalid") == counts["invalid"],
          f"invalid {outcome(m, 'invalid')}, sent {counts['invalid']}")
    check("metrics: one rejected connection", outcome(m, "rejected") == 1,
          str(outcome(m, "rejected")))
    check("metrics: TTFT histogram counts every finished request",
          m.get(("strata_time_to_first_token_seconds_count", "")) == counts["done"],
          str(m.get(("strata_time_to_first_token_seconds_count", ""))))
    check("metrics: gauges at rest", m.get(("strata_num_requests_running", "")) == 0
          and m.get(("strata_kv_blocks_used", "")) == 0, "running/kv not 0")


# ------------------------------------------------------------------ scenario: concurrent

def run_clients(url, n_clients, tag):
    s = Server(url)
    jobs = []
    for i in range(n_clients):
        prompt = PROMPTS[i % len(PROMPTS)]
        n = 8 + (i * 37) % 120
        jobs.append((prompt, n, i % 3 == 0))
    wants = [greedy(p, n) for p, n, _ in jobs]
    results = [None] * n_clients
    barrier = threading.Barrier(n_clients)

    def client(i):
        prompt, n, stream = jobs[i]
        barrier.wait()
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream}
        try:
            st, _, data = s.post("/v1/completions", body, timeout=60)
            if stream:
                results[i] = (st, stream_text(sse_events(data))[0])
            else:
                results[i] = (st, json.loads(data)["choices"][0]["text"])
        except Exception as e:  # noqa: BLE001 - reported as a failure below
            results[i] = (0, repr(e))

    th = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    bad = [(i, results[i], wants[i]) for i in range(n_clients)
           if results[i] != (200, wants[i])]
    check(f"{tag}: {n_clients} concurrent clients each get their greedy output alone",
          not bad, "; ".join(f"client {i}: got {r!r} want {w!r}" for i, r, w in bad[:3]))


def scenario_concurrent(url):
    run_clients(url, 20, "concurrent")
    st, text = Server(url).metrics()
    m = parse_prometheus(text)
    check("concurrent: batches really formed (tokens per step > 1)",
          m[("strata_step_tokens_total", "")] > m[("strata_steps_total", "")],
          f"{m[('strata_step_tokens_total', '')]} tokens in {m[('strata_steps_total', '')]} steps")


def scenario_preempt(url):
    run_clients(url, 16, "preempt")
    st, text = Server(url).metrics()
    m = parse_prometheus(text)
    check("preempt: sequences were preempted and recomputed",
          m[("strata_num_preemptions_total", "")] > 0, str(m[("strata_num_preemptions_total", "")]))
    check("preempt: every KV block back in the pool", m[("strata_kv_blocks_used", "")] == 0,
          str(m[("strata_kv_blocks_used", "")]))


# ------------------------------------------------------------------ scenario: cancel

def scenario_cancel(url):
    s = Server(url)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
                       "stream": True}).encode()
    sock = socket.create_connection((s.host, s.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while got.count(b"data: ") < 3:
        k = sock.recv(4096)
        if not k:
            break
        got += k
    m = parse_prometheus(s.metrics()[1])
    check("cancel: the stream is running and holds KV blocks",
          m[("strata_kv_blocks_used", "")] > 0 and m[("strata_num_requests_running", "")] == 1,
          f"kv {m[('strata_kv_blocks_used', '')]}")
    sock.close()
    for _ in range(300):
        m = parse_prometheus(s.metrics()[1])
        if outcome(m, "cancelled") == 1 and m[("strata_kv_blocks_used", "")] == 0:
            break
        time.sleep(0.01)
    check("cancel: disconnect cancels the request and frees its blocks (visible in /metrics)",
          outcome(m, "cancelled") == 1 and m[("strata_kv_blocks_used", "")] == 0
          and m[("strata_num_requests_running", "")] == 0,
          f"cancelled {outcome(m, 'cancelled')}, kv {m[('strata_kv_blocks_used', '')]}")
    check("cancel: generation stopped early", m[("strata_generation_tokens_total", "")] < 400,
          str(m[("strata_generation_tokens_total", "")]))
    st, _, r = s.json("POST", "/v1/completions", {"prompt": "One day", "max_tokens": 5,
                                                   "temperature": 0})
    check("cancel: the server serves the next request", st == 200, f"{st} {r}")


# ------------------------------------------------------------------ scenario: chunked bodies

def scenario_chunked(url):
    s = Server(url)
    prompt, n = "Once upon a time", 24
    want = greedy(prompt, n)
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0}).encode()
    try:
        import requests  # the client most Python code uses; it sends a generator body chunked
    except ImportError:
        requests = None
    if requests is None:
        not_ok("chunked: python requests", "the requests module is not installed")
    else:
        seen = {}

        def pieces():
            for i in range(0, len(body), 7):
                yield body[i:i + 7]

        r = requests.post(url + "/v1/completions", data=pieces(), timeout=30,
                          headers={"Content-Type": "application/json"})
        seen = r.request.headers
        check("chunked: requests with a generator body gets the exact greedy completion",
              seen.get("Transfer-Encoding") == "chunked" and "Content-Length" not in seen
              and r.status_code == 200 and r.json()["choices"][0]["text"] == want,
              f"{r.status_code} {seen} {r.text[:200]} want {want!r}")
    # http.client, streamed response, chat
    c = http.client.HTTPConnection(s.host, s.port, timeout=30)
    chat = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                       "temperature": 0, "stream": True}).encode()
    c.request("POST", "/v1/chat/completions", body=iter([chat[:10], chat[10:]]),
              headers={"Content-Type": "application/json"}, encode_chunked=True)
    r = c.getresponse()
    data = r.read()
    c.close()
    text, finish, _ = stream_text(sse_events(data), chat=True)
    check("chunked: http.client encode_chunked, streamed chat", r.status == 200 and finish,
          f"{r.status} {data[:200]!r}")
    # a chunked body over --max-body (1 MiB by default) is refused from the chunk size
    raw = s.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"200000\r\n" + b"x" * 1000)
    check("chunked: a chunk over the body limit -> 413", raw.startswith(b"HTTP/1.1 413")
          and b'"error"' in raw, raw[:200])
    raw = s.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5x\r\nhello\r\n0\r\n\r\n")
    check("chunked: bad chunk size -> 400", raw.startswith(b"HTTP/1.1 400") and b'"error"' in raw,
          raw[:200])


# ------------------------------------------------------------------ scenario: stalled reader

def scenario_stall(url, timeout_ms):
    s = Server(url)
    m0 = parse_prometheus(s.metrics()[1])
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True,
                       "stream": True}).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # before connect, so the window the client advertises stays small and fills at once
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.settimeout(10)
    sock.connect((s.host, s.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while b"\n\n" not in got.partition(b"data: ")[2]:
        k = sock.recv(1)  # byte by byte: read nothing past the first event
        if not k:
            break
        got += k
    check("stall: the stream started", b"data: " in got, got[:200])
    # From here on the client never reads. Others must be served meanwhile, exactly.
    jobs = [("The little dog", 6), ("One day", 9), ("Tim had a toy car", 5), ("At night", 7)]
    results = [None] * len(jobs)

    def client(i):
        p, n = jobs[i]
        try:
            st, _, r = s.json("POST", "/v1/completions", {"prompt": p, "max_tokens": n,
                                                          "temperature": 0}, timeout=30)
            results[i] = (st, r["choices"][0]["text"] if st == 200 else r)
        except Exception as e:  # noqa: BLE001 - reported below
            results[i] = (0, repr(e))

    th = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    m = parse_prometheus(s.metrics()[1])
    bad = [(jobs[i], results[i]) for i in range(len(jobs))
           if results[i] != (200, greedy(*jobs[i]))]
    check("stall: other clients get their exact completions while a stream is stalled", not bad,
          str(bad[:2]))
    check("stall: meanwhile the stalled stream is still running and holds KV blocks",
          outcome(m, "cancelled") == outcome(m0, "cancelled")
          and m[("strata_num_requests_running", "")] == 1 and m[("strata_kv_blocks_used", "")] > 0,
          f"running {m[('strata_num_requests_running', '')]} kv {m[('strata_kv_blocks_used', '')]} "
          f"cancelled {outcome(m, 'cancelled')}")
    # after the timeout without acknowledged progress: dropped, cancelled, blocks freed
    deadline = time.time() + timeout_ms / 1e3 + 20
    while time.time() < deadline:
        m = parse_prometheus(s.metrics()[1])
        if outcome(m, "cancelled") > outcome(m0, "cancelled") and \
                m[("strata_kv_blocks_used", "")] == 0:
            break
        time.sleep(0.05)
    check("stall: the stalled request is cancelled and its KV blocks freed (/metrics)",
          outcome(m, "cancelled") == outcome(m0, "cancelled") + 1
          and m[("strata_kv_blocks_used", "")] == 0 and m[("strata_num_requests_running", "")] == 0,
          f"cancelled {outcome(m, 'cancelled')} kv {m[('strata_kv_blocks_used', '')]}")
    check("stall: generation stopped early",
          m[("strata_generation_tokens_total", "")] - m0[("strata_generation_tokens_total", "")]
          < 480 + sum(n for _, n in jobs), str(m[("strata_generation_tokens_total", "")]))
    # the client, reading again, finds the stream cut short
    rest = b""
    try:
        while True:
            k = sock.recv(65536)
            if not k:
                break
            rest += k
    except (ConnectionResetError, socket.timeout):
        pass
    sock.close()
    check("stall: the stalled client's stream was cut (no [DONE])", b"[DONE]" not in rest,
          rest[-200:])
    st, _, r = s.json("POST", "/v1/completions", {"prompt": "One day", "max_tokens": 5,
                                                   "temperature": 0})
    check("stall: the server keeps serving", st == 200 and r["choices"][0]["text"] ==
          greedy("One day", 5), f"{st} {r}")


def main():
    scenario, url = sys.argv[1], sys.argv[2]
    if scenario == "api":
        scenario_api(url, int(sys.argv[3]))
    elif scenario == "concurrent":
        scenario_concurrent(url)
    elif scenario == "preempt":
        scenario_preempt(url)
    elif scenario == "cancel":
        scenario_cancel(url)
    elif scenario == "chunked":
        scenario_chunked(url)
    elif scenario == "stall":
        scenario_stall(url, int(sys.argv[3]))
    else:
        print(f"not ok - serve_checks: unknown scenario {scenario}")
        sys.exit(1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
