#!/usr/bin/env bash
# trainer.checkpoint-cast: loading into a session with a dtype cast
# (Session::loadCheckpoint's LoadOptions; meshplan-train --dtype-cast,
# --optimizer-state keep|reset; docs/checkpoint-format.md, "Dtype casts").
# An fp32-master run (FSDP 4 x TP 2) saves after 3 steps; a bf16-master,
# stochastic-rounding job (FSDP 8) then
#  - without --dtype-cast refuses to load, naming the flag (exit 1, nothing
#    trained);
#  - with it continues at step 4 and ends bit for bit where the same job
#    ends from the checkpoint `meshplan ckpt reshard --dtype-cast` made
#    (the session's cast and the offline one are the same conversion);
#  - with --optimizer-state reset starts again at step 1 and ends bit for
#    bit where the offline `--optimizer-state reset` checkpoint's run does.
#
#   checkpoint-cast.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-ckpt-cast-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
run() { "$bin/meshplan" run --timeout 120 "$@"; }
train=$bin/meshplan-train
common=(--model tiny --batch 2 --seq-len 32 --log-every 100 --synthetic-grads)
f32=$src/examples/specs/fsdp-tp.json
bf16=$src/examples/specs/fsdp-sr-adamw.json

run -n 8 -- "$train" --spec "$f32" "${common[@]}" --steps 3 --save-checkpoint "$work/f32" |
  grep saved
if run -n 8 -- "$train" --spec "$bf16" "${common[@]}" --steps 5 --load-checkpoint "$work/f32" \
  >"$work/refused" 2>&1; then
  fail "a float32 checkpoint loaded into bfloat16 parameters without --dtype-cast"
fi
grep -q "is float32 in the checkpoint but bfloat16 in the plan .*--dtype-cast" "$work/refused" ||
  fail "refusal: $(cat "$work/refused")"

run -n 8 -- "$train" --spec "$bf16" "${common[@]}" --steps 5 --load-checkpoint "$work/f32" \
  --dtype-cast --save-params "$work/session" | grep -q "continuing at step 4" ||
  fail "--dtype-cast did not continue at step 4"
"$bin/meshplan" ckpt reshard "$work/f32" --spec "$bf16" --model tiny --dtype-cast -o "$work/bf16" |
  grep -q "float32->bfloat16" || fail "reshard --dtype-cast"
run -n 8 -- "$train" --spec "$bf16" "${common[@]}" --steps 5 --load-checkpoint "$work/bf16" \
  --save-params "$work/offline" | grep -q "continuing at step 4"
"$train" --compare "$work/session" "$work/offline" --rtol 0

run -n 8 -- "$train" --spec "$bf16" "${common[@]}" --steps 2 --load-checkpoint "$work/f32" \
  --dtype-cast --optimizer-state reset --save-params "$work/session-reset" |
  grep -q "continuing at step 1" || fail "--optimizer-state reset did not start at step 1"
"$bin/meshplan" ckpt reshard "$work/f32" --spec "$bf16" --model tiny --dtype-cast \
  --optimizer-state reset -o "$work/bf16-reset" >/dev/null
run -n 8 -- "$train" --spec "$bf16" "${common[@]}" --steps 2 --load-checkpoint "$work/bf16-reset" \
  --save-params "$work/offline-reset" | grep -q "continuing at step 1"
"$train" --compare "$work/session-reset" "$work/offline-reset" --rtol 0

# The flags name what they apply to.
if "$train" --spec "$bf16" --dtype-cast 2>"$work/err"; then fail "--dtype-cast alone accepted"; fi
grep -q "^meshplan-train: error: --dtype-cast applies to --load-checkpoint DIR$" "$work/err" ||
  fail "$(cat "$work/err")"
echo "trainer.checkpoint-cast: OK"
