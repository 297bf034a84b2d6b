#!/usr/bin/env bash
# trainer.optimizer-step.fault-tolerant: gradient clipping under
# fault-tolerant replica groups (docs/trainer.md, "The optimizer step").
# ft-hsdp3x2-clip.json (3 replica groups on a managed axis x FSDP 2, the
# norm clipped at every step, warmup and cosine decay), 12 steps: replica 1
# killed at step 4 and restarted at step 8. While it is gone the survivors
# run its share of the batch and reduce over the two live groups; the
# norm's all-reduce runs over dp_shard only (a managed axis is never a norm
# axis), so it sees the uninterrupted run's gradients and clips by the same
# factor: the parameters equal the uninterrupted run's bit for bit.
#
#   optimizer-step-ft.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
train=$bin/meshplan-train
spec=$src/test/trainer/specs/ft-hsdp3x2-clip.json
server=$(command -v redis-server || true)
if [[ -z $server ]]; then
  echo "SKIPPED: redis-server is not installed (Debian package redis-server)"
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-ft-clip-XXXXXX")
source "$(dirname "$0")/../lib/redis.sh"
start_loopback_redis "$server" "$work"
port=$REDIS_PORT
declare -a pids
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  p=$(cat "$work/redis.pid" 2>/dev/null || true)
  [[ -z $p ]] || kill "$p" 2>/dev/null || true
  for _ in $(seq 20); do rm -rf "$work" 2>/dev/null && break; sleep 0.1; done
  return 0
}
trap cleanup EXIT
cp -r "$src/docs" "$work/data"
common=(--spec "$spec" --data "$work/data" --batch 2 --seq-len 32 --log-every 1 --steps 12)

echo "== uninterrupted (fault tolerance off)"
"$bin/meshplan" run -n 6 --timeout 60 -- "$train" "${common[@]}" --log-every 12 \
  --save-params "$work/plain.params" | tail -n 1

# Every rank sleeps 200 ms before each step (as runtime.ft.trainer does), so
# that the kill lands mid-run. A restarted group must also start, plan and
# join before the survivors finish: every rank waits after step 11 until the
# restarted group has adopted an epoch (MESHPLAN_TEST_HOLD, released below),
# an event rather than a longer delay (under load the survivors once
# finished first, and the joiner found no quorum).
start() {
  local rank=$1 inc=$2
  shift 2
  env "$@" RANK="$rank" WORLD_SIZE=6 LOCAL_RANK="$rank" MESHPLAN_TIMEOUT=30 \
    MESHPLAN_TEST_STEP_DELAY_MS=200 MESHPLAN_FT_LOG=1 \
    MESHPLAN_TEST_HOLD="11:$work/gate" \
    MESHPLAN_STORE="file:$work/store" MESHPLAN_JOB=clip \
    MESHPLAN_FT_STORE="redis://127.0.0.1:$port" MESHPLAN_FT_INCARNATION="$inc" \
    "$train" "${common[@]}" --save-params "$work/ft.params" \
    >>"$work/r$rank.log" 2>&1 &
  pids[$rank]=$!
} 2>/dev/null
mkdir -p "$work/store"
echo "== replica 1 killed at step 4, back at step 8"
for r in 0 1 2 3 4 5; do start "$r" 0 MESHPLAN_TEST_KILL=4:2,3; done
for r in 2 3; do
  if { wait "${pids[$r]}"; } 2>/dev/null; then
    echo "FAIL: rank $r was not killed" >&2
    exit 1
  fi
done
until grep -q "^step 8/12" "$work/r0.log"; do sleep 0.05; done
for r in 2 3; do start "$r" 1; done
until awk '/incarnation 1\)/ { s = 1 } s && /adopts epoch/ { f = 1 }
           END { exit !f }' "$work/r2.log" || ! kill -0 "${pids[2]}" 2>/dev/null; do
  sleep 0.05
done
touch "$work/gate"
for r in 0 1 2 3 4 5; do
  code=0
  { wait "${pids[$r]}"; } 2>/dev/null || code=$?
  if [[ $code != 0 ]]; then
    echo "FAIL: rank $r exited with status $code; the ranks' logs:" >&2
    for f in "$work"/r*.log; do echo "--- $(basename "$f")" >&2; tail -n 40 "$f" >&2; done
    exit 1
  fi
done
grep -q "committed in epoch 2 (replica groups 0, 2 of 3 live)" "$work/r0.log" ||
  { echo "FAIL: no step ran without replica 1" >&2; cat "$work/r0.log" >&2; exit 1; }
grep -E "^step (5|12)/12 " "$work/r0.log"
"$train" --compare "$work/ft.params" "$work/plain.params" --rtol 0 | head -n 1
