#!/usr/bin/env python3
"""An independent safetensors reader for the `meshplan ckpt` tests (standard
library only: struct + json). It checks the file's structure as the format
describes it, decodes every value, and with --compare checks that another
file holds the same tensors with bit-identical values.

  safetensors_read.py FILE [--compare OTHER] [--show NAME]

Prints a summary line; exits 1 with a message on any difference.
"""
import argparse
import json
import struct
import sys

FORMATS = {"F32": ("<f", 4), "BF16": (None, 2), "F16": ("<e", 2),
           "F8_E4M3": (None, 1), "F8_E5M2": (None, 1)}


def fail(message):
    print("safetensors_read: " + message)
    sys.exit(1)


def read(path):
    blob = open(path, "rb").read()
    if len(blob) < 8:
        fail(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        fail(f"{path}: header size {n} past the end")
    raw = blob[8:8 + n]
    if n % 8 != 0:
        fail(f"{path}: header size {n} is not a multiple of 8")
    if raw.rstrip(b" ") != raw.rstrip():
        fail(f"{path}: header padded with something other than spaces")
    header = json.loads(raw.decode("utf-8"))
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in metadata.values()):
        fail(f"{path}: __metadata__ values must be strings")
    tensors = {}
    end = 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, stop = t["data_offsets"]
        if begin != end:
            fail(f"{path}: {name} starts at {begin}, expected {end}")
        code = t["dtype"]
        if code not in FORMATS:
            fail(f"{path}: {name}: dtype {code}")
        count = 1
        for d in t["shape"]:
            count *= d
        if count * FORMATS[code][1] != stop - begin:
            fail(f"{path}: {name}: {stop - begin} bytes for shape {t['shape']}")
        # Data aligned to the element size, as the reference writer orders it.
        if begin % FORMATS[code][1] != 0:
            fail(f"{path}: {name}: data offset {begin} not aligned")
        tensors[name] = (code, t["shape"], data[begin:stop])
        end = stop
    if end != len(data):
        fail(f"{path}: {len(data) - end} trailing data bytes")
    return metadata, tensors


def decode(code, raw):
    fmt, size = FORMATS[code]
    if code == "BF16":
        return [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    if fmt is None:
        return list(raw)
    return [v[0] for v in struct.iter_unpack(fmt, raw)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--compare")
    ap.add_argument("--show", action="append", default=[])
    args = ap.parse_args()
    metadata, tensors = read(args.file)
    total = sum(len(t[2]) for t in tensors.values())
    print(f"{args.file}: {len(tensors)} tensors, {total} bytes, metadata "
          + json.dumps(metadata, sort_keys=True))
    for name in args.show:
        code, shape, raw = tensors[name]
        vals = decode(code, raw)
        print(f"{name}: {code} {shape} first values "
              + " ".join(f"{v:.6g}" for v in vals[:4]))
    if args.compare:
        _, other = read(args.compare)
        if sorted(other) != sorted(tensors):
            fail(f"tensor names differ: only in {args.file}: "
                 f"{sorted(set(tensors) - set(other))}, only in {args.compare}: "
                 f"{sorted(set(other) - set(tensors))}")
        for name, (code, shape, raw) in sorted(tensors.items()):
            ocode, oshape, oraw = other[name]
            if (code, shape) != (ocode, oshape):
                fail(f"{name}: {code} {shape} vs {ocode} {oshape}")
            a, b = decode(code, raw), decode(ocode, oraw)
            for i, (x, y) in enumerate(zip(a, b)):
                if struct.pack("<d", x) != struct.pack("<d", y):
                    fail(f"{name}: element {i}: {x!r} vs {y!r}")
            if raw != oraw:
                fail(f"{name}: bytes differ")
        print(f"match: {len(tensors)} tensors, values bit-identical")


if __name__ == "__main__":
    main()
