#!/usr/bin/env python3
"""cluster_chaos.py: a chaos soak of a Strata cluster (run by tests/soak/cluster_chaos.sh, which
puts this driver in the hub network namespace it made; see that file for what is checked).

Nodes 1..N, each `strata serve --cluster` in its own network namespace (10.77.0.i, a veth to the
hub's bridge); nodes 1 and 2 start with the tiny model, the others empty; R = 2. A reference
server (the same model, alone, not faulted) in the hub gives every prompt's greedy text. Load:
the Azure conversation trace's arrivals, open loop at --rate requests/s, its prompt and answer
lengths scaled to the tiny model, to random nodes, a quarter streamed. Faults, one at a time from
a seeded schedule: SIGKILL of the leader, of a coop helper while its joiner serves, of a weight
source mid-stream; a partition (the node's link down) and heal; a slow link (tbf, both ways:
netem is not in this kernel); a full disk under the raft directory (a small tmpfs, filled); a
clock jump (--test-clock-file: +/- 90 s); a restart (SIGTERM, start again). After each, the time
until the cluster is healthy again (a leader every live node agrees on, every node alive in the
state and in raft's configuration, an exact answer from every node).

Every completion is classified: exact (the reference's text), a clean error (a 5xx with a
message, an SSE error event after a prefix of the reference, a refused connection to a node that
is down), wrong (any other text, a 4xx), hung (no end within --timeout). At the end: no commit
lost (the commit index never goes back and every event seen is still there), R host copies, every
node in raft's configuration. Prints a report and ok/not ok lines."""
import argparse
import csv
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

P = argparse.ArgumentParser()
P.add_argument("--duration", type=float, default=600)
P.add_argument("--nodes", type=int, default=5)
P.add_argument("--seed", type=int, default=1)
P.add_argument("--rate", type=float, default=1.5)
P.add_argument("--timeout", type=float, default=60)
P.add_argument("--work", required=True)
P.add_argument("--strata", required=True)
P.add_argument("--model", required=True)
P.add_argument("--trace", required=True)
P.add_argument("--hub", required=True)  # the hub namespace's name (we run in it)
P.add_argument("--min-faults", type=int, default=20)
P.add_argument("--kinds", default="")  # a comma list of fault kinds (FAULTS' names): only those
A = P.parse_args()
W = A.work
RNG = random.Random(A.seed)
HB = 100
ID = os.getpid()
HUB_IP = "10.77.0.254"
REF_PORT = 8090
LOG = open(os.path.join(W, "driver.log"), "a", buffering=1)
ENV = dict(os.environ, XDG_CACHE_HOME=os.path.join(W, "state"))  # never the user's cache
T0 = time.monotonic()


def say(*a):
    LOG.write("[%7.1f] %s\n" % (time.monotonic() - T0, " ".join(str(x) for x in a)))


def sh(cmd, check=True):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{cmd}: {r.stderr.strip()}")
    return r


def ns(i):
    return f"schaos{ID}n{i}"


# ---------------------------------------------------------------- the network and the nodes

def net_up():
    sh("ip link add br0 type bridge && ip link set br0 up")
    sh(f"ip addr add {HUB_IP}/24 dev br0 && ip link set lo up")
    for i in range(1, A.nodes + 1):
        sh(f"ip netns add {ns(i)}")
        sh(f"ip link add h{i} type veth peer name eth0 netns {ns(i)}")
        sh(f"ip link set h{i} master br0 up")
        sh(f"ip -n {ns(i)} link set eth0 up && ip -n {ns(i)} link set lo up")
        sh(f"ip -n {ns(i)} addr add 10.77.0.{i}/24 dev eth0")
        sh(f"ip link set h{i} type bridge_slave state 3", check=False)
    sh("ip link set br0 type bridge forward_delay 0 stp_state 0", check=False)


def net_down():
    for i in range(1, A.nodes + 1):
        sh(f"ip netns del {ns(i)}", check=False)


PEERS = ",".join(f"{i}@10.77.0.{i}:7100" for i in range(1, A.nodes + 1))
procs = {}
holders0 = {1, 2}  # nodes started with the model file


def raft_dir(i):
    return os.path.join(W, f"raft{i}")


def start(i):
    args = [A.strata, "serve", "--host", f"10.77.0.{i}", "--port", "8080", "--threads", "1", "-v",
            "--node-id", str(i), "--key-file", os.path.join(W, "key"), "--fabric", "tcp",
            "--listen", f"10.77.0.{i}:7000", "--raft-dir", raft_dir(i), "--cluster", PEERS,
            "--cluster-heartbeat-ms", str(HB), "--cluster-dead-ms", str(10 * HB),
            "--keep-alive-ms", "3000", "--replicas-cached", "2", "--ttft-ms", "400",
            "--coop-timeout-ms", "5000",
            # a relayed request ends (504) before the client's timeout, re-routes included
            "--forward-deadline-ms", str(max(1000, int(A.timeout * 1000) - 15000)),
            "--test-step-delay-us", "40000", "--max-batch", "2", "--weight-rate", "0.15",
            "--test-clock-file", os.path.join(W, f"clock{i}")]
    if i in holders0:
        args += ["-m", A.model, "--name", "tiny"]
    log = open(os.path.join(W, f"n{i}.log"), "a")
    log.write(f"==== start at {time.monotonic() - T0:.1f} s\n")
    log.flush()
    procs[i] = subprocess.Popen(["ip", "netns", "exec", ns(i)] + args, stdout=log,
                                stderr=subprocess.STDOUT, env=ENV)


def alive(i):
    return i in procs and procs[i].poll() is None


def kill(i, sig=signal.SIGKILL):
    if not alive(i):
        return
    procs[i].send_signal(sig)
    try:
        procs[i].wait(timeout=20)
    except subprocess.TimeoutExpired:
        procs[i].kill()
        procs[i].wait()


# ---------------------------------------------------------------- HTTP

def get(i, path, timeout=2.0):
    try:
        c = http.client.HTTPConnection(f"10.77.0.{i}", 8080, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return json.loads(body) if r.status == 200 else None
    except Exception:  # noqa: BLE001 - a node down or busy answers nothing
        return None


def cluster(i):
    return get(i, "/v1/cluster")


def post(host, port, body, timeout):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return c, c.getresponse()


REF = {}
REF_MU = threading.Lock()


def reference(prompt, n):
    key = (prompt, n)
    with REF_MU:
        if key in REF:
            return REF[key]
    for _ in range(5):
        try:
            c, r = post(HUB_IP, REF_PORT, {"prompt": prompt, "max_tokens": n, "temperature": 0}, 60)
            d = json.loads(r.read())
            c.close()
            t = d["choices"][0]["text"]
            with REF_MU:
                REF[key] = t
            return t
        except Exception:  # noqa: BLE001 - retried
            time.sleep(0.5)
    raise RuntimeError("the reference server does not answer")


# ---------------------------------------------------------------- load

WORDS = ("once upon a time there was a little girl named lily she liked to play in the park with "
         "her dog and her friend ben one day they saw a big red ball under a tree").split()
results = []  # (kind, detail, node, t)
RES_MU = threading.Lock()


def classify_stream(r, ref):
    text, err, done = "", None, False
    for raw in r:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        d = json.loads(data)
        if "error" in d:
            err = d["error"].get("message", "")
            continue
        text += d["choices"][0]["text"]
    if err is not None:
        return ("clean", "stream error: " + err[:60]) if ref.startswith(text) and err else \
            ("wrong", f"error after text not a prefix: {text!r}")
    if not done:
        return ("clean", "stream cut") if ref.startswith(text) else ("wrong", f"cut: {text!r}")
    return ("exact", "") if text == ref else ("wrong", f"stream text {text!r} != {ref!r}")


def one_request(k, prompt, n, stream):
    node = -k if k < 0 else 1 + (k * 7919) % A.nodes  # k < 0: a request for node -k
    ref = reference(prompt, n)
    t0 = time.monotonic()
    kind, detail = "wrong", ""
    try:
        c, r = post(f"10.77.0.{node}", 8080,
                    {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream}, A.timeout)
        if r.status == 200 and stream:
            kind, detail = classify_stream(r, ref)
        elif r.status == 200:
            d = json.loads(r.read())
            text = d["choices"][0]["text"]
            kind, detail = ("exact", "") if text == ref else ("wrong", f"{text!r} != {ref!r}")
        else:
            body = r.read()
            try:
                msg = json.loads(body)["error"]["message"]
            except Exception:  # noqa: BLE001
                msg = ""
            if r.status >= 500 and msg:
                kind, detail = "clean", f"{r.status} {msg[:60]}"
            else:
                kind, detail = "wrong", f"HTTP {r.status} {body[:100]!r}"
        c.close()
    except TimeoutError:
        kind, detail = "hung", f"no end within {A.timeout:.0f} s"
    except ConnectionRefusedError:
        kind, detail = "clean", "connection refused (node down)"
    except OSError as e:
        if "timed out" in str(e):
            kind, detail = "hung", f"no end within {A.timeout:.0f} s"
        else:
            kind, detail = "clean", f"connection: {e}"[:70]
    except Exception as e:  # noqa: BLE001
        kind, detail = "wrong", f"{type(e).__name__}: {e}"[:100]
    with RES_MU:
        results.append((kind, detail, node, t0 - T0, time.monotonic() - t0))


RNG_LOAD = random.Random(A.seed + 1)


def load(stop):
    rows = []
    with open(A.trace) as f:
        for row in csv.DictReader(f):
            rows.append((int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    # open loop: exponential gaps at --rate (the trace's own arrivals are ~60/s at 10x; its
    # lengths are kept, scaled to the tiny model's 512-token context)
    threads, k, t_next = [], 0, time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now < t_next:
            time.sleep(min(0.05, t_next - now))
            continue
        ctx, gen = rows[k % len(rows)]
        words = max(4, min(60, ctx // 40))
        prompt = " ".join(WORDS[(k + j) % len(WORDS)] for j in range(words))
        n = max(4, min(40, gen // 8))
        th = threading.Thread(target=one_request, args=(k, prompt, n, k % 4 == 1), daemon=True)
        th.start()
        threads.append(th)
        k += 1
        t_next += RNG_LOAD.expovariate(A.rate)
    for th in threads:
        th.join(A.timeout + 30)


# ---------------------------------------------------------------- health, history

history = {"commit": 0, "events": {}}


def watch(stop):
    """Every second: the highest commit index any node showed, and every event seen."""
    while not stop.is_set():
        for i in range(1, A.nodes + 1):
            d = cluster(i) if alive(i) else None
            if not d:
                continue
            history["commit"] = max(history["commit"], d["commit_index"])
            for e in d["events"]:
                history["events"].setdefault(e["seq"], (e["t_ms"], e["event"], e["node"]))
        stop.wait(1.0)


WHY = [""]


def healthy(probe=True):
    """A leader every live node agrees on, every node alive in its state and in raft's
    configuration, and (probe) an exact answer from every node. WHY[0]: what is missing."""
    views = {i: cluster(i) for i in range(1, A.nodes + 1) if alive(i)}
    if len(views) < A.nodes or any(v is None for v in views.values()):
        WHY[0] = f"nodes answering /v1/cluster: {sorted(i for i, v in views.items() if v)}"
        return False
    leaders = {v["leader"] for v in views.values()}
    if len(leaders) != 1 or None in leaders:
        WHY[0] = f"leaders seen: {sorted(map(str, leaders))}"
        return False
    lead = views[leaders.pop()]
    members = {n["id"]: n["alive"] for n in lead["nodes"]}
    conf = set(lead["voters"]) | set(lead["non_voters"])
    if any(not members.get(i) or i not in conf for i in range(1, A.nodes + 1)):
        WHY[0] = f"members {members}, configuration {sorted(conf)}"
        return False
    if not probe:
        return True
    ref = reference("Once upon a time", 8)
    for i in range(1, A.nodes + 1):
        try:
            c, r = post(f"10.77.0.{i}", 8080,
                        {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}, 10)
            body = r.read()
            ok = r.status == 200 and json.loads(body)["choices"][0]["text"] == ref
            c.close()
            if not ok:
                WHY[0] = f"node {i} answered HTTP {r.status} {body[:120]!r}"
        except Exception as e:  # noqa: BLE001
            ok = False
            WHY[0] = f"node {i}: {e}"
        if not ok:
            return False
    return True


def wait_healthy(limit):
    t0, said = time.monotonic(), 0
    while time.monotonic() - t0 < limit:
        if healthy():
            return time.monotonic() - t0
        if time.monotonic() - t0 > 10 * (said + 1):
            said += 1
            say("not healthy yet:", WHY[0])
        time.sleep(0.2)
    return None


def leader():
    for i in range(1, A.nodes + 1):
        d = cluster(i) if alive(i) else None
        if d and d["leader"]:
            return d["leader"], d
    return None, None


# ---------------------------------------------------------------- faults

faults = []  # (kind, node, recovery seconds or None, note)


LONG = " ".join(WORDS[j % len(WORDS)] for j in range(200))


def burst(node, n=8):
    """n long prompts to node at once: a queue the planner scales out for."""
    for j in range(n):
        threading.Thread(target=one_request, args=(-node, LONG, 24, j % 2 == 1),
                         daemon=True).start()


def scaleout(kind=None, n=6):
    """Bursts on every node until the planner starts a scale-out (of that kind: 'engine' or
    'host') that streams weights (its joiner still partial): (source, chain), else (None, None)
    after three bursts."""
    for _ in range(3):
        for i in range(1, A.nodes + 1):
            burst(i, n)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 8:
            _, d = leader()
            for so in (d or {}).get("scaleouts", []):
                if (kind and so["kind"] != kind) or not alive(so["source"]):
                    continue
                j = next((x for x in d["nodes"] if x["id"] == so["chain"][0]), None)
                partial = j and not any(m["name"] == "tiny" and (m["host"] or m["layers_resident"] == m["layers"] > 0)
                                        for m in j["models"])
                if partial:
                    return so["source"], so["chain"]
            time.sleep(0.1)
        _, d = leader()
        say("no streaming scale-out yet:", [(x["id"], x.get("load", {}).get("queue"),
                                             round(x.get("load", {}).get("predicted_ttft_ms", 0)),
                                             [(m["engine"], m["host"], m["layers_resident"]) for m in x["models"]])
                                            for x in (d or {}).get("nodes", [])],
            (d or {}).get("scaleouts"))
    return None, None


def fault_kill_leader():
    lid, _ = leader()
    if not lid:
        return None, "no leader"
    kill(lid)
    time.sleep(RNG.uniform(2, 5))
    start(lid)
    return lid, ""


def fault_kill_source():
    """A burst makes the planner scale out (or R restores a copy): its source dies as the weights
    stream."""
    src, chain = scaleout()
    if not src:
        return None, "no streaming scale-out after three bursts"
    kill(src)
    time.sleep(RNG.uniform(2, 5))
    start(src)
    return src, f"joiners {chain}"


def fault_kill_helper():
    """A joiner serves with its helper (the scale-out's source): requests run on the joiner, then
    the helper dies under them."""
    src, chain = scaleout(kind="engine", n=10)
    if not src:
        return None, "no streaming engine scale-out after three bursts"
    for j in chain:
        burst(j, 4)
    time.sleep(0.5)
    kill(src)
    time.sleep(RNG.uniform(2, 5))
    start(src)
    return src, f"joiners {chain}"


def fault_partition():
    i = RNG.randint(1, A.nodes)
    sh(f"ip link set h{i} down")
    time.sleep(RNG.uniform(4, 9))
    sh(f"ip link set h{i} up")
    sh(f"ip link set h{i} type bridge_slave state 3", check=False)
    return i, ""


def fault_slow():
    i = RNG.randint(1, A.nodes)
    sh(f"tc qdisc replace dev h{i} root tbf rate 2mbit burst 32kbit latency 300ms")
    sh(f"ip netns exec {ns(i)} tc qdisc replace dev eth0 root tbf rate 2mbit burst 32kbit latency 300ms")
    time.sleep(RNG.uniform(6, 12))
    sh(f"tc qdisc del dev h{i} root", check=False)
    sh(f"ip netns exec {ns(i)} tc qdisc del dev eth0 root", check=False)
    return i, "tbf 2 Mbit/s both ways"


def fault_disk():
    """The leader's raft directory (a tmpfs) full, long enough for raft to need new space (a
    snapshot every 64 entries, new segments)."""
    i, _ = leader()
    i = i or RNG.randint(1, A.nodes)
    filler = os.path.join(raft_dir(i), "filler")
    sh(f"dd if=/dev/zero of={filler} bs=64k status=none", check=False)  # until ENOSPC
    time.sleep(RNG.uniform(15, 25))
    gone = not alive(i)
    os.unlink(filler)
    if gone:  # it stopped on the full disk: an operator restarts it
        start(i)
        return i, "the node exited on ENOSPC; restarted"
    return i, "full raft tmpfs, then freed"


def fault_clock():
    i = RNG.randint(1, A.nodes)
    off = RNG.choice([90000, -90000])
    with open(os.path.join(W, f"clock{i}"), "w") as f:
        f.write(f"{off}\n")
    time.sleep(RNG.uniform(6, 12))
    with open(os.path.join(W, f"clock{i}"), "w") as f:
        f.write("0\n")
    return i, f"{off:+d} ms"


def fault_restart():
    i = RNG.randint(1, A.nodes)
    kill(i, signal.SIGTERM)
    time.sleep(1)
    start(i)
    return i, "SIGTERM, started again"


FAULTS = [
    ("kill_leader", fault_kill_leader),
    ("kill_helper", fault_kill_helper),
    ("kill_source", fault_kill_source),
    ("partition", fault_partition),
    ("slow_link", fault_slow),
    ("full_disk", fault_disk),
    ("clock_jump", fault_clock),
    ("restart", fault_restart),
]


def chaos(stop):
    order = []
    while not stop.is_set():
        if not order:
            only = os.environ.get("CHAOS_ONLY")  # debugging: one kind only
            kinds = A.kinds.split(",") if A.kinds else [f[0] for f in FAULTS]
            order = [f for f in FAULTS if (not only or f[0] == only) and f[0] in kinds]
            RNG.shuffle(order)
        name, fn = order.pop()
        t0 = time.monotonic()
        say("fault", name, "...")
        node, note = fn()
        if node is None:
            say("fault", name, "skipped:", note)
            continue
        rec = wait_healthy(90)
        faults.append((name, node, rec, note))
        say("fault", name, "on node", node, note, "recovered in",
            "%.1f s" % rec if rec is not None else "NEVER", "(fault took %.1f s)" % (time.monotonic() - t0 - (rec or 0)))
        if rec is None:
            for i in range(1, A.nodes + 1):  # a node that died for good is started again
                if not alive(i):
                    start(i)
        stop.wait(RNG.uniform(2, 5))


# ---------------------------------------------------------------- main

def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))] if v else float("nan")


def main():
    unknown = [k for k in A.kinds.split(",") if A.kinds and k not in [f[0] for f in FAULTS]]
    if unknown:
        print(f"not ok - cluster_chaos: unknown fault kinds {unknown}")
        return 1
    net_up()
    for i in range(1, A.nodes + 1):
        os.makedirs(raft_dir(i), exist_ok=True)
        sh(f"mount -t tmpfs -o size=64m tmpfs {raft_dir(i)}")
        open(os.path.join(W, f"clock{i}"), "w").write("0\n")
    ref = subprocess.Popen([A.strata, "serve", "-m", A.model, "--name", "tiny", "--host", HUB_IP,
                            "--port", str(REF_PORT), "--threads", "1"],
                           stdout=open(os.path.join(W, "ref.log"), "w"), stderr=subprocess.STDOUT,
                           env=ENV)
    rc = 1
    try:
        for i in range(1, A.nodes + 1):
            start(i)
        if wait_healthy(120) is None:
            print("not ok - cluster_chaos: the cluster never became healthy (see %s)" % W)
            return 1
        say("healthy at start")
        stop_load, stop_chaos, stop_watch = threading.Event(), threading.Event(), threading.Event()
        th_load = threading.Thread(target=load, args=(stop_load,))
        th_watch = threading.Thread(target=watch, args=(stop_watch,))
        th_chaos = threading.Thread(target=chaos, args=(stop_chaos,))
        for t in (th_load, th_watch, th_chaos):
            t.start()
        time.sleep(A.duration)
        # the faults asked for, however slow the host: up to twice the duration more
        t_end = time.monotonic() + 2 * A.duration
        while len(faults) < A.min_faults and time.monotonic() < t_end:
            time.sleep(0.5)
        stop_chaos.set()
        th_chaos.join()
        stop_load.set()
        th_load.join()
        rec_end = wait_healthy(120)
        time.sleep(3 * HB / 1000 + 1)
        stop_watch.set()
        th_watch.join()
        rc = report(rec_end)
    finally:
        for i in list(procs):
            kill(i)
        ref.kill()
        ref.wait()
        for i in range(1, A.nodes + 1):
            sh(f"umount {raft_dir(i)}", check=False)
        net_down()
    return rc


def report(rec_end):
    fail = 0
    n = len(results)
    by = {k: [r for r in results if r[0] == k] for k in ("exact", "clean", "wrong", "hung")}
    causes = {}
    for r in by["clean"]:
        c = r[1].split(":")[0][:40]
        causes[c] = causes.get(c, 0) + 1
    kinds = {}
    for f in faults:
        kinds[f[0]] = kinds.get(f[0], 0) + 1
    recs = [f[2] for f in faults if f[2] is not None]
    never = [f for f in faults if f[2] is None]
    lines = [
        "| measure | value |", "| --- | --- |",
        f"| duration, nodes, seed, load | {A.duration:.0f} s, {A.nodes}, {A.seed}, {A.rate} req/s open loop |",
        f"| requests sent | {n} |",
        f"| exact greedy text | {len(by['exact'])} |",
        f"| clean errors | {len(by['clean'])} ({', '.join(f'{v} {k}' for k, v in sorted(causes.items(), key=lambda x: -x[1]))}) |",
        f"| wrong | {len(by['wrong'])} |",
        f"| hung (past {A.timeout:.0f} s) | {len(by['hung'])} |",
        f"| faults injected | {len(faults)}: {', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))} |",
        f"| recovery to healthy, P50 / P99 / max | {pct(recs, 50):.1f} / {pct(recs, 99):.1f} / {max(recs) if recs else float('nan'):.1f} s ({len(never)} never within 90 s) |",
    ]
    with open(os.path.join(W, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    for l in lines:
        print("# " + l)
    for r in (by["wrong"] + by["hung"])[:10]:
        print(f"# {r[0]}: node {r[2]} at {r[3]:.1f} s: {r[1]}")
    ok_req = n > 0 and not by["wrong"] and not by["hung"]
    print(("ok" if ok_req else "not ok") +
          f" - cluster_chaos: {n} requests: {len(by['exact'])} exact, {len(by['clean'])} clean errors, "
          f"{len(by['wrong'])} wrong, {len(by['hung'])} hung")
    fail |= not ok_req
    ok_f = len(faults) >= A.min_faults and not never
    print(("ok" if ok_f else "not ok") +
          f" - cluster_chaos: {len(faults)} faults ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}), "
          f"each recovered (P50 {pct(recs, 50):.1f} s, P99 {pct(recs, 99):.1f} s); at least {A.min_faults} wanted"
          + (f"; never recovered: {never}" if never else ""))
    fail |= not ok_f
    # the end state
    views = {i: cluster(i) for i in range(1, A.nodes + 1)}
    lead = next((v for v in views.values() if v and v["raft_state"] == "leader"), None)
    problems = []
    if rec_end is None or not lead:
        problems.append("not healthy at the end")
    else:
        if lead["commit_index"] < history["commit"]:
            problems.append(f"commit index {lead['commit_index']} < {history['commit']} seen")
        final = {e["seq"]: (e["t_ms"], e["event"], e["node"]) for e in lead["events"]}
        lo = min(final) if final else 0
        for seq, e in history["events"].items():
            if seq >= lo and final.get(seq) != e:
                problems.append(f"event {seq} {e} is now {final.get(seq)}")
                break
        if history["events"] and max(final or [0]) < max(history["events"]):
            problems.append("events went back")
        hosts = [nd["id"] for nd in lead["nodes"] if nd["alive"] and
                 any(m["name"] == "tiny" and m["host"] for m in nd["models"])]
        if len(hosts) < 2:
            problems.append(f"R = 2 not restored: host copies on {hosts}")
        conf = sorted(set(lead["voters"]) | set(lead["non_voters"]))
        if conf != list(range(1, A.nodes + 1)):
            problems.append(f"configuration {conf}")
    if problems:
        print("not ok - cluster_chaos: end state: " + "; ".join(problems))
        fail = 1
    else:
        print(f"ok - cluster_chaos: end state: healthy {rec_end:.1f} s after the load stopped, no commit lost "
              f"(commit index {lead['commit_index']} >= {history['commit']} seen, {len(history['events'])} "
              f"events kept), R = 2 host copies on {hosts}, voters {lead['voters']}")
    return fail


if __name__ == "__main__":
    sys.exit(main())
