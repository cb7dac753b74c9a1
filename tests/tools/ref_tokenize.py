#!/usr/bin/env python3
"""Reference tokenizer: a literal transcription of llama2.c's encode() (run.c), slow on purpose,
with llama.cpp's cutting of the text into units (spaces escaped as U+2581, a unit as long as its
lead byte announces), which differs from llama2.c's on invalid UTF-8 only.

Used once to produce the expected token ids recorded in tests/unit/test_tokenizer.c; it is an
independent implementation (naive O(n^2) merge loop, byte fallback as id byte+3, dictionary
lookup) of what serving/engine/tokenizer.c does with a hash and a heap.

    python3 tests/tools/ref_tokenize.py ../shared/models/tok512.bin  > /tmp/ref512.txt
    python3 tests/tools/ref_tokenize.py ../shared/models/tokenizer.bin > /tmp/ref32k.txt
"""
import struct
import sys

# The strings the C test encodes, as Python bytes (keep in sync with test_tokenizer.c).
CASES = [
    b"Once upon a time",
    b"Hello world",
    b"",
    b" leading space",
    b"trailing space ",
    b"  double  spaces",
    b"Lily's ball was red, blue and green!",
    b"\n newline\ttab",
    "naïve café".encode(),
    "日本語のテキスト".encode(),
    "emoji 😀🚀".encode(),
    b"\xff\xfe abc \x80\x80\x80\x80\x80 x",
    b"A\x80",
    b"12345 67.89",
    b"aaaaaaaaaaaaaaaa",
    b"One day, a little girl named Lily found a needle in her room.",
]


def load(path):
    data = open(path, "rb").read()
    (max_len,) = struct.unpack_from("<I", data, 0)
    off, vocab, scores = 4, [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        vocab.append(data[off:off + n])
        scores.append(score)
        off += n
    return vocab, scores


def encode(text, vocab, scores, bos=True):
    lookup = {}
    for i, p in enumerate(vocab):
        lookup.setdefault(p, i)
    tokens = []
    if bos:
        tokens.append(1)
    if text:
        tokens.append(lookup.get(b" ", -1))
    # Units as llama.cpp cuts them: spaces escaped as U+2581 first, then as many bytes as the
    # lead byte announces (a stray continuation byte alone), cut at the end; the same as
    # llama2.c's on valid UTF-8.
    esc = text.replace(b" ", b"\xe2\x96\x81")
    i = 0
    while i < len(esc):
        c = esc[i]
        n = 1 if c < 0xC0 else 2 if c < 0xE0 else 3 if c < 0xF0 else 4
        buf = esc[i:i + n]
        tid = lookup.get(buf.replace(b"\xe2\x96\x81", b" "), -1)
        if tid != -1:
            tokens.append(tid)
        else:
            tokens.extend(b + 3 for b in buf)
        i += len(buf)
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        # llama2.c merges across BOS too; BOS's piece "\n<s>\n" never starts a merge in these
        # vocabularies, which the C side asserts by excluding BOS.
        for k in range(len(tokens) - 1):
            tid = lookup.get(vocab[tokens[k]] + vocab[tokens[k + 1]], -1)
            if tid != -1 and scores[tid] > best_score:
                best_score, best_id, best_idx = scores[tid], tid, k
        if best_idx == -1:
            break
        tokens[best_idx] = best_id
        del tokens[best_idx + 1]
    return tokens


def main():
    vocab, scores = load(sys.argv[1])
    dups = len(vocab) - len(set(vocab))
    print(f"/* {sys.argv[1]}: {len(vocab)} tokens, {dups} duplicate pieces */")
    for text in CASES:
        ids = encode(text, vocab, scores)
        print("{%s}," % ", ".join(str(t) for t in ids))


if __name__ == "__main__":
    main()
