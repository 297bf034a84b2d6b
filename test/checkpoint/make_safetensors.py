#!/usr/bin/env python3
"""Writes a safetensors file of a model's parameters with deterministic
values, for the `meshplan ckpt` tests. Standard library only.

The tensors (names, global shapes, dtypes) come from a plan file written by
`meshplan plan --rank 0` (its param_shard buffers), so the script knows no
model. Options edit the header or the bytes to make the broken files the
reader must refuse.

  make_safetensors.py PLAN.json -o OUT [--drop NAME] [--shape NAME=2,3]
      [--dtype NAME=CODE] [--offsets NAME=BEGIN,END] [--extra NAME]
      [--raw-header TEXT] [--header-size N] [--truncate BYTES]
"""
import argparse
import json
import struct

CODES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2),
         "float8_e4m3fn": ("F8_E4M3", 1), "float8_e5m2": ("F8_E5M2", 1)}
SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


def values(seed, count, code):
    """count elements of `code`, little-endian, from a multiplicative hash:
    every element different, no NaN or infinity."""
    out = bytearray()
    for k in range(count):
        h = ((seed * 1000003 + k) * 2654435761) & 0xFFFFFFFF
        x = (h / 2**32 - 0.5) * 2.0  # [-1, 1)
        f32 = struct.pack("<f", x)
        if code == "F32":
            out += f32
        elif code in ("BF16", "F16"):
            out += f32[2:4] if code == "BF16" else struct.pack("<e", x)
        else:
            out += bytes([h & 0x77])  # finite in both float8 formats
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("-o", required=True)
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--dtype", action="append", default=[])
    ap.add_argument("--offsets", action="append", default=[])
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--raw-header")
    ap.add_argument("--header-size", type=int)
    ap.add_argument("--truncate", type=int)
    args = ap.parse_args()

    plan = json.load(open(args.plan))
    params = sorted(
        {b["tensor"]: b for b in plan["buffers"] if b["kind"] == "param_shard"}.values(),
        key=lambda b: b["tensor_id"])
    tensors = [(b["tensor"], CODES[b["dtype"]][0], list(b["global_shape"]), b["tensor_id"])
               for b in params]
    tensors += [(name, "F32", [3], 1000 + i) for i, name in enumerate(args.extra)]
    tensors = [t for t in tensors if t[0] not in args.drop]

    header, data = {"__metadata__": {"format": "pt", "source": "make_safetensors.py"}}, b""
    for name, code, shape, seed in tensors:
        n = 1
        for d in shape:
            n *= d
        blob = values(seed, n, code)
        header[name] = {"dtype": code, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    for edit in args.shape:
        name, dims = edit.split("=")
        header[name]["shape"] = [int(d) for d in dims.split(",") if d]
    for edit in args.dtype:
        name, code = edit.split("=")
        header[name]["dtype"] = code
    for edit in args.offsets:
        name, pair = edit.split("=")
        header[name]["data_offsets"] = [int(v) for v in pair.split(",")]

    text = args.raw_header if args.raw_header is not None else json.dumps(
        header, separators=(",", ":"))
    raw = text.encode()
    raw += b" " * (-len(raw) % 8)
    size = args.header_size if args.header_size is not None else len(raw)
    blob = struct.pack("<Q", size) + raw + data
    if args.truncate is not None:
        blob = blob[:args.truncate]
    with open(args.o, "wb") as f:
        f.write(blob)


if __name__ == "__main__":
    main()
