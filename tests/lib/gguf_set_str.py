#!/usr/bin/env python3
"""gguf_set_str.py IN.gguf OUT.gguf KEY VALUE_FILE: a copy of IN with the string metadata KEY set
to VALUE_FILE's bytes (added, or replacing its value); tensors, their offsets and the data are
kept (the data section is re-aligned). For tests that need a model with, say, a chat template."""
import struct
import sys

SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    src, dst, key, value_file = sys.argv[1:5]
    b = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<IIQQ", b, 0)
    assert magic == 0x46554747 and version == 3, "not a GGUF v3 file"

    def skip(o, t):
        if t == 8:
            return o + 8 + struct.unpack_from("<Q", b, o)[0]
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            if et in SIZE:
                return o + n * SIZE[et]
            for _ in range(n):
                o = skip(o, et)
            return o
        return o + SIZE[t]

    o, kvs, align = 24, [], 32
    for _ in range(n_kv):
        start = o
        klen = struct.unpack_from("<Q", b, o)[0]
        k = b[o + 8:o + 8 + klen]
        t = struct.unpack_from("<I", b, o + 8 + klen)[0]
        o = skip(o + 8 + klen + 4, t)
        if k == b"general.alignment":
            align = struct.unpack_from("<I", b, o - 4)[0]
        if k != key.encode():
            kvs.append(b[start:o])
    infos_start = o
    for _ in range(n_tensors):
        nlen = struct.unpack_from("<Q", b, o)[0]
        n_dims = struct.unpack_from("<I", b, o + 8 + nlen)[0]
        o += 8 + nlen + 4 + 8 * n_dims + 4 + 8
    infos = b[infos_start:o]
    data = b[o + (-o % align):]
    value = open(value_file, "rb").read()
    kb = key.encode()
    kvs.append(struct.pack("<Q", len(kb)) + kb + struct.pack("<IQ", 8, len(value)) + value)
    out = struct.pack("<IIQQ", magic, version, n_tensors, len(kvs)) + b"".join(kvs) + infos
    out += b"\0" * (-len(out) % align)
    open(dst, "wb").write(out + data)


main()
