#!/usr/bin/env bash
# trainer.cuda: meshplan-train --device cuda (docs/cuda.md, "The trainer on a
# GPU"): the plan on the GPU and the model on the CUDA ops (cuBLAS), against
# the single-process CPU reference. cuBLAS sums in another order than
# OpenBLAS, and AdamW turns a near-zero gradient's sign into a whole step,
# so parameters are not compared element by element here (the gradients
# are, in trainer.cuda.model); the loss of every step must agree:
#  1. one rank on one GPU over NCCL, bf16 matmuls (rtol 1e-2);
#  2. FSDP 2 x TP 2, four ranks sharing the GPU, Gloo staged through pinned
#     memory, the model's TP collectives staged through the host (1e-4);
#  3. a pipeline with FSDP and TP inside its stages, bf16 stage boundaries,
#     eight ranks sharing the GPU (1e-2).
# Exits 77 (skipped) when this machine has no usable CUDA device.
#
#   cuda.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-cuda-XXXXXX")
trap 'rm -rf "$work"' EXIT
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MESHPLAN_STORE="file:$work/probe" \
  "$bin/runtime-step-check" --device cuda --probe || exit $?

train=$bin/meshplan-train
common=(--batch 2 --seq-len 32 --steps 8)
losses() { grep -o 'step [0-9]*/[0-9]* loss [-0-9.e]*' "$1" | awk '{print $4}'; }
check() { # NAME SPEC N RTOL [ENV...]
  local name=$1 spec=$2 n=$3 rtol=$4
  shift 4
  echo "== $name"
  env "$@" "$bin/meshplan" run --timeout 120 -n "$n" -- "$train" \
    --spec "$src/$spec" "${common[@]}" --device cuda >"$work/gpu.log"
  "$train" --spec "$src/$spec" "${common[@]}" --reference >"$work/ref.log"
  tail -n 1 "$work/gpu.log"
  losses "$work/gpu.log" >"$work/gpu.loss"
  losses "$work/ref.log" >"$work/ref.loss"
  if [[ $(wc -l <"$work/gpu.loss") -ne 8 || $(wc -l <"$work/ref.loss") -ne 8 ]]; then
    echo "FAIL: expected 8 losses from each run" >&2
    exit 1
  fi
  paste "$work/gpu.loss" "$work/ref.loss" | awk -v r="$rtol" '
    { d = $1 - $2; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2
      printf "  step %d: gpu %s cpu %s\n", NR, $1, $2
      if (!(d <= r * a)) bad = 1 }
    END { if (bad) { print "FAIL: losses differ by more than " r " relative" > "/dev/stderr"; exit 1 } }'
}

check "one GPU, NCCL, bf16" test/trainer/specs/one-gpu-bf16.json 1 1e-2
check "FSDP 2 x TP 2 on one GPU, Gloo staged" test/trainer/specs/fsdp2-tp2-6l.json 4 1e-4 \
  MESHPLAN_BACKEND=gloo
check "PP 2 x FSDP 2 x TP 2, bf16, on one GPU, Gloo staged" \
  test/trainer/specs/pp2-fsdp2-tp2-bf16.json 8 1e-2 MESHPLAN_BACKEND=gloo
echo "trainer.cuda: all cases passed"
