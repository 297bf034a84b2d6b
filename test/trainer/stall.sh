#!/usr/bin/env bash
# trainer.stall: the trainer on FSDP 2 x TP 2 (4 ranks), rank 3 stopped
# (SIGSTOP) mid-run for longer than the timeout (issue 37; docs/runtime.md,
# "Which rank did not arrive"). The trainer runs its tensor-parallel
# collectives inside its compute callbacks and the plan runs the FSDP ones,
# so a survivor may wait for rank 3 directly (its TP partner, rank 2, or its
# FSDP partner, rank 1) or one step removed (rank 0 waits for rank 1, which
# waits for rank 3). Each must say so:
#  - every survivor's error names rank 3, directly ("rank 3 has not arrived
#    and reported nothing") or one step further ("it is inside ... where
#    rank 3 reported nothing");
#  - the launcher names it ("rank 3 is stopped"), the job ends, and no
#    process of the job is left (listed by the store named in their
#    environment).
#
#   stall.sh BIN_DIR SOURCE_DIR
set -uo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-stall-XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }
source "$(dirname "$0")/../lib/processes.sh"
timeout=5
mkdir "$work/store"
"$bin/meshplan" run -n 4 --timeout "$timeout" --grace 20 --store "file:$work/store" -- \
  "$bin/meshplan-train" --spec "$src/test/trainer/specs/fsdp2-tp2.json" --data "$src/docs" \
  --batch 2 --seq-len 32 --steps 100000 --log-every 1 >"$work/out" 2>"$work/err" &
launcher=$!
# Stop rank 3 once the job has run a few steps (an event: rank 0's line).
until grep -q "step 3/" "$work/out" "$work/err" 2>/dev/null; do
  kill -0 "$launcher" 2>/dev/null || { fail "the job ended before step 3"; cat "$work/err"; exit 1; }
  sleep 0.05
done
victim=$(rank_pid "$launcher" 3)
[[ -n $victim ]] || { fail "rank 3 not found"; exit 1; }
kill -STOP "$victim"
start=$(date +%s.%N)
wait "$launcher"
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
echo "launcher exit $rc after ${elapsed}s (timeout ${timeout}s)"
grep -hv 'step [0-9]*/' "$work/out" "$work/err" | cut -c1-700
[[ $rc != 0 ]] || fail "the launcher exited 0"
(( $(echo "$elapsed < $timeout + 40" | bc) )) || fail "the job took ${elapsed}s to end"
grep -q 'meshplan run: rank 3 is stopped' "$work/err" || fail "the launcher does not name the stopped rank"
errors=$(grep -h 'meshplan-train: error' "$work/out" "$work/err")
[[ -n $errors ]] || fail "no survivor reported an error"
while IFS= read -r line; do
  [[ -z $line ]] && continue
  grep -qE 'rank 3(, rank [0-9]+)* (ha(s|ve) not arrived and )?reported nothing' <<<"$line" ||
    fail "a survivor's error does not name rank 3: $line"
done <<<"$errors"
left=$(job_pids "$work/store")
if [[ -n $left ]]; then
  fail "processes left behind: $left"
  ps -o pid,stat,args -p $left
  kill -KILL $left 2>/dev/null
else
  echo "processes of the job left: none"
fi
if (( failed )); then echo "trainer.stall: FAILED"; exit 1; fi
echo "trainer.stall: passed ($(grep -c . <<<"$errors") survivor reports, each naming rank 3)"
