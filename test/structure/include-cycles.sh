#!/usr/bin/env bash
# structure.include-cycles: no include cycle between components (a header
# and its implementation; scripts/check-include-cycles.py, docs/
# architecture.md "Size rules") on the source tree; and, on a tree with
# planted cycles (two headers including each other; a.cpp including b.h
# while b.cpp includes a.h), each is reported while an include of a file
# that is not there (generated, another project's) is not, so that the
# check cannot pass by checking nothing.
#
#   include-cycles.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
python3 "$src/scripts/check-include-cycles.py" "$src" \
  lib include tools runtime examples python/src bench

work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-cycles-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lib/Headers" "$work/tools/run" "$work/include/meshplan/Headers"
printf '#include "meshplan/Headers/B.h"\n' >"$work/include/meshplan/Headers/A.h"
printf '#include "A.h"\n#include "dist/Generated.h.inc"\n' \
  >"$work/include/meshplan/Headers/B.h"
printf '#include "Launch.h"\n' >"$work/tools/run/Run.cpp"
printf '#pragma once\n' >"$work/tools/run/Run.h"
printf '#include "Run.h"\n' >"$work/tools/run/Launch.cpp"
printf '#pragma once\n' >"$work/tools/run/Launch.h"
printf '#include "meshplan/Headers/A.h"\n' >"$work/lib/Headers/Fine.cpp"
if python3 "$src/scripts/check-include-cycles.py" "$work" lib include tools \
  >"$work/out" 2>&1; then
  echo "FAIL: check-include-cycles.py passed a tree with planted cycles" >&2
  exit 1
fi
cat "$work/out"
for expected in \
  "include cycle: include/meshplan/Headers/A -> include/meshplan/Headers/B -> include/meshplan/Headers/A" \
  "include cycle: tools/run/Launch -> tools/run/Run -> tools/run/Launch"; do
  grep -qF "$expected" "$work/out" || { echo "FAIL: not reported: $expected" >&2; exit 1; }
done
if grep -q "Fine\|Generated" "$work/out"; then
  echo "FAIL: an include outside any cycle was reported" >&2
  exit 1
fi
echo "structure.include-cycles: no cycle, and planted cycles are caught"
