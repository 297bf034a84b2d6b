#!/usr/bin/env bash
# trainer.optimizer-step.<case>: the optimizer step of a real run (docs/
# trainer.md, "The optimizer step") on real processes against --reference.
# SPEC's optimizer gets torchtitan's recipe scaled to 10 steps: a linear
# warmup over 3 steps, cosine decay to 0.1x, the global gradient norm
# clipped to 0.05 (small enough to clip every step of the tiny model) and
# no weight decay on the norms and the embedding. Checks that every step
# clipped, that the runs are equal to the single process (bit-identical so
# far), and with NAN_STEP=S that a NaN gradient at step S skips that update
# on every rank alike and says so, and that a run resumed in a fresh
# session after step 6 continues the schedule (the same bits).
#
#   optimizer-step.sh BIN_DIR SPEC NPROC NAN_STEP [meshplan-train flags...]
#
# NAN_STEP 0 poisons nothing; NORM_TYPE=inf in the environment clips the inf
# norm instead. The sweep over every trainer spec:
# test/trainer/optimizer-step-sweep.sh.
set -euo pipefail
bin=$1 spec=$2 nproc=$3 nan_step=$4
shift 4
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-opt-XXXXXX")
trap 'rm -rf "$work"' EXIT

# The spec with the recipe merged into its optimizer (its dtype, stochastic
# rounding and seed kept); a model path made absolute.
python3 - "$spec" "$work/spec.json" <<'PY'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
spec = json.load(open(src))
spec.pop("$schema", None)
model = spec["model"]
if "/" in model or model.endswith(".json"):
    spec["model"] = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(src)), model))
opt = spec.setdefault("optimizer", {})
opt.update({
    "lr": 3e-3,
    "weight_decay": 0.1,
    "lr_schedule": {"warmup_steps": 3, "decay_type": "cosine", "min_lr_factor": 0.1},
    "max_norm": 0.05,
    "no_decay": ["**norm", "tok_embeddings"],
})
# NORM_TYPE=inf: the largest magnitude, clipped to 0.002 (also every step).
if os.environ.get("NORM_TYPE") == "inf":
    opt.update({"norm_type": "inf", "max_norm": 0.002})
json.dump(spec, open(dst, "w"), indent=1)
PY

flags=(--spec "$work/spec.json" --steps 10 --batch 2 --seq-len 32 --log-every 1 "$@")
export MESHPLAN_TEST_NAN_GRAD_STEP=$nan_step
"$bin/meshplan" run -n "$nproc" --timeout 60 -- \
  "$bin/meshplan-train" "${flags[@]}" --save-params "$work/ranks" >"$work/out"
grep -E '^(\[rank [0-9]+\] )?step (1|10)/10 ' "$work/out" || true
# Every step reports its norm and a coefficient below 1 (it clipped), except
# a poisoned one, which says that every rank skipped it.
clipped=$(grep -cE 'step [0-9]+/10 .* grad norm [0-9.e+-]+ \(clip 0\.[0-9]+' "$work/out" || true)
want=10
if [[ $nan_step != 0 ]]; then
  want=9
  grep -E "step $nan_step: gradient norm nan is not finite; the update was skipped on every rank" "$work/out" ||
    { echo "FAIL: no skipped update reported at step $nan_step" >&2; cat "$work/out" >&2; exit 1; }
fi
if [[ $clipped != "$want" ]]; then
  echo "FAIL: $clipped of 10 steps clipped (want $want):" >&2
  cat "$work/out" >&2
  exit 1
fi
"$bin/meshplan-train" "${flags[@]}" --reference --save-params "$work/one" | tail -n 1
"$bin/meshplan-train" --compare "$work/ranks" "$work/one" --rtol 1e-5
if [[ $nan_step != 0 ]]; then
  # A fresh session after step 6 (new communicators, the shards carried
  # over) continues the schedule at step 7: the same bits as one session.
  "$bin/meshplan" run -n "$nproc" --timeout 60 -- \
    "$bin/meshplan-train" "${flags[@]}" --resume-after 6 --save-params "$work/resumed" >/dev/null
  "$bin/meshplan-train" --compare "$work/resumed" "$work/ranks" --rtol 0 |
    sed 's/^/resumed after step 6: /'
fi
