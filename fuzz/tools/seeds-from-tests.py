#!/usr/bin/env python3
"""Writes seeds for fuzz-view, fuzz-placement and fuzz-layout from the
`meshplan mesh|layout|redistribute` command lines of test/planner/*.test and
README.md, in the fuzz targets' "key value" line format (fuzz/FuzzSupport.h).

  fuzz/tools/seeds-from-tests.py   (from the repository root; rewrites the
                                    test-*.txt seeds, keeps the others)
"""
import glob
import hashlib
import os
import re
import shlex

FLAGS = {"--mesh": "mesh", "--order": "order", "--managed": "managed",
         "--live": "live", "--view": "view", "--rank": "rank",
         "--shape": "shape", "--placements": "placements",
         "--layout": "layout", "--from": "from", "--to": "to",
         "--dtype": "dtype"}
SWITCHES = {"--json": "json", "--groups": "groups"}


def commands():
    lines = []
    for path in sorted(glob.glob("test/planner/*.test")):
        for line in open(path):
            m = re.search(r"RUN:.*?%meshplan (mesh|layout|redistribute) (.*?)(\||$)", line)
            if m:
                lines.append((m.group(1), m.group(2)))
    for line in open("README.md"):
        m = re.search(r"\$ build/bin/meshplan (mesh|layout|redistribute) (.*)", line)
        if m:
            lines.append((m.group(1), m.group(2).rstrip("\\ ")))
    return lines


def fields(args):
    out = []
    words = shlex.split(args)
    i = 0
    while i < len(words):
        w = words[i]
        if w in FLAGS and i + 1 < len(words):
            out.append((FLAGS[w], words[i + 1]))
            i += 2
        elif w in SWITCHES:
            out.append((SWITCHES[w], ""))
            i += 1
        else:
            i += 1
    return out


def write(target, items):
    d = f"fuzz/corpus/{target}"
    os.makedirs(d, exist_ok=True)
    for old in glob.glob(f"{d}/test-*.txt"):
        os.remove(old)
    for kv in items:
        text = "".join(f"{k} {v}".rstrip(" ") + "\n" for k, v in kv)
        name = hashlib.sha1(text.encode()).hexdigest()[:12]
        with open(f"{d}/test-{name}.txt", "w") as f:
            f.write(text)


view, placement, layout = [], [], []
for command, args in commands():
    try:
        kv = fields(args)
    except ValueError:
        continue
    keys = dict(kv)
    if command == "mesh":
        view.append(kv)
        continue
    if command == "redistribute":
        # One target reads "placements" or "layout" plus "to"; "from" is it.
        text = keys.get("from", "")
        key = "layout" if "{" in text else "placements"
        kv = [(key if k == "from" else k, v) for k, v in kv]
        keys = dict(kv)
    if "layout" in keys:
        layout.append(kv)
    elif "placements" in keys:
        placement.append(kv)
write("view", view)
write("placement", placement)
write("layout", layout)
print(f"view {len(view)}, placement {len(placement)}, layout {len(layout)}")
