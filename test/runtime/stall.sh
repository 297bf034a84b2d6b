#!/usr/bin/env bash
# runtime.stall: a rank stopped (SIGSTOP) for longer than the timeout is
# named (issue 37; docs/runtime.md, "When a rank fails").
#  - The survivors' error names it: "rank 1 has not arrived and reported
#    nothing", with the communicator and the collective number.
#  - The launcher names it: "rank 1 is stopped".
#  - The job ends within the timeout plus a margin (the launcher wakes the
#    stopped rank with SIGCONT after SIGTERM instead of waiting for the
#    grace period's SIGKILL), and no process of the job is left: the test
#    lists every process whose environment names the job's store.
#
#   stall.sh BIN_DIR SPEC(3 ranks, fsdp axis)
set -uo pipefail
bin=$1 spec=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-stall-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$bin/meshplan" plan --spec "$spec" --model tiny --all -o "$work/plans" >/dev/null || exit 1
failed=0
fail() { echo "FAIL: $*"; failed=1; }
source "$(dirname "$0")/../lib/processes.sh"
timeout=5
mkdir "$work/store"
# Own store directory, so that the processes of this job can be found by it.
set -m
"$bin/meshplan" run -n 3 --timeout "$timeout" --grace 20 --store "file:$work/store" -- \
  "$bin/runtime-step-check" --plans "$work/plans" --shard fsdp --steps 5 --kill-rank 1 --kill-step 3 --stop \
  >"$work/out" 2>"$work/err" &
launcher=$!
set +m
# Rank 1 stops itself (SIGSTOP) in step 3's first backward.
for _ in $(seq 1200); do
  victim=$(rank_pid "$launcher" 1)
  [[ -n $victim && $(sed 's/.*) //' "/proc/$victim/stat" 2>/dev/null | cut -c1) == T ]] && break
  victim=
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
[[ -n $victim ]] || { fail "rank 1 did not stop"; cat "$work/out" "$work/err"; exit 1; }
start=$(date +%s.%N)
wait "$launcher"
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
echo "launcher exit $rc after ${elapsed}s (timeout ${timeout}s)"
grep -v '^\[rank 0\] step' "$work/err" | cut -c1-600
[[ $rc != 0 ]] || fail "the launcher exited 0"
# Timeout, the survivors' window (at most 3 s), and room for a loaded machine.
(( $(echo "$elapsed < $timeout + 25" | bc) )) || fail "the job took ${elapsed}s to end"
grep -q 'meshplan run: rank 1 is stopped' "$work/err" || fail "the launcher does not name the stopped rank"
grep -qE 'rank 1(, rank [0-9]+)* ha(s|ve) not arrived and reported nothing' "$work/err" ||
  fail "no survivor names rank 1 as the rank that did not arrive"
grep -qE 'members of "comm_mesh_fsdp" at its collective #[0-9]+ of step [0-9]+' "$work/err" ||
  fail "the survivors' message lacks the communicator and the collective number"
left=$(job_pids "$work/store")
if [[ -n $left ]]; then
  fail "processes left behind: $left"
  ps -o pid,stat,args -p $left
  kill -KILL $left 2>/dev/null
else
  echo "processes of the job left: none"
fi
[[ -z $(ls -A "$work/store") ]] || fail "store files left: $(ls "$work/store")"
if (( failed )); then echo "runtime.stall: FAILED"; exit 1; fi
echo "runtime.stall: passed"
