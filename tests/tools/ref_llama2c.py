#!/usr/bin/python3
"""An independent reference for Strata's engine: llama2.c's run.c in numpy.

Reads a llama2.c v0 checkpoint and its tokenizer.bin directly (not through Strata's converter),
encodes the prompt with llama2.c's algorithm (BOS, dummy-prefix space, code points then byte
fallback, best-score merges), decodes greedily and prints the prompt followed by the completion,
exactly as `strata generate --temp 0` does. Stops at EOS or BOS (as llama2.c does) or after -n.
With --kv f16 the key/value cache stores IEEE halves (numpy's float16, round to nearest even), as
Strata's default cache does; with --kv f32 (the default here) it keeps the full values.
With --until-tie EPS it stops before the first step whose two best logits are within EPS of each
other: a near-tie, where float rounding (f16 rounding above all) may pick either token, so two
correct implementations agree only up to there.

usage: ref_llama2c.py CHECKPOINT TOKENIZER PROMPT N [--kv f16|f32] [--until-tie EPS]
"""
import struct
import sys

import numpy as np


def load_checkpoint(path):
    raw = open(path, "rb").read()
    dim, hidden, L, H, KVH, vocab, seq = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    w = np.frombuffer(raw[28:], dtype="<f4")
    hd = dim // H
    kvd = KVH * hd
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = w[off:off + n].reshape(shape).astype(np.float64)
        off += n
        return a

    m = dict(dim=dim, hidden=hidden, L=L, H=H, KVH=KVH, vocab=vocab, seq=seq, hd=hd, kvd=kvd)
    m["emb"] = take(vocab, dim)
    m["rms_att"] = take(L, dim)
    m["wq"] = take(L, dim, dim)
    m["wk"] = take(L, kvd, dim)
    m["wv"] = take(L, kvd, dim)
    m["wo"] = take(L, dim, dim)
    m["rms_ffn"] = take(L, dim)
    m["w1"] = take(L, hidden, dim)
    m["w2"] = take(L, dim, hidden)
    m["w3"] = take(L, hidden, dim)
    m["rms_final"] = take(dim)
    take(seq, hd // 2)
    take(seq, hd // 2)
    m["wcls"] = m["emb"] if shared else take(vocab, dim)
    return m


def load_tokenizer(path, vocab):
    raw = open(path, "rb").read()
    (maxlen,) = struct.unpack("<I", raw[:4])
    o = 4
    pieces, scores = [], []
    for _ in range(vocab):
        score, n = struct.unpack("<fi", raw[o:o + 8])
        o += 8
        pieces.append(raw[o:o + n])
        scores.append(score)
        o += n
    return pieces, scores


def encode(text, pieces, scores):
    index = {p: i for i, p in enumerate(pieces)}
    toks = [1]
    if text:
        toks.append(index[b" "])
    data = text.encode("utf-8")
    i = 0
    while i < len(data):
        j = i + 1
        while j < len(data) and (data[j] & 0xC0) == 0x80 and j - i < 4:
            j += 1
        cp = data[i:j]
        if cp in index:
            toks.append(index[cp])
        else:
            toks.extend(b + 3 for b in cp)
        i = j
    while True:
        best, best_id, best_i = -1e10, -1, -1
        for k in range(len(toks) - 1):
            merged = pieces[toks[k]] + pieces[toks[k + 1]]
            if merged in index and scores[index[merged]] > best:
                best, best_id, best_i = scores[index[merged]], index[merged], k
        if best_i < 0:
            break
        toks[best_i:best_i + 2] = [best_id]
    return toks


def decode(prev, tok, pieces):
    p = pieces[tok]
    if prev == 1 and p.startswith(b" "):
        p = p[1:]
    if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
        return bytes([int(p[3:5], 16)])
    return p


def rmsnorm(x, w):
    return w * (x / np.sqrt(np.mean(x * x) + 1e-5))


def forward(m, tok, pos, kc, vc, store):
    hd, H, KVH = m["hd"], m["H"], m["KVH"]
    x = m["emb"][tok].copy()
    i = np.arange(0, m["dim"], 2)
    freq = 1.0 / (10000.0 ** ((i % hd) / hd))
    cos, sin = np.cos(pos * freq), np.sin(pos * freq)

    def rope(v):
        v = v.copy()
        n = len(v) // 2
        a, b = v[0::2].copy(), v[1::2].copy()
        v[0::2] = a * cos[:n] - b * sin[:n]
        v[1::2] = a * sin[:n] + b * cos[:n]
        return v

    for l in range(m["L"]):
        xb = rmsnorm(x, m["rms_att"][l])
        q = rope(m["wq"][l] @ xb)
        kc[l][pos] = store(rope(m["wk"][l] @ xb))
        vc[l][pos] = store(m["wv"][l] @ xb)
        out = np.zeros(m["dim"])
        for h in range(H):
            kh = h // (H // KVH)
            K = kc[l][:pos + 1, kh * hd:(kh + 1) * hd]
            V = vc[l][:pos + 1, kh * hd:(kh + 1) * hd]
            s = K @ q[h * hd:(h + 1) * hd] / np.sqrt(hd)
            s = np.exp(s - s.max())
            s /= s.sum()
            out[h * hd:(h + 1) * hd] = s @ V
        x = x + m["wo"][l] @ out
        xb = rmsnorm(x, m["rms_ffn"][l])
        g = m["w1"][l] @ xb
        x = x + m["w2"][l] @ (g / (1 + np.exp(-g)) * (m["w3"][l] @ xb))
    return m["wcls"] @ rmsnorm(x, m["rms_final"])


def main():
    usage = "usage: ref_llama2c.py CHECKPOINT TOKENIZER PROMPT N [--kv f16|f32] [--until-tie EPS]"
    if len(sys.argv) < 5 or len(sys.argv) % 2 == 0:
        sys.exit(usage)
    ckpt, tokp, prompt, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    opts = dict(zip(sys.argv[5::2], sys.argv[6::2]))
    kv, tie = opts.pop("--kv", "f32"), float(opts.pop("--until-tie", "-1"))
    if opts or kv not in ("f16", "f32"):
        sys.exit(usage)

    def store(v):
        return v.astype(np.float16).astype(np.float64) if kv == "f16" else v

    m = load_checkpoint(ckpt)
    pieces, scores = load_tokenizer(tokp, m["vocab"])
    toks = encode(prompt, pieces, scores)
    kc = np.zeros((m["L"], m["seq"], m["kvd"]))
    vc = np.zeros((m["L"], m["seq"], m["kvd"]))
    out = bytearray(prompt.encode("utf-8"))
    logits = None
    for pos, t in enumerate(toks):
        logits = forward(m, t, pos, kc, vc, store)
    pos = len(toks)
    prev = toks[-1]
    for _ in range(n):
        top2 = np.partition(logits, -2)[-2:]
        if top2[1] - top2[0] < tie:
            break
        nxt = int(np.argmax(logits))
        if nxt in (1, 2):
            break
        out += decode(prev, nxt, pieces)
        prev = nxt
        if pos >= m["seq"]:
            break
        logits = forward(m, nxt, pos, kc, vc, store)
        pos += 1
    sys.stdout.buffer.write(bytes(out) + b"\n")


if __name__ == "__main__":
    main()
