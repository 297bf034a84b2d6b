#!/usr/bin/env bash
# runtime.ft.trainer: fault-tolerant replica groups with the real trainer,
# real processes and a real Redis (docs/fault-tolerance.md). HSDP, 3 replica
# groups x FSDP 2 (test/trainer/specs/ft-hsdp3x2.json), tiny model, 20 steps.
# The ranks are started by hand here (the launcher's own restart policy is
# tested by runtime.ft.launcher), so that this script decides when a dead
# group comes back.
#  1. Both ranks of replica 1 killed with SIGKILL at step 4 (at their first
#     forward), restarted (incarnation 1) once the survivors reach step 9:
#     the survivors never stop; the step in flight is discarded and redone
#     in the next epoch, with replica 1's share of the batch processed by
#     the survivors; replica 1 heals from its peers and rejoins. Every rank
#     exits 0, every replica ends with bit-identical parameters
#     (meshplan-train --compare refuses replicas that differ), and the
#     parameters equal an uninterrupted run bit for bit, real gradients and
#     all: the survivors keep the missing group's share apart and the
#     fault-tolerant all-reduces sum the shares in group order
#     (docs/fault-tolerance.md, "Exact sums").
#  2. One rank of replica 2 killed in its last backward of step 6, while
#     the earlier units' reductions are in flight: its group-mate fails in
#     its own group's collective and leaves; the others go on to step 20 and
#     equal the uninterrupted run bit for bit.
#  3. --synthetic-grads (every rank's gradient the same function of the
#     parameter index and step) from here on, which the later cases share:
#     the run of case 1 again, bit for bit.
#  3b. Group 0 killed (rank 0 and coordinate 0 of the managed axis, the
#     owner rule's writers): the survivors save a checkpoint at step 20
#     (the lowest live group writes, the lowest live rank commits); a plain
#     job loads it and runs step 21, equal to 21 uninterrupted steps.
#  3c. The heal's source killed mid-transfer: replica 1 rejoins and heals
#     from groups 0 and 2; group 2 dies after sending one buffer. Nothing
#     of the joiner changes, the step is discarded, and the joiner heals
#     from group 0 alone in the next epoch: bit for bit again.
#  4. Case 3 through `meshplan run --fault-tolerant`, which restarts the
#     killed group itself (its private redis-server, its own store): bit
#     for bit again.
#  5. The store restarted mid-run without persistence (the job's epoch and
#     quorum gone): every rank stops at once with an error naming the store;
#     the job, which saved a checkpoint every 2 steps (--checkpoint-every),
#     resumes from the last one as a new job: bit for bit at step 20.
#  6. Bad input, before any step: min_replicas above the group count; a
#     store nobody listens on; a spec without a managed axis.
#
#   fault-tolerance.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
train=$bin/meshplan-train
spec=$src/test/trainer/specs/ft-hsdp3x2.json
server=$(command -v redis-server || true)
if [[ -z $server ]]; then
  echo "SKIPPED: redis-server is not installed (Debian package redis-server)"
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-ft-XXXXXX")
source "$(dirname "$0")/../lib/redis.sh"
start_loopback_redis "$server" "$work"
port=$REDIS_PORT
cleanup() {
  pkill -9 -f "$work/" 2>/dev/null || true
  local pid
  pid=$(cat "$work/redis.pid" 2>/dev/null || true)
  [[ -z $pid ]] || kill "$pid" 2>/dev/null || true
  # Killed processes (and redis-server writing its log as it stops) exit
  # asynchronously: removing the directory under them can fail, and under
  # `set -e` a failing trap fails the test after every case passed.
  for _ in $(seq 100); do
    { [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; } ||
      pgrep -f "$work/" >/dev/null || break
    sleep 0.05
  done
  if [[ -z ${KEEP:-} ]]; then
    for _ in $(seq 20); do
      rm -rf "$work" 2>/dev/null && break
      sleep 0.1
    done
  fi
  return 0
}
trap cleanup EXIT
# The trainer's text (docs/ by default) copied once, so that every run of
# this test trains on the same tokens even if the tree changes meanwhile.
cp -r "$src/docs" "$work/data"
common=(--spec "$spec" --data "$work/data" --batch 2 --seq-len 32 --log-every 1 --steps 20)
extra=()

# Every fault-tolerant rank sleeps this long before each step, so that the
# faults land mid-run. A group restarted at step 4 or 9 must also start, plan
# and join before the survivors finish step 20: that is not left to the
# delay (under load the survivors once finished first and the joiner found
# no quorum) but held by an event, hold and release below.
delay=200
# start JOB RANK INCARNATION [ENV...]: one rank in the background. Its log
# carries the protocol's events (MESHPLAN_FT_LOG), which a failure prints.
start() {
  local job=$1 rank=$2 inc=$3
  shift 3
  env "$@" RANK="$rank" WORLD_SIZE=6 LOCAL_RANK="$rank" MESHPLAN_TIMEOUT=30 \
    MESHPLAN_TEST_STEP_DELAY_MS=$delay MESHPLAN_FT_LOG=1 \
    MESHPLAN_STORE="file:$work/$job.store" MESHPLAN_JOB="$job" \
    MESHPLAN_FT_STORE="redis://127.0.0.1:$port" MESHPLAN_FT_INCARNATION="$inc" \
    "$train" "${common[@]}" --save-params "$work/$job.params" "${extra[@]}" \
    >>"$work/$job.r$rank.log" 2>&1 &
  pids[$rank]=$!
} 2>/dev/null
# show JOB: every rank's log (their last 40 lines), for a failure.
show() {
  local f
  for f in "$work/$1".r*.log; do
    echo "--- $(basename "$f")" >&2
    tail -n 40 "$f" >&2
  done
}
# finish JOB RANKS...: waits for the ranks; each must exit 0.
finish() {
  local job=$1 r code
  shift
  for r in "$@"; do
    code=0
    { wait "${pids[$r]}"; } 2>/dev/null || code=$?
    if [[ $code != 0 ]]; then
      echo "FAIL: $job: rank $r exited with status $code; the ranks' logs:" >&2
      show "$job"
      exit 1
    fi
  done
}
# hold JOB: what makes every rank of JOB wait after step 19 until release
# (MESHPLAN_TEST_HOLD): a restarted group must rejoin before the job ends,
# however slowly it starts on a loaded machine. An event, not a delay.
hold() { echo "MESHPLAN_TEST_HOLD=19:$work/$1.gate"; }
# release JOB RANK: once RANK, restarted (incarnation 1), has adopted an
# epoch, or has died (finish then reports it), the held ranks go on.
release() {
  local job=$1 rank=$2
  until awk '/incarnation 1\)/ { s = 1 } s && /adopts epoch/ { f = 1 }
             END { exit !f }' "$work/$job.r$rank.log" ||
      ! kill -0 "${pids[$rank]}" 2>/dev/null; do
    sleep 0.05
  done
  touch "$work/$job.gate"
}
mkdir -p "$work/s1.store" "$work/s2.store" "$work/s3.store" "$work/bad.store"

echo "== uninterrupted (fault tolerance off)"
"$bin/meshplan" run -n 6 --timeout 60 -- "$train" "${common[@]}" --log-every 20 \
  --save-params "$work/plain.params" | tail -n 1
"$bin/meshplan" run -n 6 --timeout 60 -- "$train" "${common[@]}" --log-every 20 \
  --synthetic-grads --save-params "$work/plain-synthetic.params" | tail -n 1

echo "== 1. replica 1 killed at step 4, back at step 9"
declare -a pids
for r in 0 1 2 3 4 5; do start s1 "$r" 0 MESHPLAN_TEST_KILL=4:2,3 "$(hold s1)"; done
for r in 2 3; do
  if { wait "${pids[$r]}"; } 2>/dev/null; then
    echo "FAIL: rank $r was not killed" >&2
    exit 1
  fi
done
until grep -q "^step 9/20" "$work/s1.r0.log"; do sleep 0.05; done
for r in 2 3; do start s1 "$r" 1 "$(hold s1)"; done
release s1 2
finish s1 0 1 2 3 4 5
grep -h "^fault tolerance" "$work"/s1.r0.log "$work"/s1.r2.log
grep -q "committed in epoch 2 (replica groups 0, 2 of 3 live)" "$work/s1.r0.log"
grep -Eq "replica groups 0, 1, 2 of 3 live\); [0-9]+ steps discarded, 1 heals" "$work/s1.r0.log"
"$train" --compare "$work/s1.params" "$work/plain.params" --rtol 0 | head -n 1

echo "== 2. one rank of replica 2 killed mid-reduction at step 6"
for r in 0 1 2 3 4 5; do start s2 "$r" 0 MESHPLAN_TEST_KILL=6:4:last-backward; done
finish s2 0 1 2 3
for r in 4 5; do
  if { wait "${pids[$r]}"; } 2>/dev/null; then
    echo "FAIL: rank $r of the lost group exited 0" >&2
    exit 1
  fi
done
grep -h "^fault tolerance" "$work/s2.r0.log" | tail -n 1
grep -v "^ft-log" "$work/s2.r5.log" | grep -m 1 "error"
"$train" --compare "$work/s2.params" "$work/plain.params" --rtol 0 | head -n 1

echo "== 3. case 1 with --synthetic-grads: bit for bit"
common+=(--synthetic-grads)
for r in 0 1 2 3 4 5; do start s3 "$r" 0 MESHPLAN_TEST_KILL=4:2,3 "$(hold s3)"; done
for r in 2 3; do { wait "${pids[$r]}"; } 2>/dev/null || true; done
until grep -q "^step 9/20" "$work/s3.r0.log"; do sleep 0.05; done
for r in 2 3; do start s3 "$r" 1 "$(hold s3)"; done
release s3 2
finish s3 0 1 2 3 4 5
"$train" --compare "$work/s3.params" "$work/plain-synthetic.params" --rtol 0 | head -n 1

echo "== 3b. group 0 (rank 0, managed coordinate 0) killed; the survivors checkpoint"
# The owner rule's coordinate 0 of the managed axis is dead: the lowest live
# group writes, and the lowest live rank commits. A plain job loads the
# checkpoint and runs step 21: the uninterrupted 21 steps, bit for bit.
mkdir -p "$work/s5.store"
extra=(--save-checkpoint "$work/s5.ckpt")
for r in 0 1 2 3 4 5; do start s5 "$r" 0 MESHPLAN_TEST_KILL=4:0,1; done
extra=()
for r in 0 1; do { wait "${pids[$r]}"; } 2>/dev/null || true; done
finish s5 2 3 4 5
"$bin/meshplan" ckpt verify "$work/s5.ckpt"
"$bin/meshplan" run -n 6 --timeout 60 -- "$train" "${common[@]}" --steps 21 --log-every 21 \
  --load-checkpoint "$work/s5.ckpt" --save-params "$work/s5.resumed" | grep loaded
"$bin/meshplan" run -n 6 --timeout 60 -- "$train" "${common[@]}" --steps 21 --log-every 21 \
  --save-params "$work/plain-synthetic-21.params" | tail -n 1
"$train" --compare "$work/s5.resumed" "$work/plain-synthetic-21.params" --rtol 0 | head -n 1

echo "== 3c. the heal's source killed mid-transfer"
# Replica 1 comes back at step 9 and heals from groups 0 and 2, striped;
# both ranks of group 2 kill themselves after sending their first buffer
# (MESHPLAN_TEST_KILL_HEAL_SOURCE_AFTER). The joiner's state is untouched
# (it stages everything), nobody commits that step, the next epoch leaves
# group 2 out and records group 1 as no source (it never voted a step ok),
# and group 1 heals again from group 0 alone: bit for bit at step 20.
mkdir -p "$work/s7.store"
for r in 0 1 2 3; do start s7 "$r" 0 MESHPLAN_TEST_KILL=4:2,3 "$(hold s7)"; done
for r in 4 5; do start s7 "$r" 0 MESHPLAN_TEST_KILL_HEAL_SOURCE_AFTER=1 "$(hold s7)"; done
for r in 2 3; do { wait "${pids[$r]}"; } 2>/dev/null || true; done
until grep -q "^step 9/20" "$work/s7.r0.log"; do sleep 0.05; done
for r in 2 3; do start s7 "$r" 1 "$(hold s7)"; done
release s7 2
for r in 4 5; do
  if { wait "${pids[$r]}"; } 2>/dev/null; then
    echo "FAIL: rank $r (a heal source) was not killed mid-transfer" >&2
    exit 1
  fi
done
finish s7 0 1 2 3
grep -h "^fault tolerance" "$work/s7.r0.log" | tail -n 2
grep -q "replica groups 0, 1 of 3 live" "$work/s7.r2.log" || {
  echo "FAIL: replica 1 did not heal once group 2 was gone:" >&2
  grep -h "^fault tolerance" "$work/s7.r2.log" >&2; exit 1; }
"$train" --compare "$work/s7.params" "$work/plain-synthetic.params" --rtol 0 | head -n 1

echo "== 4. through the launcher: meshplan run --fault-tolerant restarts replica 1"
# The ranks wait after step 19 until the launcher reports the restarted
# group back in an epoch (or the launcher has ended).
"$bin/meshplan" run -n 6 --fault-tolerant --timeout 60 -- env MESHPLAN_TEST_KILL=4:2,3 \
  MESHPLAN_TEST_STEP_DELAY_MS=$delay "$(hold s4)" \
  "$train" "${common[@]}" --log-every 20 --save-params "$work/s4.params" >"$work/s4.log" 2>&1 &
launcher=$!
until grep -Eq "^meshplan run: epoch [0-9]+: (replica 1 joined|same replicas)" "$work/s4.log" ||
    ! kill -0 "$launcher" 2>/dev/null; do
  sleep 0.05
done
touch "$work/s4.gate"
wait "$launcher" || {
  echo "FAIL: the launcher's fault-tolerant run failed:" >&2; tail -n 20 "$work/s4.log" >&2; exit 1; }
grep -E "^meshplan run: (rank 2 exited|epoch)" "$work/s4.log"
grep -q "epoch 3: replica 1 joined; 3 of 3 live" "$work/s4.log"
# (common carries --synthetic-grads since case 3: bit for bit again.)
"$train" --compare "$work/s4.params" "$work/plain-synthetic.params" --rtol 0 | head -n 1

echo "== 5. the store restarted mid-run without persistence: every rank stops, naming it"
mkdir -p "$work/s6.store"
extra=(--steps 400 --save-checkpoint "$work/s6.ckpt" --checkpoint-every 2)
for r in 0 1 2 3 4 5; do start s6 "$r" 0; done
extra=()
until grep -q "^step 5/" "$work/s6.r0.log"; do sleep 0.05; done
old=$(cat "$work/redis.pid")
kill "$old"
for _ in $(seq 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.05; done
"$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log"
restarted=$(date +%s.%N)
for r in 0 1 2 3 4 5; do
  if { wait "${pids[$r]}"; } 2>/dev/null; then
    echo "FAIL: rank $r finished although the store lost the job" >&2
    exit 1
  fi
  grep -q "membership store redis://127.0.0.1:$port no longer holds job" "$work/s6.r$r.log" || {
    echo "FAIL: rank $r did not name the store:" >&2; tail -n 3 "$work/s6.r$r.log" >&2; exit 1; }
done
grep -v "^ft-log" "$work/s6.r0.log" | grep -m 1 "error"
echo "every rank stopped $(python3 -c "print(f'{$(date +%s.%N) - $restarted:.1f}')") s after the restart"
# The job resumes from its last checkpoint (saved every 2 steps), as a new
# fault-tolerant job on the restarted store: at step 20 it equals the
# uninterrupted run bit for bit (--synthetic-grads since case 3).
"$bin/meshplan" ckpt verify "$work/s6.ckpt"
mkdir -p "$work/s6b.store"
extra=(--load-checkpoint "$work/s6.ckpt")
for r in 0 1 2 3 4 5; do start s6b "$r" 0; done
extra=()
finish s6b 0 1 2 3 4 5
grep -h "^loaded" "$work/s6b.r0.log"
"$train" --compare "$work/s6b.params" "$work/plain-synthetic.params" --rtol 0 | head -n 1

echo "== 6. bad input"
expect() { # expect PATTERN ENV...: one rank refuses before any step
  local pattern=$1
  shift
  set +e
  env "$@" RANK=0 WORLD_SIZE=6 MESHPLAN_STORE="file:$work/bad.store" MESHPLAN_JOB=bad \
    "$train" --spec "$spec" --steps 1 >"$work/bad.out" 2>"$work/bad.err"
  local code=$?
  set -e
  if [[ $code == 0 ]] || ! grep -q -- "$pattern" "$work/bad.err"; then
    echo "FAIL: expected an error matching '$pattern', got exit $code:" >&2
    cat "$work/bad.err" >&2
    exit 1
  fi
  head -n 1 "$work/bad.err"
}
expect "min_replicas 4 must be in 1..3" MESHPLAN_FT_STORE="redis://127.0.0.1:$port" \
  MESHPLAN_FT_MIN_REPLICAS=4
dead=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
expect "cannot reach the membership store redis://127.0.0.1:$dead" \
  MESHPLAN_FT_STORE="redis://127.0.0.1:$dead"
set +e
env RANK=0 WORLD_SIZE=8 MESHPLAN_STORE="file:$work/bad.store" MESHPLAN_JOB=bad2 \
  MESHPLAN_FT_STORE="redis://127.0.0.1:$port" "$train" \
  --spec "$src/examples/specs/fsdp-sr-adamw.json" --model tiny --steps 1 \
  >"$work/bad.out" 2>"$work/bad.err"
code=$?
set -e
[[ $code != 0 ]] && grep -q "no managed axis" "$work/bad.err" || {
  echo "FAIL: a spec without a managed axis ran fault-tolerant" >&2; cat "$work/bad.err" >&2; exit 1; }
head -n 1 "$work/bad.err"
echo "fault tolerance: all cases passed"
