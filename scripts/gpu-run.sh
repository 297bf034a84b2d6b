#!/usr/bin/env bash
# Runs the GPU tests, the kernel benchmark and the trainer on a GPU from a
# bundle made by scripts/gpu-bundle.sh (copied into the bundle as run.sh),
# from the repository root (the trainer's specs and test/trainer/cuda.sh
# come from the checkout). Needs no build and no MLIR install:
#
#   bash BUNDLE/run.sh [STEP...]    (results also in $OUT/gpu-results.txt)
#
# With STEP arguments only the steps whose names start with one of them run
# (a rerun of what failed: `run.sh runtime.cuda.step trainer.cuda`).
#
# Order, most wanted first, each step under its own time limit so that one
# hang cannot eat a device lease: the host-side CUDA tests, the kernels bit
# for bit against the CPU kernels, NCCL on the device, the model's CUDA ops
# against its CPU ops, bench-cuda-kernels, one trainer run on one GPU over
# NCCL with --device-timing (step time; the executor's host time per
# instruction against the device time it launched), trainer.cuda.equivalence
# (test/trainer/cuda.sh), then every planned example with all of its ranks on
# the one GPU (Gloo staged through pinned memory: runtime.cuda.step.*). A
# step that fails is reported and the rest still run; the exit status is the
# number of failed steps (skips count as passes, and say so).
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
src=$(pwd)
out=${OUT:-$bundle/out}
mkdir -p "$out"
log=$out/gpu-results.txt
filters=("$@")
# The bundle's libraries travel compressed (gpu-bundle.sh).
libs=$bundle/lib
if [[ -e $bundle/lib.tar.xz ]]; then
  libs=$(mktemp -d)/lib
  tar -C "$(dirname "$libs")" -xJf "$bundle/lib.tar.xz"
fi
bin=$bundle/bin
if [[ -e $bundle/bin.tar.xz ]]; then
  bin=$(mktemp -d)/bin
  tar -C "$(dirname "$bin")" -xJf "$bundle/bin.tar.xz"
fi
: >"$log"
say() { echo "$*" | tee -a "$log"; }

# The image's NCCL and cuBLAS: the toolkit's, or the ones PyTorch's wheels
# bring (nvidia-nccl-cu13, nvidia-cublas).
wheel_lib() { # MODULE: the lib folder of an nvidia.* wheel, if installed
  python3 -c "import $1, os; print(os.path.join(list($1.__path__)[0], 'lib'))" 2>/dev/null
}
find_lib() { # SONAME MODULE
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
    "$(wheel_lib "$2")" "$(wheel_lib nvidia.cu13)"; do
    [[ -n $d && -e $d/$1 ]] && { echo "$d"; return; }
  done
}
nccl=$(find_lib libnccl.so.2 nvidia.nccl)
cublas=$(find_lib libcublas.so.13 nvidia.cublas)
export LD_LIBRARY_PATH=$libs${nccl:+:$nccl}${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 |
  tee -a "$log"
say "nccl: ${nccl:-not found}; cublas 13: ${cublas:-not found}; nproc $(nproc)"
say "$(ls "$nccl"/libnccl.so.2* 2>/dev/null | tr '\n' ' ')"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for f in "$bin"/*; do
  ldd "$f" | grep "not found" | sed "s|^|$(basename "$f") needs |" | tee -a "$log"
done

wanted() { # NAME: whether the filters select it
  [[ ${#filters[@]} == 0 ]] && return 0
  local f
  for f in "${filters[@]}"; do [[ $1 == "$f"* ]] && return 0; done
  return 1
}
# GPU_RUN_BUDGET_S (seconds, 0: none): a step that would start after it is
# reported as not run, and none runs past it, so that a device lease ends
# with the summary written.
budget=${GPU_RUN_BUDGET_S:-0}
failed=0
notrun=0
step() { # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  wanted "$name" || return 0
  if ((budget > 0)); then
    if ((SECONDS + 5 >= budget)); then
      say "-- $name: NOT RUN (the ${budget} s budget is spent)"
      notrun=$((notrun + 1))
      return 0
    fi
    ((limit > budget - SECONDS)) && limit=$((budget - SECONDS))
  fi
  say "== $name"
  local start=$SECONDS
  # Through bash, so that the shell functions below (exported) run too.
  timeout -k 10 "$limit" bash -c '"$@"' step "$@" >>"$log" 2>&1
  local rc=$?
  if [[ $rc == 0 ]]; then
    say "-- $name: passed ($((SECONDS - start)) s)"
  elif [[ $rc == 77 ]]; then
    say "-- $name: SKIPPED (see above)"
  elif [[ $rc == 124 || $rc == 137 ]]; then
    say "-- $name: FAILED (over its $limit s limit)"
    failed=$((failed + 1))
    failed_names+=("$name")
  else
    say "-- $name: FAILED (exit $rc, $((SECONDS - start)) s)"
    failed=$((failed + 1))
    failed_names+=("$name")
  fi
}
failed_names=()
failed_step() { # NAME: whether that step failed in this run
  local f
  for f in "${failed_names[@]}"; do [[ $f == "$1" ]] && return 0; done
  return 1
}
# A crash's stack, from cuda-gdb (the image has no gdb; cuda-gdb also
# debugs host code). The bundle keeps the symbols of the programs below.
backtrace() { # COMMAND...
  command -v cuda-gdb >/dev/null || { echo "no cuda-gdb on this machine"; return 77; }
  cuda-gdb -q -batch -ex run -ex bt -ex 'info threads' --args "$@" 2>&1 | tail -n 80
}
trainer_backtrace() {
  local store
  store=$(mktemp -d)
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MESHPLAN_STORE=file:$store \
    backtrace "$bin/meshplan-train" --spec "$src/test/trainer/specs/one-gpu-bf16.json" \
    --device cuda --steps 3
}

# N ranks of runtime-step-check with torchrun's variables, as `meshplan run`
# sets them, every rank on GPU 0 (LOCAL_RANK modulo the visible devices).
launch() { # launch N PLANS DEVICE FLAGS...
  local n=$1 plans=$2 device=$3
  shift 3
  local store
  store=$(mktemp -d)
  local pids=() rc=0
  for ((r = 0; r < n; ++r)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MESHPLAN_STORE=file:$store \
      MESHPLAN_TIMEOUT=30 "$bin/runtime-step-check" --plans "$plans" --steps 3 \
      --device "$device" "$@" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || rc=$?
  done
  rm -rf "$store"
  return $rc
}

# One trainer run on one GPU (issue 36): 20 steps, the plan over NCCL, the
# model on cuBLAS; then the same with every instruction also timed on the
# device (--device-timing: the executor's host time per instruction against
# the device time it launched).
train_one_gpu() {
  [[ $gpu == 0 ]] || { echo "no usable CUDA device"; return 77; }
  "$bin/meshplan" run --timeout 120 -n 1 -- "$bin/meshplan-train" \
    --spec "$src/test/trainer/specs/one-gpu-bf16.json" --device cuda --steps 20 "$@"
}

# Whether this machine has a usable CUDA device (exit 77: it has none).
probe_store=$(mktemp -d)
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MESHPLAN_STORE=file:$probe_store \
  "$bin/runtime-step-check" --device cuda --probe >>"$log" 2>&1
gpu=$?
rm -rf "$probe_store"

export bin src bundle gpu
export -f launch train_one_gpu backtrace trainer_backtrace

step "runtime.cuda.host" 120 "$bin/RuntimeCudaHostTest"
step "runtime.cuda.kernels" 120 "$bin/RuntimeCudaKernelsTest"
step "runtime.cuda.nccl" 90 "$bin/RuntimeCudaNcclTest"
step "trainer.cuda.model" 90 "$bin/TrainerLlamaCudaTest"
if failed_step trainer.cuda.model; then
  step "trainer.cuda.model (diagnosis: OPENBLAS_CORETYPE=Haswell)" 90 \
    env OPENBLAS_CORETYPE=Haswell "$bin/TrainerLlamaCudaTest"
  step "trainer.cuda.model (diagnosis: cuda-gdb)" 120 backtrace "$bin/TrainerLlamaCudaTest"
fi
step "bench-cuda-kernels" 150 "$bin/bench-cuda-kernels"
step "trainer.one-gpu" 90 train_one_gpu
if failed_step trainer.one-gpu; then
  step "trainer.one-gpu (diagnosis: cuda-gdb)" 120 trainer_backtrace
fi
step "trainer.one-gpu.device-timing" 60 train_one_gpu --device-timing
step "trainer.cuda.equivalence" 200 bash "$src/test/trainer/cuda.sh" "$bin" "$src"
while IFS='|' read -r name n flags; do
  if [[ $gpu == 0 ]]; then
    # shellcheck disable=SC2086
    step "runtime.cuda.step.$name ($n ranks on one GPU)" 75 \
      launch "$n" "$bundle/plans/$name" cuda $flags
  elif wanted "runtime.cuda.step.$name"; then
    say "-- runtime.cuda.step.$name: SKIPPED (no usable CUDA device)"
  fi
done <"$bundle/cases.txt"
# Without a GPU (a check of the bundle on a development machine): the same
# plans through the device executor on the host device.
if [[ $gpu != 0 ]]; then
  while IFS='|' read -r name n flags; do
    # shellcheck disable=SC2086
    step "runtime.device.$name ($n ranks)" 300 launch "$n" "$bundle/plans/$name" host $flags
  done <"$bundle/cases.txt"
fi
say "== $failed failed step(s), $notrun not run, in $SECONDS s"
exit "$((failed + notrun))"
