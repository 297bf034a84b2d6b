#!/usr/bin/env bash
# trainer.checkpoint.pipeline: checkpoints of pipelined layouts (issue 16,
# docs/pipeline.md "Checkpoints"). Each pp coordinate's ranks hold only their
# stages' tensors; the plan's mesh names the pipeline axis, so the owner rule
# (docs/checkpoint-format.md, "Who writes what") does not treat it as a
# replicate axis and every stage's tensors are written, once.
#  1. PP -> flat: 5 steps under PP 2 x FSDP 2 x TP 2 (8 ranks), save; load
#     under FSDP 2 x TP 2 (4 ranks, no pipeline) and run 5 more = 10
#     uninterrupted steps there, bit for bit (--synthetic-grads makes the
#     layouts' gradients equal, so only the checkpoint and the optimizer can
#     differ);
#  2. flat -> PP: 5 steps flat, save; load under PP 4 (1F1B) and run 5 more =
#     10 uninterrupted PP 4 steps, bit for bit;
#  3. offline, byte-exact: reshard the PP checkpoint of 1 to the flat layout
#     and back (meshplan ckpt reshard), and the runtime's own flat save of 1;
#     all export to the same safetensors bytes as the original.
#
#   checkpoint-pipeline.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-ckpt-pp-XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
run() { "$bin/meshplan" run --timeout 60 "$@"; }
train=$bin/meshplan-train
specs=$src/test/trainer/specs
pp=$specs/pp2-fsdp2-tp2.json flat=$specs/fsdp2-tp2-6l.json pp4=$specs/pp4-1f1b.json
common=(--batch 2 --seq-len 32 --log-every 100 --synthetic-grads)

echo "== 1. PP 2 x FSDP 2 x TP 2 -> FSDP 2 x TP 2"
run -n 8 -- "$train" --spec "$pp" "${common[@]}" --steps 5 --save-checkpoint "$work/pp5" | grep saved
"$bin/meshplan" ckpt verify "$work/pp5"
run -n 4 -- "$train" --spec "$flat" "${common[@]}" --steps 10 --load-checkpoint "$work/pp5" \
  --save-params "$work/resumed" --save-checkpoint "$work/flat10" | grep -E "loaded|saved"
run -n 4 -- "$train" --spec "$flat" "${common[@]}" --steps 10 --save-params "$work/straight" \
  | tail -n 1
"$train" --compare "$work/resumed" "$work/straight" --rtol 0

echo "== 2. FSDP 2 x TP 2 -> PP 4 (1F1B)"
run -n 4 -- "$train" --spec "$flat" "${common[@]}" --steps 5 --save-checkpoint "$work/flat5" \
  | grep saved
run -n 4 -- "$train" --spec "$pp4" "${common[@]}" --steps 10 --load-checkpoint "$work/flat5" \
  --save-params "$work/pp-resumed" | grep loaded
run -n 4 -- "$train" --spec "$pp4" "${common[@]}" --steps 10 --save-params "$work/pp-straight" \
  | tail -n 1
"$train" --compare "$work/pp-resumed" "$work/pp-straight" --rtol 0

echo "== 3. PP -> flat -> PP offline, byte-exact"
"$bin/meshplan" ckpt reshard "$work/pp5" --spec "$flat" -o "$work/pp5-flat"
"$bin/meshplan" ckpt reshard "$work/pp5-flat" --spec "$pp" -o "$work/pp5-back"
"$bin/meshplan" ckpt inspect "$work/pp5-back" | grep "written by"
# The same layout writes the same boxes in the same order: every data file
# (parameters and optimizer state) equal byte for byte.
for f in "$work"/pp5/rank*.data; do
  cmp "$f" "$work/pp5-back/$(basename "$f")"
done
# The flat checkpoint's whole tensors: safetensors data sections equal (the
# JSON headers differ in the spec they name).
for c in pp5 pp5-flat; do
  "$bin/meshplan" ckpt export "$work/$c" -o "$work/$c.safetensors"
done
python3 - "$work/pp5.safetensors" "$work/pp5-flat.safetensors" <<'PY'
import struct, sys
def data(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8 + n:]
a, b = (data(p) for p in sys.argv[1:])
assert a == b and len(a) > 0, "the exported tensors differ"
PY
echo "PP -> flat -> PP: every data file and every exported tensor byte-identical"
