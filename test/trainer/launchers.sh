#!/usr/bin/env bash
# trainer.launch.*: meshplan-train started by other launchers than
# `meshplan run` (docs/runtime.md, "torchrun", "Slurm") trains exactly as
# under `meshplan run -n 4`: the same loss lines and bit-identical final
# parameters (test/trainer/specs/fsdp2-tp2.json, FSDP 2 x TP 2).
#
#   torchrun  `python -m torch.distributed.run --standalone --nproc-per-node
#             4 --no-python meshplan-train ...` (torchrun itself): the ranks
#             rendezvous in torchrun's own c10d TCPStore at
#             MASTER_ADDR:MASTER_PORT; no MESHPLAN_STORE. Skipped with one
#             line where PYTHON has no torch.
#   slurm     four processes with srun's variables set by hand (SLURM_PROCID,
#             SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES,
#             SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NODELIST) and a file:
#             store; a second job step reuses the same store directory (the
#             keys are named by job and step id).
#   errors    bad launcher environments: one line naming the variables,
#             exit 2, nothing on stdout.
#
#   launchers.sh BIN_DIR SOURCE_DIR MODE [PYTHON]
set -euo pipefail
bin=$1 src=$2 mode=$3 python=${4:-python3}
train=$bin/meshplan-train
spec=$src/test/trainer/specs/fsdp2-tp2.json
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-launch-$mode-XXXXXX")
trap 'rm -rf "$work"' EXIT
flags=(--spec "$spec" --steps 6 --batch 2 --seq-len 32 --log-every 1)
# The environment of a rank, free of any launcher's variables the test runs
# under (ctest under `meshplan run` or srun must not leak into the ranks).
clean=(env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u GROUP_RANK
  -u MESHPLAN_STORE -u MESHPLAN_JOB -u MASTER_ADDR -u MASTER_PORT
  -u TORCHELASTIC_USE_AGENT_STORE -u TORCHELASTIC_RUN_ID -u SLURM_PROCID
  -u SLURM_NTASKS -u SLURM_LOCALID -u SLURM_JOB_ID -u SLURM_STEP_ID)

reference() {
  "${clean[@]}" "$bin/meshplan" run -n 4 --timeout 60 -- "$train" "${flags[@]}" \
    --save-params "$work/run.params" >"$work/run.log"
  steps "$work/run.log" >"$work/run.steps"
}

# steps LOG: rank 0's "step K/N loss L lr R" lines, without timings.
steps() {
  sed 's/^\[rank [0-9]*\] //' "$1" | grep '^step' | sed 's| tok/s.*||' || true
}

# same LOG PARAMS: the loss lines and the parameters equal meshplan run's.
same() {
  steps "$1" >"$work/got.steps"
  if [[ ! -s $work/got.steps ]] || ! diff "$work/run.steps" "$work/got.steps"; then
    echo "FAIL: the loss lines differ from meshplan run's (above); log:" >&2
    cat "$1" >&2
    exit 1
  fi
  "$train" --compare "$2" "$work/run.params" --rtol 0 | head -n 1
}

case $mode in
torchrun)
  if ! "$python" -c 'import torch.distributed.run' 2>/dev/null; then
    echo "SKIPPED: $python has no torch (torchrun is torch.distributed.run)"
    exit 77
  fi
  reference
  # --standalone: torchrun picks a free port for its store on localhost.
  "${clean[@]}" "$python" -m torch.distributed.run --standalone --nproc-per-node 4 \
    --no-python "$train" "${flags[@]}" --save-params "$work/torchrun.params" \
    >"$work/torchrun.log" 2>"$work/torchrun.err" || {
    echo "FAIL: torchrun:" >&2
    cat "$work/torchrun.log" "$work/torchrun.err" >&2
    exit 1
  }
  same "$work/torchrun.log" "$work/torchrun.params"
  tail -n 1 "$work/torchrun.log"
  echo "torchrun: passed"
  ;;
slurm)
  reference
  mkdir "$work/shared-store"
  for step in 0 1; do
    pids=()
    for r in 0 1 2 3; do
      "${clean[@]}" SLURM_PROCID=$r SLURM_NTASKS=4 SLURM_LOCALID=$r SLURM_NODEID=0 \
        SLURM_NNODES=1 SLURM_JOB_ID=$$ SLURM_STEP_ID=$step \
        SLURM_STEP_NODELIST=localhost MESHPLAN_STORE="file:$work/shared-store" \
        MESHPLAN_TIMEOUT=60 "$train" "${flags[@]}" \
        --save-params "$work/slurm$step.params" >"$work/slurm$step.r$r.log" 2>&1 &
      pids+=($!)
    done
    for r in 0 1 2 3; do
      if ! wait "${pids[$r]}"; then
        echo "FAIL: step $step, task $r:" >&2
        cat "$work/slurm$step.r$r.log" >&2
        exit 1
      fi
    done
    cat "$work"/slurm$step.r*.log >"$work/slurm$step.log"
    same "$work/slurm$step.log" "$work/slurm$step.params"
  done
  echo "slurm: passed (two job steps on one store directory)"
  ;;
errors)
  failures=0
  # refuse PATTERN VAR=VALUE...: exit 2, one line on stderr matching
  # PATTERN, nothing on stdout.
  refuse() {
    local pattern=$1
    shift
    local got=0
    "${clean[@]}" "$@" "$train" "${flags[@]}" >"$work/out" 2>"$work/err" || got=$?
    if [[ $got != 2 ]] || [[ $(wc -l <"$work/err") != 1 ]] ||
      ! grep -qF -- "$pattern" "$work/err" || [[ -s $work/out ]]; then
      echo "FAIL: $*: exit $got (want 2), stderr:" >&2
      cat "$work/err" >&2
      failures=$((failures + 1))
    else
      echo "ok: $(cat "$work/err")"
    fi
  }
  store=MESHPLAN_STORE=file:$work/store
  refuse "RANK=1 disagrees with srun's SLURM_PROCID=2" \
    RANK=1 WORLD_SIZE=4 SLURM_PROCID=2 SLURM_NTASKS=4 "$store"
  refuse "WORLD_SIZE=4 disagrees with srun's SLURM_NTASKS=8" \
    RANK=1 WORLD_SIZE=4 SLURM_PROCID=1 SLURM_NTASKS=8 "$store"
  refuse "SLURM_NTASKS=3 but the spec's mesh" \
    SLURM_PROCID=0 SLURM_NTASKS=3 "$store"
  refuse "WORLD_SIZE=8 but the spec's mesh" RANK=0 WORLD_SIZE=8 "$store"
  refuse "SLURM_PROCID=4 is not below SLURM_NTASKS=4" \
    SLURM_PROCID=4 SLURM_NTASKS=4 "$store"
  refuse "SLURM_NTASKS is not set although SLURM_PROCID=0 is" SLURM_PROCID=0 "$store"
  refuse "MESHPLAN_STORE is not set: srun (SLURM_PROCID=0, SLURM_NTASKS=4)" \
    SLURM_PROCID=0 SLURM_NTASKS=4
  refuse "SLURM_LOCALID=\"x\" is not a non-negative integer" \
    SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_LOCALID=x "$store"
  refuse "TORCHELASTIC_USE_AGENT_STORE=False" RANK=0 WORLD_SIZE=4 \
    TORCHELASTIC_USE_AGENT_STORE=False TORCHELASTIC_RUN_ID=none
  refuse "MASTER_PORT is not set although torchrun's TORCHELASTIC_RUN_ID=abc is" \
    RANK=0 WORLD_SIZE=4 TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RUN_ID=abc \
    MASTER_ADDR=127.0.0.1
  refuse "MASTER_PORT=70000 is not a port" RANK=0 WORLD_SIZE=4 \
    TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RUN_ID=abc \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=70000
  refuse "RANK is not set (start the job with \`meshplan run\`, torchrun or srun"
  refuse "MESHPLAN_STORE: store \"ftp://x\"" RANK=0 WORLD_SIZE=4 MESHPLAN_STORE=ftp://x
  ((failures == 0)) || exit 1
  echo "errors: passed"
  ;;
*)
  echo "launchers.sh: unknown mode \"$mode\" (torchrun, slurm or errors)" >&2
  exit 2
  ;;
esac
