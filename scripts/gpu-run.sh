#!/usr/bin/env bash
# Runs the GPU tests and the kernel benchmark from a bundle made by
# scripts/gpu-bundle.sh (copied into the bundle as run.sh). Needs no build:
#
#   bash BUNDLE/run.sh              (results also in $OUT/gpu-results.txt)
#
# Order: the host-side CUDA tests, the kernels bit for bit against the CPU
# kernels, NCCL on the device, every planned example through the device
# executor on the host device (a check of the bundle) and on the GPU (every
# rank of a job on the one device, Gloo staged through pinned memory), then
# bench-cuda-kernels and bench-runtime-collectives (issue 8, on more cores). A step that fails is reported and the rest still run;
# the exit status is the number of failed steps (skips count as passes, and
# say so).
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$bundle/out}
mkdir -p "$out"
log=$out/gpu-results.txt
# The bundle's libraries travel compressed (gpu-bundle.sh).
libs=$bundle/lib
if [[ -e $bundle/lib.tar.xz ]]; then
  libs=$(mktemp -d)/lib
  tar -C "$(dirname "$libs")" -xJf "$bundle/lib.tar.xz"
fi
: >"$log"
say() { echo "$*" | tee -a "$log"; }

# The image's NCCL: the toolkit's, or the one PyTorch's wheels bring.
nccl=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
  "$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null)"; do
  [[ -n $d && -e $d/libnccl.so.2 ]] && { nccl=$d; break; }
done
# cuBLAS for the model's test: the toolkit's, or PyTorch's nvidia-cublas.
cublas=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
  "$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)"; do
  [[ -n $d && -e $d/libcublas.so.13 ]] && { cublas=$d; break; }
done
export LD_LIBRARY_PATH=$libs${nccl:+:$nccl}${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$log"
say "nccl: ${nccl:-not found}; cublas 13: ${cublas:-not found}; nproc $(nproc)"

failed=0
step() { # step NAME COMMAND...
  local name=$1
  shift
  say "== $name"
  local start=$SECONDS
  "$@" >>"$log" 2>&1
  local rc=$?
  if [[ $rc == 0 ]]; then
    say "-- $name: passed ($((SECONDS - start)) s)"
  elif [[ $rc == 77 ]]; then
    say "-- $name: SKIPPED (see above)"
  else
    say "-- $name: FAILED (exit $rc)"
    failed=$((failed + 1))
  fi
}

# N ranks of runtime-step-check with torchrun's variables, as `meshplan run`
# sets them (the launcher needs MLIR, which the bundle leaves out).
launch() { # launch N PLANS DEVICE FLAGS...
  local n=$1 plans=$2 device=$3
  shift 3
  local store
  store=$(mktemp -d)
  local pids=() rc=0
  for ((r = 0; r < n; ++r)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MESHPLAN_STORE=file:$store \
      MESHPLAN_TIMEOUT=60 "$bundle/bin/runtime-step-check" --plans "$plans" --steps 3 \
      --device "$device" "$@" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || rc=$?
  done
  rm -rf "$store"
  return $rc
}

step "runtime.cuda.host" "$bundle/bin/RuntimeCudaHostTest"
step "runtime.cuda.kernels" "$bundle/bin/RuntimeCudaKernelsTest"
step "runtime.cuda.nccl" "$bundle/bin/RuntimeCudaNcclTest"
step "trainer.cuda.model" "$bundle/bin/TrainerLlamaCudaTest"
probe_store=$(mktemp -d)
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MESHPLAN_STORE=file:$probe_store \
  "$bundle/bin/runtime-step-check" --device cuda --probe >>"$log" 2>&1
gpu=$?
rm -rf "$probe_store"
while IFS='|' read -r name n flags; do
  # shellcheck disable=SC2086
  step "runtime.device.$name ($n ranks)" launch "$n" "$bundle/plans/$name" host $flags
  if [[ $gpu == 0 ]]; then
    # shellcheck disable=SC2086
    step "runtime.cuda.step.$name ($n ranks on one GPU)" \
      launch "$n" "$bundle/plans/$name" cuda $flags
  else
    say "-- runtime.cuda.step.$name: SKIPPED (no usable CUDA device)"
  fi
done <"$bundle/cases.txt"
step "bench-cuda-kernels" "$bundle/bin/bench-cuda-kernels"
# Issue 8's collectives against raw Gloo, 4 processes, on this machine's
# spare cores (the 2-core development VMs time-share them).
step "bench-runtime-collectives (key order)" "$bundle/bin/bench-runtime-collectives" --reps 9
step "bench-runtime-collectives (gloo order)" "$bundle/bin/bench-runtime-collectives" --reps 9 \
  --reduction-order gloo
say "== $failed failed step(s)"
exit "$failed"
