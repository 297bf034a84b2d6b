#!/usr/bin/env bash
# trainer.device: meshplan-train with its plan run by the device executor on
# the host device (--host-device; docs/cuda.md, "Executor on devices"): the
# arena, device streams and events, float8 scales on the device, Gloo staged
# through host memory, the model's callbacks on host copies
# (Session::computeOnHost). Every comparison is bit for bit (--rtol 0):
#  1. FSDP + TP + float8 (fsdp-fp8-3d), TP with trainer collectives
#     (fsdp6-tp2) and a pipeline with FSDP and TP inside its stages
#     (pp2-fsdp2-tp2, send/recv staged) against the single-process reference;
#  2. a checkpoint saved by a device session and loaded by a host one, and
#     the reverse, each continuing to the uninterrupted run's parameters;
#  3. --resume-after through copyOut/copyInto.
#
#   device.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-device-XXXXXX")
trap 'rm -rf "$work"' EXIT
run() { "$bin/meshplan" run --timeout 60 "$@"; }
train=$bin/meshplan-train
common=(--batch 2 --seq-len 32 --log-every 100)

echo "== 1. the device executor against the single-process reference"
for c in "examples/specs/fsdp-fp8-3d.json 8 --model tiny" \
         "test/runtime/specs/fsdp6-tp2.json 12" \
         "test/trainer/specs/pp2-fsdp2-tp2.json 8"; do
  read -r spec n extra <<<"$c"
  # shellcheck disable=SC2086
  run -n "$n" -- "$train" --spec "$src/$spec" $extra "${common[@]}" --steps 6 \
    --host-device --save-params "$work/dev" | tail -n 1
  # shellcheck disable=SC2086
  "$train" --spec "$src/$spec" $extra "${common[@]}" --steps 6 --reference \
    --save-params "$work/one" | tail -n 1
  "$train" --compare "$work/dev" "$work/one" --rtol 0
  rm -rf "$work/dev" "$work/one"
done

echo "== 2. checkpoints between device and host sessions"
spec=$src/test/runtime/specs/hsdp2x3-sr.json
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 8 --save-params "$work/a" | tail -n 1
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 4 --host-device \
  --save-checkpoint "$work/c-dev" | grep saved
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 8 --load-checkpoint "$work/c-dev" \
  --save-params "$work/b" | grep loaded
"$train" --compare "$work/a" "$work/b" --rtol 0
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 4 --save-checkpoint "$work/c-host" |
  grep saved
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 8 --host-device \
  --load-checkpoint "$work/c-host" --save-params "$work/c" | grep loaded
"$train" --compare "$work/a" "$work/c" --rtol 0

echo "== 3. resuming from shards kept in memory"
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 8 --host-device --resume-after 3 \
  --save-params "$work/d" | grep resumed
"$train" --compare "$work/a" "$work/d" --rtol 0
echo "== 4. --device-timing: held streams and timing events change no bit"
spec=$src/examples/specs/fsdp-fp8-3d.json
run -n 8 -- "$train" --spec "$spec" --model tiny "${common[@]}" --steps 4 --host-device \
  --device-timing --save-params "$work/e" >"$work/timing.log"
"$train" --spec "$spec" --model tiny "${common[@]}" --steps 4 --reference \
  --save-params "$work/f" | tail -n 1
"$train" --compare "$work/e" "$work/f" --rtol 0
grep 'device timing' "$work/timing.log"
# Every kind of the plan's instructions reported, with a device time.
for kind in all_gather reduce_scatter fp8_cast optimizer_update; do
  line=$(grep -E "^\[rank 0\]   $kind +[0-9]+ per step" "$work/timing.log") || {
    echo "FAIL: no device timing line for $kind" >&2
    exit 1
  }
  echo "$line"
  awk '{ if (!($(NF - 3) > 0)) exit 1 }' <<<"$line" || {
    echo "FAIL: $kind has no device time" >&2
    exit 1
  }
done
echo "trainer on the device executor: all cases passed"
