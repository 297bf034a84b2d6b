#!/usr/bin/env bash
# trainer.checkpoint: checkpoints written by the runtime (Session::
# saveCheckpoint, docs/checkpoint-format.md) and loaded by it, through
# meshplan-train:
#  1. same layout, real gradients: 5 steps, save, a fresh job loads and runs
#     5 more = 10 uninterrupted steps, bit for bit (parameters and, through
#     them, the optimizer state and the step counter);
#  2. another layout: 5 steps on FSDP 8 (fsdp-sr-adamw.json), save, load on
#     2 replicas x FSDP 3 x TP 2 (sr-hsdp2x3-tp2.json, uneven shards) and run
#     5 more = 10 uninterrupted steps there, bit for bit (--synthetic-grads
#     makes both layouts' gradients equal, so only the checkpoint and the
#     optimizer can differ);
#  3. a flipped byte in a data file: the load fails, naming the tensor, the
#     file and the byte offset; an edited step in checkpoint.json: the load
#     fails on the metadata checksum.
#  Every checkpoint written records the model's and the spec's fingerprints.
#
#   checkpoint.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-ckpt-XXXXXX")
trap 'rm -rf "$work"' EXIT
run() { "$bin/meshplan" run --timeout 60 "$@"; }
train=$bin/meshplan-train
common=(--batch 2 --seq-len 32 --log-every 100)

echo "== 1. same layout (HSDP 2 x FSDP 3, bf16 stochastic rounding)"
spec=$src/test/runtime/specs/hsdp2x3-sr.json
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 10 --save-params "$work/a" | tail -n 1
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 5 --save-checkpoint "$work/c1" | grep saved
# What it came from is recorded: the model's and the spec's fingerprints
# (the trainer once wrote an empty model fingerprint), and the metadata is
# checksummed (format version 2).
for key in model spec metadata_checksum; do
  grep -Eq "\"$key\": (\{\"name\":\"[^\"]*\",\"fingerprint\":)?\"fnv1a64:[0-9a-f]{16}\"" \
    "$work/c1/checkpoint.json" || {
    echo "FAIL: no $key fingerprint in $work/c1/checkpoint.json:" >&2
    head -n 5 "$work/c1/checkpoint.json" >&2
    exit 1
  }
done
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 10 --load-checkpoint "$work/c1" \
  --save-params "$work/b" | grep loaded
"$train" --compare "$work/a" "$work/b" --rtol 0

echo "== 2. FSDP 8 -> 2 replicas x FSDP 3 x TP 2"
a=$src/examples/specs/fsdp-sr-adamw.json
b=$src/test/trainer/specs/sr-hsdp2x3-tp2.json
run -n 8 -- "$train" --spec "$a" --model tiny "${common[@]}" --synthetic-grads --steps 5 \
  --save-checkpoint "$work/c2" | grep saved
run -n 12 -- "$train" --spec "$b" "${common[@]}" --synthetic-grads --steps 10 \
  --load-checkpoint "$work/c2" --save-params "$work/resumed" | grep loaded
run -n 12 -- "$train" --spec "$b" "${common[@]}" --synthetic-grads --steps 10 \
  --save-params "$work/straight" | tail -n 1
"$train" --compare "$work/resumed" "$work/straight" --rtol 0

echo "== 3. a flipped byte"
file=$(ls "$work/c2"/rank*.data | head -n 1)
python3 - "$file" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) // 2] ^= 0x40
open(path, "wb").write(data)
PY
set +e
run -n 12 -- "$train" --spec "$b" "${common[@]}" --steps 10 --load-checkpoint "$work/c2" \
  >"$work/out" 2>"$work/err"
code=$?
set -e
if [[ $code == 0 ]] || ! grep -q "checksum" "$work/err"; then
  echo "FAIL: a corrupted checkpoint loaded (exit $code):" >&2
  cat "$work/err" >&2
  exit 1
fi
grep -m 1 "checksum" "$work/err"

echo "== an edited step"
sed -i 's/"step":5,/"step":1,/' "$work/c1/checkpoint.json"
grep -q '"step":1,' "$work/c1/checkpoint.json" || { echo "FAIL: the edit" >&2; exit 1; }
set +e
run -n 6 -- "$train" --spec "$spec" "${common[@]}" --steps 10 --load-checkpoint "$work/c1" \
  >"$work/out" 2>"$work/err"
code=$?
set -e
if [[ $code == 0 ]] || ! grep -q "checkpoint.json: /metadata_checksum: the metadata hashes to" "$work/err"; then
  echo "FAIL: metadata with an edited step loaded (exit $code):" >&2
  cat "$work/err" >&2
  exit 1
fi
grep -m 1 "metadata_checksum" "$work/err"
echo "refused, as it should be"
