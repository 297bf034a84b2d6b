#!/usr/bin/env bash
# runtime.capi: plans test/runtime/specs/fsdp2-fp32.json for the tiny model
# (both ranks), then runs 2 steps of each rank's plan under `meshplan run`
# through the C API (libmeshplan_runtime.so) from Python ctypes, each rank
# checking its shards against a pure-Python AdamW reference
# (test/runtime/capi_test.py).
#
#   capi.sh BIN_DIR LIB_DIR
set -euo pipefail
bin=$1 lib=$2
here=$(cd "$(dirname "$0")" && pwd)
plans=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-capi-XXXXXX")
trap 'rm -rf "$plans"' EXIT
"$bin/meshplan" plan --spec "$here/specs/fsdp2-fp32.json" --model tiny --all \
  -o "$plans/plans" >/dev/null
"$bin/meshplan" run -n 2 --timeout 30 -- \
  python3 "$here/capi_test.py" "$plans/plans" "$lib/libmeshplan_runtime.so"
