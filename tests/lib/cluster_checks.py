"""Clients for the cooperative-execution scenarios (tests/integration/cluster_*.sh).

  cluster_checks.py same REF_URL URL [--temp T] [--seed S] [--tokens N]
      sends the same prompts to REF_URL one at a time (the single-node reference) and to URL all
      at once (one of them streamed), and exits 1 unless every text is byte-identical
  cluster_checks.py together REF_URL URL [URL ...] [--temp T] [--seed S] [--tokens N]
      the references as for `same`, then the prompts to every URL at once (REF_URL may be one of
      them: a helper's own clients beside its joiners'); exits 1 unless every text is identical
      (--long W --n N: N prompts of about W words each instead, prefilled in several chunks)
  cluster_checks.py diverge REF_URL URL [--min-prefix B] [--min-equal P]
      the same, but allows a late divergence (f16/bf16 activations are lossy) and reports where:
      exits 1 if a request failed, if a text leaves its reference before byte B (default 64; a
      shorter reference must match whole), or if fewer than P% (default 90) of all the bytes come
      before the divergences: garbage, or an early drift, fails
  cluster_checks.py prompt --long W --n N
      prints the first of those long prompts as a JSON string
  cluster_checks.py stream URL OUT
      one streamed greedy request; every SSE data line appended to OUT as it arrives
  cluster_checks.py check_failed_stream OUT REF_URL
      OUT ended in an error event (and [DONE]) and the text before it is a prefix of the reference
"""
import json
import sys
import threading
import urllib.request

PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a bird"]


def post(url, body, stream=False):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def complete(url, prompt, n, temp, seed, stream=False):
    body = {"prompt": prompt, "max_tokens": n, "temperature": temp, "seed": seed,
            "ignore_eos": True, "stream": stream}
    with post(url, body) as r:
        if not stream:
            return json.load(r)["choices"][0]["text"]
        text = ""
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(ev["error"]["message"])
            text += ev["choices"][0]["text"]
        return text


def opts(argv):
    o = {"temp": 0.0, "seed": 7, "tokens": 80, "long": 0, "n": len(PROMPTS), "min-prefix": 64,
         "min-equal": 90}
    for i in range(0, len(argv) - 1, 2):
        o[argv[i].lstrip("-")] = float(argv[i + 1]) if argv[i] == "--temp" else int(argv[i + 1])
    return o


def run_both(ref, url, o):
    want, got, errs = run_all(ref, [url], o)
    return want, got[0], errs


FILLER = ("and they played in the sun all day long with a big red ball then the cat came to see "
          "what they did and it was very happy").split()


def prompts(o):
    """The short prompts, or --n long ones of about --long words (each its own mix)."""
    if not o["long"]:
        return PROMPTS
    out = []
    for i in range(o["n"]):
        words = PROMPTS[i % len(PROMPTS)].split()
        j = i
        while len(words) < o["long"]:
            words.append(FILLER[j % len(FILLER)])
            j += 3 + i
        out.append(" ".join(words))
    return out


def run_all(ref, urls, o):
    """References from ref one at a time, then every prompt to every url at once."""
    ps = prompts(o)
    lens = [o["tokens"] + 17 * (i % 4) for i in range(len(ps))]
    want = [complete(ref, p, n, o["temp"], o["seed"] + i) for i, (p, n) in enumerate(zip(ps, lens))]
    got = [[None] * len(ps) for _ in urls]
    errs = []

    def one(u, i):
        try:
            got[u][i] = complete(urls[u], ps[i], lens[i], o["temp"], o["seed"] + i, stream=(i == 1))
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(f"{urls[u]} request {i}: {e}")

    th = [threading.Thread(target=one, args=(u, i)) for u in range(len(urls)) for i in range(len(ps))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return want, got, errs


def main():
    cmd = sys.argv[1]
    if cmd in ("same", "diverge"):
        want, got, errs = run_both(sys.argv[2], sys.argv[3], opts(sys.argv[4:]))
        if errs:
            print("; ".join(errs), file=sys.stderr)
            return 1
        if cmd == "same":
            for i, (w, g) in enumerate(zip(want, got)):
                if w != g:
                    print(f"request {i} differs:\n  want {w!r}\n  got  {g!r}", file=sys.stderr)
                    return 1
            print(f"{len(want)} requests, {sum(len(w) for w in want)} bytes identical")
            return 0
        o = opts(sys.argv[4:])
        at = [len(w) if w == g else next(i for i, (a, b) in enumerate(zip(w + "\0", g + "\1")) if a != b)
              for w, g in zip(want, got)]
        same, total = sum(at), sum(len(w) for w in want)
        print(f"{same} of {total} bytes equal before the first divergence "
              f"({sum(w == g for w, g in zip(want, got))} of {len(want)} texts identical"
              + (f"; the earliest at byte {min(a for a, w, g in zip(at, want, got) if w != g)})"
                 if any(w != g for w, g in zip(want, got)) else ")"))
        for i, (w, g, a) in enumerate(zip(want, got, at)):
            if a < min(o["min-prefix"], len(w)) or (a < len(w) and a == len(g)):
                print(f"request {i} diverges at byte {a} (bound {o['min-prefix']}):\n  want {w!r}\n  got  {g!r}",
                      file=sys.stderr)
                return 1
        if 100 * same < o["min-equal"] * total:
            print(f"only {same} of {total} bytes before the divergences (bound {o['min-equal']}%)",
                  file=sys.stderr)
            return 1
        return 0
    if cmd == "together":
        urls = [a for a in sys.argv[3:] if a.startswith("http")]
        rest = sys.argv[3 + len(urls):]
        want, got, errs = run_all(sys.argv[2], urls, opts(rest))
        if errs:
            print("; ".join(errs), file=sys.stderr)
            return 1
        for u, texts in enumerate(got):
            for i, (w, g) in enumerate(zip(want, texts)):
                if w != g:
                    print(f"{urls[u]} request {i} differs:\n  want {w!r}\n  got  {g!r}", file=sys.stderr)
                    return 1
        print(f"{len(urls)} x {len(want)} concurrent requests, {len(urls) * sum(len(w) for w in want)} bytes identical")
        return 0
    if cmd == "prompt":  # the --long/--n prompts' first, as JSON
        print(json.dumps(prompts(opts(sys.argv[2:]))[0]))
        return 0
    if cmd == "stream":
        body = {"prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0, "ignore_eos": True,
                "stream": True}
        try:
            with post(sys.argv[2], body) as r, open(sys.argv[3], "a") as out:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data: "):
                        out.write(line + "\n")
                        out.flush()
        except Exception as e:  # noqa: BLE001
            with open(sys.argv[3], "a") as out:
                out.write(f"exception: {e}\n")
        return 0
    if cmd == "check_failed_stream":
        lines = open(sys.argv[2]).read().splitlines()
        ref = complete(sys.argv[3], PROMPTS[0], 200, 0.0, 0)
        text, error = "", None
        for l in lines:
            if l == "data: [DONE]":
                continue
            ev = json.loads(l[6:]) if l.startswith("data: ") else {"error": {"message": l}}
            if "error" in ev:
                error = ev["error"]["message"]
                break
            text += ev["choices"][0]["text"]
        if error is None:
            print(f"no error event; {len(text)} bytes of text", file=sys.stderr)
            return 1
        if not ref.startswith(text):
            print(f"text before the error is not the reference's prefix: {text!r}", file=sys.stderr)
            return 1
        print(f"{len(text)} correct bytes, then: {error}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


sys.exit(main())
