#!/usr/bin/env bash
# The mutation oracle (issue 38; docs/reliability.md, "The mutation oracle"):
# plans SPEC for the tiny model (every rank), applies single-rank edits of
# every kind with verify-mutate (unittests/Plan/VerifyMutate.cpp), which
# runs each edited set through validatePlan + verifyPlans, then runs every
# set verify accepted under the runtime's step-check (`meshplan run`, real
# Gloo, each rank checked against a single-process reference). An accepted
# edit whose step-check fails is a silent wrong result: the test fails and
# names it. Prints a table row: edits tried, rejected, equal, silent.
#
#   mutation-oracle.sh BIN_DIR SPEC NPROC [runtime-step-check flags...]
#
# MESHPLAN_MUTATION_PER_KIND (default 10) edits of each kind and
# MESHPLAN_MUTATION_SEED (default 1) choose the sweep; larger sweeps are
# documented in docs/reliability.md.
set -euo pipefail
bin=$1 spec=$2 nproc=$3
shift 3
per_kind=${MESHPLAN_MUTATION_PER_KIND:-10}
seed=${MESHPLAN_MUTATION_SEED:-1}
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-mutation-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$bin/meshplan" plan --spec "$spec" --model tiny --all -o "$work/plans" >/dev/null
"$bin/verify-mutate" --plans "$work/plans" --out "$work/accepted" \
  --per-kind "$per_kind" --seed "$seed" >"$work/mutate.log"
grep '^kind ' "$work/mutate.log"
read -r tried rejected accepted < <(sed -n \
  's/^total: tried \([0-9]*\), rejected \([0-9]*\), accepted \([0-9]*\)$/\1 \2 \3/p' \
  "$work/mutate.log")
equal=0 silent=0
if [[ -d "$work/accepted" ]]; then
  for dir in "$work/accepted"/*/; do
    dir=${dir%/}
    # The edit must still pass `meshplan verify` as the CLI reads it.
    "$bin/meshplan" verify "$dir" >/dev/null
    if "$bin/meshplan" run -n "$nproc" --timeout 30 -- \
        "$bin/runtime-step-check" --plans "$dir" --steps 2 "$@" \
        >"$dir.log" 2>&1; then
      equal=$((equal + 1))
      echo "equal: $(cat "$dir/EDIT.txt")"
    else
      silent=$((silent + 1))
      echo "SILENT WRONG RESULT: $(cat "$dir/EDIT.txt")"
      grep -m3 'runtime-step-check' "$dir.log" || tail -3 "$dir.log"
    fi
  done
fi
echo "| $(basename "$spec" .json) | $tried | $rejected | $equal | $silent |"
[[ $silent -eq 0 && $((rejected + equal)) -eq $tried ]]
