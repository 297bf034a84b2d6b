#!/usr/bin/env bash
# One runtime.step.* test: plans SPEC for the tiny model (every rank), then
# runs every rank's plan for 3 steps on real Gloo under `meshplan run`, each
# rank checking its shards against a single-process reference
# (unittests/Runtime/StepCheck.cpp).
#
#   step-check.sh BIN_DIR SPEC NPROC [runtime-step-check flags...]
set -euo pipefail
bin=$1 spec=$2 nproc=$3
shift 3
plans=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-step-check-XXXXXX")
trap 'rm -rf "$plans"' EXIT
"$bin/meshplan" plan --spec "$spec" --model tiny --all -o "$plans/plans" >/dev/null
"$bin/meshplan" run -n "$nproc" --timeout 30 -- \
  "$bin/runtime-step-check" --plans "$plans/plans" --steps 3 "$@"
