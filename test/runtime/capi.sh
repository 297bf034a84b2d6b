#!/usr/bin/env bash
# runtime.capi: plans test/runtime/specs/fsdp2-fp32.json for the tiny model
# (both ranks), then runs 2 steps of each rank's plan under `meshplan run`
# through the C API (libmeshplan_runtime.so) from Python ctypes, each rank
# checking its shards against a pure-Python AdamW reference
# (test/runtime/capi_test.py). The same run then saves a checkpoint
# (mp_session_save_checkpoint), checks a refused save, and loads it back into
# its own session byte-exact (mp_session_load_checkpoint); a second job on 3
# ranks (FSDP 3: uneven shards, another layout) loads it, continues with
# mp_resume_after and checks step 3 against the reference.
#
#   capi.sh BIN_DIR LIB_DIR
set -euo pipefail
bin=$1 lib=$2
here=$(cd "$(dirname "$0")" && pwd)
plans=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-capi-XXXXXX")
trap 'rm -rf "$plans"' EXIT
# A sanitizer build's library needs the sanitizer runtimes loaded before
# Python itself (which is not instrumented); its own leaks are not ours. Only
# the Python processes get them: meshplan itself links its runtime (clang
# links it statically, and two ASan runtimes in one process are refused).
python=(python3)
# ldd's output is matched in the shell: `ldd | grep -q` fails now and then
# under pipefail (grep exits at the first match and ldd dies of SIGPIPE).
deps=$(ldd "$lib/libmeshplan_runtime.so")
if [[ $deps == *libasan* ]]; then
  python=(env "LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
          "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" python3)
elif [[ $deps == *libclang_rt.asan* ]]; then
  # clang's shared runtime (-shared-libsan, the asan preset), which holds
  # UBSan's handlers too; it is not on the library path.
  python=(env "LD_PRELOAD=$(clang++-22 -print-runtime-dir)/libclang_rt.asan-x86_64.so"
          "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" python3)
fi
"$bin/meshplan" plan --spec "$here/specs/fsdp2-fp32.json" --model tiny --all \
  -o "$plans/plans" >/dev/null
"$bin/meshplan" run -n 2 --timeout 30 -- \
  "${python[@]}" "$here/capi_test.py" "$plans/plans" "$lib/libmeshplan_runtime.so" \
  --save "$plans/ckpt"
# The same model and optimizer on FSDP 3.
python3 - "$here/specs/fsdp2-fp32.json" "$plans/fsdp3-fp32.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["description"] = "runtime.capi: fsdp2-fp32.json on FSDP 3"
spec["world_size"] = 3
spec["mesh"]["axes"][0]["size"] = 3
json.dump(spec, open(sys.argv[2], "w"))
PY
"$bin/meshplan" plan --spec "$plans/fsdp3-fp32.json" --model tiny --all \
  -o "$plans/plans3" >/dev/null
"$bin/meshplan" run -n 3 --timeout 30 -- \
  "${python[@]}" "$here/capi_test.py" "$plans/plans3" "$lib/libmeshplan_runtime.so" \
  --resume "$plans/ckpt"
