#!/usr/bin/env python3
"""Writes fuzz/dict/<target>.dict, the libFuzzer dictionaries run-fuzzer.sh
passes with -dict: for the JSON targets, every key and short string value of
the seed documents (and of docs/spec.schema.json); for the others, the
tokens of their languages. Run from the repository root after
make-seeds.py."""
import glob
import json
import os
import re

os.makedirs("fuzz/dict", exist_ok=True)


def walk(x, keys, vals):
    if isinstance(x, dict):
        for k, v in x.items():
            keys.add(k)
            walk(v, keys, vals)
    elif isinstance(x, list):
        for v in x:
            walk(v, keys, vals)
    elif isinstance(x, str) and len(x) <= 24 and "\n" not in x:
        vals.add(x)


def docs(target):
    for f in sorted(glob.glob(f"fuzz/corpus/{target}/*")):
        for part in open(f).read().split("\n---\n"):
            try:
                yield json.loads(part)
            except ValueError:
                pass


def quote(s):
    out = ""
    for c in s:
        if c in '"\\':
            out += "\\" + c
        elif c == "\n":
            out += "\\x0a"
        else:
            out += c
    return '"' + out + '"'


def write(target, comment, tokens):
    lines = [f"# {comment} (fuzz/tools/make-dicts.py)"]
    lines += [quote(t) for t in tokens]
    with open(f"fuzz/dict/{target}.dict", "w") as f:
        f.write("\n".join(lines) + "\n")


SEPARATOR = "\n---\n"
for target in ("spec", "plan", "plan-set", "checkpoint"):
    source = "plan" if target == "plan-set" else target
    keys, vals = set(), set()
    for d in docs(source):
        walk(d, keys, vals)
    if target == "spec":
        walk(json.load(open("docs/spec.schema.json")), keys, vals)
        vals |= {"tiny", "llama3-8b", "llama3-70b", "llama3-405b"}
    vals = {v for v in vals if not v.startswith("http")}
    tokens = [f'"{k}":' for k in sorted(keys)] + [f'"{v}"' for v in sorted(vals)]
    if target in ("spec", "plan-set"):
        tokens.append(SEPARATOR)
    write(target, f"JSON keys and values of {source} documents", tokens)

MESH_KEYS = ["mesh ", "order ", "managed ", "live ", "view ", "rank ",
             "json", "groups", "shape ", "placements ", "layout ", "to ",
             "dtype "]
VIEW = ["slice(", "flatten(", "unflatten(", " as ", ").", ":", "=", ",",
        "2147483648", "4294967296", "9223372036854775807", "-1"]
PLACEMENTS = ["S(", "SS(", "R", "P(", "Shard(dim=", "_StridedShard(dim=",
              "split_factor=", "sf=", "Replicate()", "Partial(", "sum", "avg",
              "max", "min", "[", "]", "(", ")", ","]
LAYOUT = ["[{", "}]", "{}", "{", "}", "(", ")", "\"", ":(", ")", "partial(",
          ")={", "sum", "avg", "max", "min", ","]
DTYPES = ["fp32", "bf16", "fp16", "fp8", "int8", "fp64", "int64"]
write("view", "keys and view expression tokens", MESH_KEYS + VIEW)
write("placement", "keys, view and placement tokens",
      MESH_KEYS + VIEW + PLACEMENTS + DTYPES)
write("layout", "keys, view and layout tokens",
      MESH_KEYS + VIEW + LAYOUT + PLACEMENTS + DTYPES)

# The dist dialect's keywords, from its ODS definitions.
words = set()
for td in glob.glob("include/meshplan/Dialect/Dist/IR/*.td"):
    text = open(td).read()
    words |= {"dist." + w for w in
              re.findall(r'def \w+ : Dist_\w*Op<"([a-z_0-9]+)"', text)}
    words |= {"#dist." + w + "<" for w in
              re.findall(r'def \w+ : Dist_Attr<"\w+", "([a-z_0-9]+)"', text)}
    words |= set(re.findall(r'`([a-z_]+)`', text))
DIST = ["#dist.", "!dist.", "dist.", "tensor<", "xf32", "xbf16", "f8E4M3FN",
        "func.func @", "%arg0", "->", "{", "}", "[", "]", "<", ">", "@",
        "\"", " = ", ":", "(", ")", "return", "module", "i64", "f32"]
write("dist", "dist dialect keywords and MLIR tokens", sorted(words) + DIST)
for f in sorted(glob.glob("fuzz/dict/*.dict")):
    print(f, sum(1 for _ in open(f)) - 1)
