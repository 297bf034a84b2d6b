#!/usr/bin/env bash
# trainer.checkpoint-kill: kill -9 during a checkpoint save leaves the
# previous checkpoint loadable (docs/checkpoint-format.md, "Writing and
# crashes"; issue 10 item 2).
#
# A first job (HSDP 2 x FSDP 3, bf16 stochastic rounding, 6 ranks) trains 3
# steps and saves checkpoint C. Then, for RUNS seeds, a job on the same spec
# trains N = 3 + run steps and saves to the same C (so each run's checkpoint
# has its own step), and the test kill -9s ranks at
# a random point of that save: odd runs one rank (runs 1, 5, ...: rank 0, which
# gathers the records and commits; runs 3, 7, ...: another; the survivors run
# into the store timeout and fail, or finish if the commit was already done),
# even runs every rank of the job. The ranks are started torchrun-style
# (RANK, WORLD_SIZE, MESHPLAN_STORE) so that each has its own pid. The save
# is stretched with the runtime's test hook MESHPLAN_TEST_SLOW_CHECKPOINT_MS
# (a sleep at each phase boundary: staging made, data written, staged
# metadata, renamed), and the kill lands 0 .. 4 x that after the job's last
# step is logged. After every kill:
#  - next to C there is nothing but C and its staging directory .C.partial
#    (which readers refuse): no other directory that looks like a checkpoint;
#  - C verifies (`meshplan ckpt verify C`, when this build has the command)
#    and loads: a 6-rank job --load-checkpoint C continues after the step of
#    the checkpoint that was there before (the previous one) or after N (the
#    new one, when the kill came after the rename); nothing else.
#
# Each run's kill point and victim are a hash of the run number and
# MESHPLAN_KILL_SEED (default 0), printed with the outcome.
#
#   checkpoint-kill.sh BIN_DIR SOURCE_DIR [RUNS (default 8)]
set -uo pipefail
bin=$1 src=$2 runs=${3:-8} seed=${MESHPLAN_KILL_SEED:-0}
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-ckpt-kill-XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

train=$bin/meshplan-train
spec=$src/test/runtime/specs/hsdp2x3-sr.json
common=(--spec "$spec" --batch 2 --seq-len 32 --log-every 100)
world=6
delay=150 # ms per phase boundary of the save
parent=$work/ckpts
C=$parent/C
mkdir "$parent"

echo "== first checkpoint: 3 steps"
"$bin/meshplan" run -n $world --timeout 60 -- "$train" "${common[@]}" --steps 3 \
  --save-checkpoint "$C" | grep saved || { echo "FAIL: the first save"; exit 1; }

verify=()
if "$bin/meshplan" ckpt verify "$C" >"$work/verify.out" 2>&1; then
  verify=("$bin/meshplan" ckpt verify)
  echo "meshplan ckpt verify: $(tail -n 1 "$work/verify.out")"
else
  echo "meshplan ckpt verify not available in this build; loading only"
fi

old=0 new=0 previous=3
for ((run = 1; run <= runs; ++run)); do
  steps=$((3 + run))
  h=$(((run * 1103515245 + 12345 + seed * 2654435761) & 0x7fffffff))
  wait_ms=$((h % (4 * delay)))
  victim=$(((h >> 16) % (world - 1) + 1))
  ((run % 4 == 1)) && victim=0 # the committing rank
  store=$work/store$run
  mkdir "$store"
  pids=()
  for ((r = 0; r < world; ++r)); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r MESHPLAN_STORE="file:$store" MESHPLAN_TIMEOUT=5 \
      MESHPLAN_TEST_SLOW_CHECKPOINT_MS=$delay \
      "$train" "${common[@]}" --steps $steps --save-checkpoint "$C" \
      >"$work/out$run.$r" 2>"$work/err$run.$r" &
    pids+=($!)
  done
  # The save starts right after the last step, which rank 0 logs.
  for ((i = 0; i < 3000; ++i)); do
    grep -q "^step $steps/$steps" "$work/out$run.0" 2>/dev/null && break
    sleep 0.01
  done
  codes=()
  { # (no "Killed" lines from the shell)
    sleep "$(printf '0.%03d' "$wait_ms")"
    if ((run % 2)); then
      what="rank $victim"
      kill -9 "${pids[$victim]}"
    else
      what="every rank"
      for p in "${pids[@]}"; do kill -9 "$p"; done
    fi
    for p in "${pids[@]}"; do
      wait "$p"
      codes+=($?)
    done
  } 2>/dev/null
  pids=()

  # Nothing next to C but C and its staging directory.
  for entry in "$parent"/* "$parent"/.[!.]*; do
    [[ -e $entry ]] || continue
    case $(basename "$entry") in
    C | .C.partial) ;;
    *) fail "run $run: unexpected $(basename "$entry") next to the checkpoint" ;;
    esac
  done
  [[ -f $C/checkpoint.json ]] || fail "run $run: $C/checkpoint.json is missing"
  if ((${#verify[@]})) && ! "${verify[@]}" "$C" >"$work/verify.out" 2>&1; then
    fail "run $run: verify: $(cat "$work/verify.out")"
  fi
  loaded=$("$bin/meshplan" run -n $world --timeout 60 -- "$train" "${common[@]}" \
    --steps $((steps + 1)) --load-checkpoint "$C" 2>"$work/load.err" | grep 'loaded ')
  case $loaded in
  *"continuing at step $((previous + 1))") at="previous (step $previous)" old=$((old + 1)) ;;
  *"continuing at step $((steps + 1))") at="new (step $steps)" new=$((new + 1)) previous=$steps ;;
  *)
    at=none
    fail "run $run: the checkpoint does not load as step $previous or $steps:" \
      "${loaded:-$(tail -n 3 "$work/load.err")}"
    ;;
  esac
  staging=absent
  [[ -e $parent/.C.partial ]] && staging=present
  echo "run $run: killed $what ${wait_ms} ms after step $steps (exits ${codes[*]}):" \
    "C is the $at checkpoint and loads; staging dir $staging"
done
echo "$runs kills (seed $seed): C was the previous checkpoint $old times, the new one $new times"
((failed == 0)) && echo "PASS"
exit $failed
