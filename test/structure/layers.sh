#!/usr/bin/env bash
# structure.layers: scripts/check-layers.sh passes on the source tree, and
# fails, naming each file, line and rule, on a tree with planted violations
# (a planner layer including the runtime and MLIR, the runtime including the
# pipeline), so that the check cannot pass by checking nothing.
#
#   layers.sh SOURCE_DIR
set -euo pipefail
src=$1
bash "$src/scripts/check-layers.sh" "$src"
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-layers-XXXXXX")
trap 'rm -rf "$work"' EXIT
for layer in Core Support Frontend Plan Checkpoint Dialect Pipeline; do
  mkdir -p "$work/lib/$layer" "$work/include/meshplan/$layer"
done
mkdir -p "$work/runtime"
printf '#include "meshplan/Core/Mesh.h"\n#include "meshplan/Runtime/Session.h"\n#include <mlir/IR/Operation.h>\n' \
  >"$work/lib/Plan/Bad.cpp"
printf '#include "meshplan/Pipeline/Pipeline.h"\n' >"$work/runtime/Bad.h"
if bash "$src/scripts/check-layers.sh" "$work" >"$work/out" 2>&1; then
  echo "FAIL: check-layers.sh passed a tree with planted violations" >&2
  exit 1
fi
cat "$work/out"
for expected in "lib/Plan/Bad.cpp:2: the plan layer includes meshplan/Runtime" \
  "lib/Plan/Bad.cpp:3: the plan layer includes an MLIR or LLVM header" \
  "runtime/Bad.h:1: the runtime layer includes meshplan/Pipeline"; do
  grep -qF "$expected" "$work/out" || { echo "FAIL: not reported: $expected" >&2; exit 1; }
done
if grep -q "Bad.cpp:1:" "$work/out"; then
  echo "FAIL: an allowed include was reported" >&2
  exit 1
fi
echo "structure.layers: the rules hold, and planted violations are caught"
