#!/usr/bin/env bash
# One runtime.step.* test: plans SPEC for the tiny model (every rank), then
# runs every rank's plan for 3 steps on real Gloo under `meshplan run`, each
# rank checking its shards against a single-process reference
# (unittests/Runtime/StepCheck.cpp).
#
#   step-check.sh BIN_DIR SPEC NPROC [runtime-step-check flags...]
#
# With --device host|cuda the plans run through the device executor
# (docs/cuda.md, "Executor on devices").
set -euo pipefail
bin=$1 spec=$2 nproc=$3
shift 3
# On a GPU test (--device cuda), first check that this machine has one: the
# whole test is skipped (77) otherwise, with the reason on stderr.
if [[ " $* " == *" --device cuda"* ]]; then
  probe_store=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-probe-XXXXXX")
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MESHPLAN_STORE="file:$probe_store" \
    "$bin/runtime-step-check" --device cuda --probe || { rc=$?; rm -rf "$probe_store"; exit $rc; }
  rm -rf "$probe_store"
fi
plans=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-step-check-XXXXXX")
trap 'rm -rf "$plans"' EXIT
"$bin/meshplan" plan --spec "$spec" --model tiny --all -o "$plans/plans" >/dev/null
"$bin/meshplan" run -n "$nproc" --timeout 30 -- \
  "$bin/runtime-step-check" --plans "$plans/plans" --steps 3 "$@"
