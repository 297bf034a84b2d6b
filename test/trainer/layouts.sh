#!/usr/bin/env bash
# trainer.sr-layouts: the bf16 stochastic-rounding AdamW gives the same bits
# in two different layouts when both get the same gradients
# (--synthetic-grads: a function of tensor, global index and step, so the
# reduced gradient is the same exactly): fsdp-sr-adamw.json (FSDP over 8,
# 4 microbatches) against sr-hsdp2x3-tp2.json (2 replicas x FSDP over 3 x TP
# over 2, 2 microbatches). Also trainer.resume: 10 steps in one session equal
# 5 steps, a fresh session from the shards kept in memory, and 5 more.
#
#   layouts.sh BIN_DIR EXAMPLES_SPECS_DIR TRAINER_SPECS_DIR (sr | resume)
set -euo pipefail
bin=$1 specs=$2 tspecs=$3 what=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-layouts-XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--steps 10 --batch 2 --seq-len 32 --log-every 10)
case $what in
sr)
  "$bin/meshplan" run -n 8 --timeout 60 -- "$bin/meshplan-train" \
    --spec "$specs/fsdp-sr-adamw.json" --model tiny "${common[@]}" \
    --synthetic-grads --save-params "$work/a" | tail -n 1
  "$bin/meshplan" run -n 12 --timeout 60 -- "$bin/meshplan-train" \
    --spec "$tspecs/sr-hsdp2x3-tp2.json" "${common[@]}" \
    --synthetic-grads --save-params "$work/b" | tail -n 1
  "$bin/meshplan-train" --compare "$work/a" "$work/b" --rtol 0
  ;;
resume)
  spec=$tspecs/../../runtime/specs/hsdp2x3-sr.json
  "$bin/meshplan" run -n 6 --timeout 60 -- "$bin/meshplan-train" \
    --spec "$spec" "${common[@]}" --save-params "$work/a" | tail -n 1
  "$bin/meshplan" run -n 6 --timeout 60 -- "$bin/meshplan-train" \
    --spec "$spec" "${common[@]}" --resume-after 5 --save-params "$work/b" |
    grep -E "resumed|summary"
  "$bin/meshplan-train" --compare "$work/a" "$work/b" --rtol 0
  ;;
*)
  echo "layouts.sh: unknown check $what" >&2
  exit 2
  ;;
esac
