#!/usr/bin/env python3
"""tok_check: Strata's ids against llama.cpp's recorded ids, record by record.

    python3 tests/tools/tok_check.py NAME CORPUS WANT GOT [--valid-utf8-only]

WANT and GOT hold one "<count> <fnv64>" line per record of CORPUS (llama.cpp's from
tests/fixtures/tokenizer/, Strata's from build/tools/tok_ids --hashes). --valid-utf8-only leaves
out the records that are not valid UTF-8 (SentencePiece: Strata keeps llama2.c's reading of
invalid bytes there, docs/tokenizer.md). Prints "ok - NAME: ..." or "not ok - NAME: record R ...".
"""
import struct
import sys


def records(path):
    b = open(path, "rb").read()
    out, i = [], 0
    while i + 4 <= len(b):
        (n,) = struct.unpack_from("<I", b, i)
        out.append(b[i + 4:i + 4 + n])
        i += 4 + n
    return out


def valid(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 4:
        sys.exit(__doc__)
    name, corpus, want_path, got_path = args
    only_valid = "--valid-utf8-only" in sys.argv
    recs = records(corpus)
    want = open(want_path).read().splitlines()
    got = open(got_path).read().splitlines()
    if len(want) != len(recs) or len(got) != len(recs):
        print(f"not ok - {name}: {len(recs)} records, {len(want)} recorded, {len(got)} from Strata")
        return 1
    checked = tokens = 0
    for i, r in enumerate(recs):
        if only_valid and not valid(r):
            continue
        if want[i] != got[i]:
            print(f"not ok - {name}: record {i} ({len(r)} bytes, {r[:40]!r}...): llama.cpp "
                  f"{want[i]}, Strata {got[i]} (count and hash of the ids)")
            return 1
        checked += 1
        tokens += int(want[i].split()[0])
    left = len(recs) - checked
    print(f"ok - {name}: {checked} records, {tokens} tokens as llama.cpp's"
          + (f" ({left} not valid UTF-8 left out)" if left else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
