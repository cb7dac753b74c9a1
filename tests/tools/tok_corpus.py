#!/usr/bin/env python3
"""tok_corpus: the mixed-text corpora of the tokenizer exactness checks, generated from a seed.

    python3 tests/tools/tok_corpus.py main   OUT   # >= 1 MB: prose, code, whitespace runs, digits,
                                                   # CJK, emoji, accents, contractions, invalid
                                                   # UTF-8 that a JS string can stand for
    python3 tests/tools/tok_corpus.py oracle OUT   # what only llama.cpp can judge: U+0085, U+FEFF,
                                                   # surrogates, overlong forms, marks and case
                                                   # mixes (tekken), Unicode 16/17 letters

A corpus file is a sequence of records, each a 4-byte little-endian length and that many bytes.
The output depends only on this file (its own splitmix64 generator, no library randomness), so
the ids recorded from llama.cpp for it (tests/fixtures/tokenizer/) stay valid. Code points are
drawn from blocks whose classes (letter, number, mark, ...) are the same in Unicode 15.1 (Strata,
llama.cpp) and 17 (node's ICU), except in the oracle corpus.
"""
import struct
import sys


class Rng:
    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def pick(self, seq):
        return seq[self.below(len(seq))]

    def chance(self, p):
        return self.next() % 1000 < p * 1000


WORDS = ("the of and to in is was he for it with as his on be at by had are but from or have "
         "an they which one you were all her she there would their we him been has when who will "
         "no more if out so up said what its about than into them can only other time new some "
         "could these two may first then do any like my now over such our man me even most made "
         "after also did many off before must well back through years much where your way down "
         "should because long each just state people those too how little good world very year "
         "still own see men work between life under never being same another know while last "
         "might us great old house small place right question hand high water point things "
         "tokenizer merge byte vocabulary unicode llama mistral qwen server stream weight "
         "layer cluster Once upon a time little girl named Lily").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'vE",
                "'M", "'LL", "'lL", "'D", "n't", "'", "''", "'x", "'sup", "'em"]
PUNCT = list(".,;:!?()[]{}<>\"'`~@#$%^&*-_=+|\\/") + ["...", "--", "->", "=>", "::", "!=",
                                                       "==", "&&", "||", "<<", ">>", "/*", "*/"]
CODE = [
    "int main(int argc, char **argv)\n{\n    return 0;\n}\n",
    "for (size_t i = 0; i < n; i++) {\n\tsum += x[i] * w[i];\n}\n",
    "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text]\n",
    "    if (err < 0) goto fail;\r\n",
    "const x = await fetch(`${base}/v1/chat`, {method: 'POST'});\n",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;\n",
    "<div class=\"row\"><span id='a1'>x &amp; y</span></div>\n",
    "    x = [1, 2, 3]  # comment\n        y = {'k': v for k, v in d.items()}\n",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }\n",
    "\t\t\tcase 0x1F: return -1;   /* unit separator */\n",
    "$ make -j2 && ./build/strata generate -m model.gguf -p 'Hi'\n",
]
# (first, last) code point ranges per script, all classes stable from Unicode 15.1 to 17
SCRIPTS = {
    "latin1": [(0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0xFF), (0x100, 0x17F)],
    "greek": [(0x391, 0x3A1), (0x3A3, 0x3A9), (0x3B1, 0x3C9)],
    "cyrillic": [(0x410, 0x44F)],
    "armenian": [(0x531, 0x556), (0x561, 0x586)],
    "hebrew": [(0x5D0, 0x5EA)],
    "arabic": [(0x621, 0x63A), (0x641, 0x64A)],
    "devanagari": [(0x905, 0x939)],
    "thai": [(0xE01, 0xE2E)],
    "hangul": [(0xAC00, 0xD7A3)],
    "hiragana": [(0x3041, 0x3096)],
    "katakana": [(0x30A1, 0x30FA)],
    "cjk": [(0x4E00, 0x9FA5)],
    "georgian": [(0x10D0, 0x10FA)],
}
MARKS = {  # combining marks that follow letters of a script (Mn/Mc)
    "latin1": [(0x300, 0x36F)],
    "greek": [(0x300, 0x301), (0x308, 0x308), (0x342, 0x342)],
    "cyrillic": [(0x300, 0x301), (0x306, 0x306), (0x308, 0x308)],
    "arabic": [(0x64B, 0x652)],
    "devanagari": [(0x93E, 0x94C), (0x901, 0x903)],
    "thai": [(0xE31, 0xE31), (0xE34, 0xE3A), (0xE47, 0xE4E)],
    "hebrew": [(0x5B0, 0x5BD)],
}
DIGITS = [(0x30, 0x39), (0x660, 0x669), (0x966, 0x96F), (0xFF10, 0xFF19), (0x2160, 0x216B),
          (0x2460, 0x2473), (0xB2, 0xB3), (0xB9, 0xB9), (0xBC, 0xBE), (0x1D7CE, 0x1D7FF),
          (0xE50, 0xE59)]
SPACES = [" ", " ", " ", " ", "\t", "\n", "\n", "\r", "\r\n", "\x0b", "\x0c", "\u00a0", "\u2000",
          "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
          "\u1680"]
OTHER = ["\x00", "\x01", "\x07", "\x1b", "\x1c", "\x1f", "\x7f", "\u200b", "\u200d", "\u00ad",
         "\ufe0f", "\u2060", "\ue000", "\U000F0000", "\u0378", "\uffff", "\U0003FFFD",
         "\u00b5", "\u00aa", "\u02b0", "\u3005"]
EMOJI = ["\U0001F600", "\U0001F680", "\U0001F999", "\u2705", "\u2764\ufe0f",
         "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F1EB\U0001F1F7",
         "\U0001F44D\U0001F3FD", "1\ufe0f\u20e3", "\U0001F636\u200d\U0001F32B\ufe0f", "\u263a",
         "\U0001F9D1\u200d\U0001F4BB", "\u00a9", "\u2122", "\u20ac", "\u00a3", "\u221e", "\u2211"]


def chars(r, script, n):
    ranges = SCRIPTS[script]
    out = []
    for _ in range(n):
        lo, hi = r.pick(ranges)
        out.append(chr(lo + r.below(hi - lo + 1)))
        if script in MARKS and r.chance(0.15):
            lo, hi = r.pick(MARKS[script])
            out.append(chr(lo + r.below(hi - lo + 1)))
    return "".join(out)


def word(r):
    w = r.pick(WORDS)
    k = r.below(10)
    if k == 0:
        w = w.upper()
    elif k == 1:
        w = w.capitalize()
    elif k == 2:  # case mixes, for tekken's upper/lower runs
        w = "".join(c.upper() if r.chance(0.5) else c for c in w)
    if r.chance(0.08):
        w += r.pick(CONTRACTIONS)
    return w


def number(r):
    if r.chance(0.6):
        s = "".join(chr(0x30 + r.below(10)) for _ in range(1 + r.below(14)))
        if r.chance(0.3):
            s += r.pick([".", ",", "_", "e", "-", "/"]) + str(r.below(100000))
        return s
    lo, hi = r.pick(DIGITS)
    return "".join(chr(lo + r.below(hi - lo + 1)) for _ in range(1 + r.below(7)))


def spaces(r):
    n = r.pick([1, 1, 1, 2, 2, 3, 4, 7, 12])
    return "".join(r.pick(SPACES) for _ in range(n))


def piece(r, kind):
    if kind == "prose":
        return word(r) + (r.pick(PUNCT) if r.chance(0.15) else "") + \
            (" " if r.chance(0.85) else spaces(r))
    if kind == "code":
        c = r.pick(CODE)
        return c.replace("    ", "\t") if r.chance(0.2) else c
    if kind == "space":
        return spaces(r) + (word(r) if r.chance(0.5) else r.pick(PUNCT))
    if kind == "digits":
        return number(r) + r.pick([" ", "", ",", " + ", "x", "\n", "%", "abc"])
    if kind == "script":
        s = r.pick(list(SCRIPTS))
        t = chars(r, s, 1 + r.below(12))
        if s in ("latin1", "greek", "cyrillic", "armenian", "georgian") and r.chance(0.3):
            t = t.upper() if r.chance(0.5) else t.lower()
        return t + r.pick([" ", " ", "", "\u3002", "\u3001", ", ", ". ", "\n", "!", "\uff0c"])
    if kind == "emoji":
        return "".join(r.pick(EMOJI) for _ in range(1 + r.below(4))) + r.pick([" ", "", "\n"])
    if kind == "other":
        return r.pick(OTHER) + (word(r) if r.chance(0.5) else "")
    raise ValueError(kind)


KINDS = ["prose"] * 8 + ["code"] * 3 + ["space"] * 3 + ["digits"] * 3 + ["script"] * 6 + \
    ["emoji"] * 2 + ["other"]


def invalid_utf8(r):
    """Bytes that are not UTF-8 but that llama.cpp reads as code points a JS string can hold."""
    k = r.below(7)
    if k == 0:
        return bytes([0x80 + r.below(64)])  # a lone continuation byte
    if k == 1:
        return bytes([0xF8 + r.below(8)])  # never a UTF-8 byte
    if k == 2:
        return bytes([0xC2 + r.below(30)])  # a lead byte without its continuation
    if k == 3:
        return bytes([0xE1 + r.below(12), 0x80 + r.below(64)])  # 3-byte sequence cut short
    if k == 4:
        return bytes([0xF0 + r.below(4), 0x90, 0x80 + r.below(64)])  # 4-byte sequence cut short
    if k == 5:  # overlong forms of ASCII (llama.cpp reads them as the ASCII code point)
        c = 0x20 + r.below(95)
        return r.pick([bytes([0xC0 | c >> 6, 0x80 | (c & 63)]),
                       bytes([0xE0, 0x80 | c >> 6, 0x80 | (c & 63)])])
    return bytes([0xFF, 0xFE])  # a UTF-16 byte order mark


def record(r, size, invalid):
    out = bytearray()
    kind = r.pick(KINDS)
    while len(out) < size:
        if r.chance(0.25):
            kind = r.pick(KINDS)
        out += piece(r, kind).encode("utf-8")
        if invalid and r.chance(0.1):
            out += invalid_utf8(r)
    return bytes(out)


def main_corpus():
    r = Rng(20260514)
    recs, total = [], 0
    while total < 1_100_000:
        size = r.pick([16, 64, 200, 500, 1000, 1500, 2500, 4000])
        rec = record(r, size, invalid=r.chance(0.15))
        recs.append(rec)
        total += len(rec)
    # a few long stretches: one word of 20000 letters, 5000 spaces, 3000 digits
    recs.append(b"a" * 20000)
    recs.append(b"x" + b" " * 5000 + b"y")
    recs.append(("1" * 2999 + "\n").encode())
    recs.append("".join(chr(0x4E00 + r.below(0x51A5)) for _ in range(3000)).encode())
    return recs


ORACLE_ONLY = [
    "\u0085", "\ufeff", "a\u0085b", " \u0085 x", "x\ufeff y", "\u0085\n\u0085",
    # Unicode 16/17 letters and digits (unassigned in 15.1: llama.cpp's tables)
    "\u1c89\u1c8a", "\U00010d40\U00010d41", "\U0001ccf0\U0001ccf1", "\U00011f00x", "\u0897",
    # decomposed accents (no NFC step in llama.cpp) and marks after letters
    "e\u0301t\u0301e\u0301", "Cafe\u0301 ", "n\u0303o\u0308", "\u0928\u093f\u0930\u094d",
    # tekken: case changes and marks beyond ASCII
    "\u043f\u0440\u0438\u0412\u0415\u0422 \u041f\u0420\u0418\u0432\u0435\u0442",
    "\u03b1\u0392\u03b3\u0394", "\u00c9COLE \u00e9Cole \u00c9cole", "HTTPServer XMLHttpRequest",
    "a\u0301B\u0300c", "ABC\u00e9def \u00c0\u00c0\u00e0a", "iPhone eBay McDonald's O'Neil",
    # contractions with non-ASCII look-alikes
    "it'\u017f it'\u212a THEY'RE we'\u0130",
]


def oracle_corpus():
    r = Rng(77)
    recs = [s.encode("utf-8") for s in ORACLE_ONLY]
    # (4-byte forms past U+10FFFF are left out: llama.cpp aborts on them; test_tokenizer_bpe
    # checks what Strata does)
    bad = [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"a\xed\xb0\x80b", b"\xc0\x80", b"\xe0\x80\x80",
           b"\xf0\x80\x80\x80", b"\xc1\xbf", b"\xe0\x9f\xbf", b"\xef\xbf\xbd"]
    recs += bad
    for _ in range(200):
        rec = bytearray(record(r, 1 + r.below(300), invalid=True))
        for _ in range(r.below(3)):
            at = r.below(len(rec) + 1)
            ins = r.pick(ORACLE_ONLY).encode("utf-8") if r.chance(0.6) else r.pick(bad)
            rec[at:at] = ins
        recs.append(bytes(rec))
    return recs


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("main", "oracle"):
        sys.exit("usage: tok_corpus.py main|oracle OUT")
    recs = main_corpus() if sys.argv[1] == "main" else oracle_corpus()
    with open(sys.argv[2], "wb") as f:
        for rec in recs:
            f.write(struct.pack("<I", len(rec)) + rec)


if __name__ == "__main__":
    main()
