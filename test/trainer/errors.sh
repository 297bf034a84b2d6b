#!/usr/bin/env bash
# trainer.errors: meshplan-train refuses bad input with one clear line and a
# non-zero exit (2 for flags and specs, 1 for what fails at run time), and
# writes nothing to stdout.
#
#   errors.sh BIN_DIR SOURCE_DIR
set -uo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trainer-errors-XXXXXX")
trap 'rm -rf "$work"' EXIT
train=$bin/meshplan-train
failures=0

# expect CODE PATTERN -- COMMAND...: exit code CODE, stderr matching PATTERN,
# empty stdout.
expect() {
  local code=$1 pattern=$2
  shift 3
  "$@" >"$work/out" 2>"$work/err"
  local got=$?
  if [[ $got != "$code" ]] || ! grep -qE -- "$pattern" "$work/err" ||
    [[ -s $work/out ]]; then
    echo "FAIL: $*: exit $got (want $code), stderr:" >&2
    cat "$work/err" >&2
    echo "stdout:" >&2
    cat "$work/out" >&2
    failures=$((failures + 1))
  else
    echo "ok: $(head -n 1 "$work/err")"
  fi
}

spec=$src/examples/specs/fsdp-tp.json
expect 2 "--spec is required" -- "$train" --steps 3
expect 2 'unknown flag "--stpes" \(did you mean "--steps"\?\)' -- "$train" --spec "$spec" --stpes 3
expect 2 '--device: expected cpu or cuda, got "gpu"' -- "$train" --spec "$spec" --device gpu
expect 2 '--rtol: expected a number >= 0' -- "$train" --compare a b --rtol -1
# --help lists every flag (CLI11's help, tools/common/CommandLine.h).
# (Captured first: grep -q stops reading early, and under pipefail the
# writer's SIGPIPE would fail the pipe.)
help=$("$train" --help)
if ! grep -q -- "--checkpoint-every" <<<"$help"; then
  echo "FAIL: meshplan-train --help does not list --checkpoint-every" >&2
  failures=$((failures + 1))
fi
# "-" is stdout only where one file is written and stdout is free: the
# directories and the metrics file (stdout carries the step log) refuse it,
# before anything runs.
for flag in --trace --save-params --save-checkpoint --metrics; do
  expect 2 "$flag: writes .*; \"-\" \(standard output\) cannot be one" -- \
    env -C "$work" "$train" --spec "$spec" --steps 1 "$flag" -
  [[ -e $work/- ]] && { echo "FAIL: $flag - made a file named -" >&2; failures=$((failures + 1)); }
done
expect 2 "--steps: expected an integer" -- "$train" --spec "$spec" --steps 0
expect 2 "--batch: expected an integer" -- "$train" --spec "$spec" --batch x
expect 2 "--device-timing needs a device: --device cuda or --host-device" -- \
  "$train" --spec "$spec" --steps 3 --device-timing
expect 2 "--checkpoint-every needs --save-checkpoint DIR" -- \
  "$train" --spec "$spec" --steps 3 --checkpoint-every 2
expect 2 "--checkpoint-every: expected an integer" -- \
  "$train" --spec "$spec" --steps 3 --save-checkpoint /tmp/x --checkpoint-every 0
expect 2 "--resume-after 5 must be below --steps 5" -- \
  "$train" --spec "$spec" --steps 5 --resume-after 5
expect 2 "--data: .*no such file" -- \
  "$train" --spec "$spec" --data "$work/nothing"
expect 2 "--spec: .*nothing.json" -- "$train" --spec "$work/nothing.json"
expect 2 "--model: .*unknown" -- "$train" --spec "$spec" --model llama9
expect 2 "--seq-len 33 must be a multiple of the tensor-parallel degree 2" -- \
  "$train" --spec "$spec" --model tiny --seq-len 33 --reference

# torchtitan's TP plan is what the model implements: another style is refused.
sed 's/"layers.\*.attention.wo", "style": "rowwise"/"layers.*.attention.wo", "style": "colwise"/' \
  "$spec" >"$work/wo-colwise.json"
sed -i "s#\"\\\$schema\": \"[^\"]*\"#\"\$schema\": \"$src/docs/spec.schema.json\"#" \
  "$work/wo-colwise.json"
expect 2 'module "layers.0.attention.wo" is colwise; meshplan-train implements torchtitan' -- \
  "$train" --spec "$work/wo-colwise.json" --model tiny --reference

# Units that split a block: the callbacks run whole blocks.
python3 - "$src/test/runtime/specs/fsdp3-fp8.json" "$work/split-units.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s.pop("$schema", None)
s["data_parallel"]["units"] = [["tok_embeddings"], ["layers.*.attention.**"],
                               ["layers.*.attention_norm", "layers.*.ffn_norm",
                                "layers.*.feed_forward.**", "norm", "output"]]
json.dump(s, open(sys.argv[2], "w"))
PY
expect 2 'FSDP unit "[^"]*" holds [45] of the 9 weights of layers.0; meshplan-train runs whole blocks' -- \
  "$train" --spec "$work/split-units.json" --steps 1 --reference

# A pipeline's stage boundaries carry fp32 or bf16 (test/trainer/specs/
# pp*-bf16.json): a float16 boundary is refused.
python3 - "$src/test/planner/Inputs/pipeline/tiny-interleaved-pp2.json" "$work/pp-fp16.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["mixed_precision"]["param_dtype"] = "float16"
json.dump(s, open(sys.argv[2], "w"))
PY
expect 2 "pipeline_parallel: meshplan-train passes float32 or bfloat16 activations between stages; mixed_precision.param_dtype float16" -- \
  "$train" --spec "$work/pp-fp16.json" --steps 1 --reference

# Outside a launcher: no RANK / MESHPLAN_STORE (a bad environment is bad
# input, exit 2: test/trainer/launchers.sh errors has the others).
expect 2 "RANK.*meshplan run" -- env -u RANK -u MESHPLAN_STORE -u SLURM_PROCID "$train" \
  --spec "$spec" --model tiny --steps 1

# Parameter dumps are untrusted input.
mkdir -p "$work/bad" "$work/good"
printf 'MPDUMP1\n\377\377' >"$work/bad/rank0.bin"
"$train" --spec "$src/test/runtime/specs/fsdp3-fp8.json" --steps 1 --batch 1 \
  --seq-len 8 --reference --save-params "$work/good" >/dev/null
expect 1 "bad/rank0.bin: bad box count" -- "$train" --compare "$work/good" "$work/bad"
expect 1 "empty: No such file or directory" -- "$train" --compare "$work/good" "$work/empty"

if ((failures)); then
  echo "$failures case(s) failed" >&2
  exit 1
fi
