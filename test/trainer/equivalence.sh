#!/usr/bin/env bash
# One trainer.equivalence.* test: trains SPEC for 10 steps on NPROC real
# processes (`meshplan run`, Gloo) and in one process (--reference: the same
# global batch, the TP ranks' order of sums), then compares the final
# parameters: within 1e-5 relative, and the figure is printed (every layout
# tested so far is bit-identical).
#
#   equivalence.sh BIN_DIR SPEC NPROC [meshplan-train flags...]
set -euo pipefail
bin=$1 spec=$2 nproc=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-eq-XXXXXX")
trap 'rm -rf "$work"' EXIT
flags=(--spec "$spec" --steps 10 --batch 2 --seq-len 32 --log-every 5 "$@")
"$bin/meshplan" run -n "$nproc" --timeout 60 -- \
  "$bin/meshplan-train" "${flags[@]}" --save-params "$work/ranks" | tail -n 2
"$bin/meshplan-train" "${flags[@]}" --reference --save-params "$work/one" | tail -n 1
"$bin/meshplan-train" --compare "$work/ranks" "$work/one" --rtol 1e-5
