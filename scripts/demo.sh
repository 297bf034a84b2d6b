#!/usr/bin/env bash
# The README's main job: plan a training step from an example spec (every
# rank's plan, verified across ranks, and explain's summary), execute the
# plans of the same spec for the tiny model on 8 real processes, train the
# tiny model with meshplan-train and compare it with one process, train a
# plain torch Llama under the same spec from Python (meshplan.torch) and
# compare meshplan.torch with torch's FSDP2, then walk
# through the failures that motivate meshplan (see docs/architecture.md),
# each run through the `meshplan` CLI.
set -euo pipefail
MESHPLAN=${1:-build/bin/meshplan}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() {
  printf '$ meshplan'
  printf " '%s'" "$@" | sed "s/ '\(--[a-z]*\)'/ \1/g"
  printf '\n'
  "$MESHPLAN" "$@"
}
# A command that must be refused: show the message and check exit code 2.
refused() {
  printf '$ meshplan'
  printf " '%s'" "$@" | sed "s/ '\(--[a-z]*\)'/ \1/g"
  printf '\n'
  set +e
  "$MESHPLAN" "$@"
  local code=$?
  set -e
  if [ "$code" -ne 2 ]; then
    echo "demo: expected exit code 2, got $code" >&2
    exit 1
  fi
  echo "(refused with exit code 2, as it should be)"
}

OUT=${2:-build/demo}
SPEC=examples/specs/fsdp-fp8-3d.json
step "0. Plan a training step: llama3-8b, HSDP on (ddp, fsdp) x an extra axis, float8 all-gather"
mkdir -p "$OUT"
run plan --spec "$SPEC" --all -o "$OUT/plans" --progress never --timings
echo
run explain --spec "$SPEC" --rank 5
echo
echo "The plans on disk verify on their own, as a runtime would check them:"
run verify "$OUT/plans"
run trace --spec "$SPEC" --rank 5 -o "$OUT/trace.json"
echo
echo "The same spec for the tiny model, executed: 8 processes on real Gloo run every rank's plan"
echo "for 3 steps; each rank checks every shard after every step against a single-process reference:"
rm -rf "$OUT/tiny-plans"
run plan --spec "$SPEC" --model tiny --all -o "$OUT/tiny-plans" --progress never
run run -n 8 --timeout 60 -- "$(dirname "$MESHPLAN")/runtime-step-check" --plans "$OUT/tiny-plans" \
  --replicate ddp --shard fsdp
echo
echo "Train the tiny model with those plans: meshplan-train (examples/trainer) on 8 processes,"
echo "then the same global batch in one process; the final parameters must agree:"
TRAIN="$(dirname "$MESHPLAN")/meshplan-train"
rm -rf "$OUT/train-ranks" "$OUT/train-one"
rm -rf "$OUT/trace-ranks"
run run -n 8 --timeout 60 -- "$TRAIN" --spec "$SPEC" --model tiny --steps 30 --log-every 5 \
  --save-params "$OUT/train-ranks" --metrics "$OUT/metrics-cpp.jsonl" \
  --trace "$OUT/trace-ranks" --trace-steps 2:4
echo "$ meshplan-train --spec $SPEC --model tiny --steps 30 --reference ..."
"$TRAIN" --spec "$SPEC" --model tiny --steps 30 --log-every 10 --reference \
  --save-params "$OUT/train-one"
echo "$ meshplan-train --compare $OUT/train-ranks $OUT/train-one"
"$TRAIN" --compare "$OUT/train-ranks" "$OUT/train-one"
echo
echo "The same spec on a plain torch module (examples/torch/llama.py) from Python: meshplan.torch"
echo "runs each FSDP unit's forward and backward through autograd on the plan's gathered views:"
PY=${PYTHON:-.venv/bin/python}
run run -n 8 --timeout 120 -- "$PY" examples/torch/train.py --spec "$SPEC" --model tiny \
  --steps 30 --log-every 5 --metrics "$OUT/metrics-torch.jsonl"
echo
echo "What the two runs did (docs/observability.md): the C++ trainer recorded steps 2..4 of every"
echo "rank; merged into one Perfetto trace with the cost model's prediction beside it, and summarized;"
echo "both runs wrote a metrics line per step, drawn side by side:"
run trace --merge "$OUT/trace-ranks" -o "$OUT/executed-trace.json" --spec "$SPEC" --model tiny
run trace --summary "$OUT/trace-ranks"
echo "$ python -m meshplan.plot ... -o $OUT/loss.png"
"$PY" -m meshplan.plot "$OUT/metrics-cpp.jsonl" "$OUT/metrics-torch.jsonl" \
  --label "meshplan-train (C++)" --label "meshplan.torch (Python)" \
  --title "tiny Llama, $SPEC, 8 ranks" -o "$OUT/loss.png"
echo
echo "And against torch's own FSDP2 (fully_shard over Gloo) on the same model, init and data,"
echo "10 steps, FSDP 8 and HSDP 2x4 in float32 (float64 gives the scale of float32 noise):"
cat > "$OUT/torch-fsdp8.json" <<'JSON'
{"model": "torch", "world_size": 8, "mesh": {"axes": [{"name": "fsdp", "size": 8}]},
 "data_parallel": {"shard_axes": ["fsdp"]},
 "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}
JSON
cat > "$OUT/torch-hsdp2x4.json" <<'JSON'
{"model": "torch", "world_size": 8,
 "mesh": {"axes": [{"name": "ddp", "size": 2}, {"name": "fsdp", "size": 4}]},
 "data_parallel": {"replicate_axes": ["ddp"], "shard_axes": ["fsdp"]},
 "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}
JSON
run run -n 8 --timeout 300 -- "$PY" examples/torch/compare_fsdp2.py --steps 10 \
  --spec "$OUT/torch-fsdp8.json" --spec "$OUT/torch-hsdp2x4.json"
echo
echo "A spec with a typo is refused with the JSON pointer, and nothing is written:"
mkdir -p "$OUT"
sed 's/"tensorwise"/"tensorwsie"/' "$SPEC" > "$OUT/typo.json"
refused plan --spec "$OUT/typo.json" --all -o "$OUT/typo-plans"
test ! -e "$OUT/typo-plans" || { echo "demo: partial output" >&2; exit 1; }

step "1. A submesh of a submesh (torch: 'Cannot create a submesh from a submesh')"
echo "FSDP + float8 on a 3-D mesh (ddp, fsdp, abcd) = (2, 2, 2) needs the fsdp"
echo "groups of the (ddp, fsdp) submesh: the amax all-reduce runs over them."
run mesh --mesh ddp=2,fsdp=2,abcd=2 --view 'slice(ddp,fsdp).slice(fsdp)'

step "2. Flattening a fault-tolerant (managed) mesh (torchtitan: 'list.remove(x): x not in list')"
echo "dp_replicate is managed: its live replicas are known only at run time."
run mesh --mesh dp_replicate=3,dp_shard=2,tp=2 --managed dp_replicate \
  --view 'slice(dp_replicate,dp_shard).flatten(dp_replicate,dp_shard as dp)'
echo
echo "Replica 1 has failed; the live members (0, 2) resolve the groups:"
run mesh --mesh dp_replicate=3,dp_shard=2,tp=2 --managed dp_replicate \
  --live dp_replicate=0,2 --view 'flatten(dp_replicate,dp_shard as dp)'

step "3. FSDP2 + TP offsets ('2D state_dict is under development')"
echo "TP shards rows over tp, then FSDP2 chunks each TP shard over dp; DTensor"
echo "labels it [_StridedShard(0, sf=2), Shard(0)]. Uneven: 15 rows on (dp=4, tp=2)."
run layout --mesh dp=4,tp=2 --shape 15,5 \
  --placements '_StridedShard(dim=0, sf=2), Shard(dim=0)'
echo
echo "FSDP2 on a flattened dp mesh chunks once over the whole group: 5 rows on 4 ranks"
echo "are torch.chunk(5, 4) = 2,2,1,0, not 3,2 chunked again:"
run layout --mesh dp_replicate=2,dp_shard=2 --view 'flatten(dp_replicate,dp_shard as dp)' \
  --shape 5,8 --placements 'Shard(0)'
echo
echo "A placement list that gives a rank two pieces is refused, not mis-reported:"
refused layout --mesh dp=3,tp=2 --shape 12 --placements 'Shard(0), _StridedShard(0, 2)'

step "4. Redistribution planned from the layouts"
echo "Unshard the FSDP dim of an FSDP x TP weight for the forward pass (bf16):"
run redistribute --mesh dp=4,tp=2 --shape 4096,1024 \
  --from 'SS(0,2),S(0)' --to 'R,S(0)' --dtype bf16
echo
echo "Reduce-scatter a gradient that is partial over dp into the FSDP x TP layout:"
run redistribute --mesh dp=4,tp=2 --shape 4096,1024 \
  --from '[{tp},{}] partial(sum)={dp}' --to '[{tp,dp},{}]'
echo
echo "Axis reorder {dp,tp} -> {tp,dp}: one permute, each rank sends its shard to one peer:"
run redistribute --mesh dp=4,tp=2 --shape 4096,1024 \
  --from '[{dp,tp},{}]' --to '[{tp,dp},{}]'

step "demo finished: every motivating case above ran through core"
