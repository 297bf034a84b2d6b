#!/usr/bin/env bash
# trainer.launch.signal-save: SIGTERM or SIGINT to `meshplan run` while its
# ranks save a checkpoint after every step (issue 37). Each try stops the
# job at another moment after the first checkpoint is committed; then:
#  - the launcher exits 128 + the signal, every rank gone, no process of
#    the job left (found by the store directory in their environment), the
#    store directory empty;
#  - the checkpoint directory holds a committed checkpoint that `meshplan
#    ckpt verify` accepts, and a staging directory left by the interrupted
#    save (if any) is refused as one.
#
#   signal-save.sh BIN_DIR SOURCE_DIR
set -uo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-signal-save-XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }
source "$(dirname "$0")/../lib/processes.sh"
try=0
for sig in TERM INT TERM; do
  try=$((try + 1))
  dir=$work/try$try
  mkdir -p "$dir/store"
  set -m
  "$bin/meshplan" run -n 4 --store "file:$dir/store" -- "$bin/meshplan-train" \
    --spec "$src/test/trainer/specs/fsdp2-tp2.json" --model tiny --steps 100000 \
    --log-every 1 --save-checkpoint "$dir/ck" --checkpoint-every 1 >"$dir/out" 2>&1 &
  launcher=$!
  set +m
  # The first checkpoint is committed; then a few more steps (one line each),
  # a different number per try, so the signal falls at different moments.
  for _ in $(seq 1200); do
    [[ -e $dir/ck/checkpoint.json ]] && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.05
  done
  lines=$(grep -c '^\[rank 0\] step' "$dir/out")
  for _ in $(seq 1200); do
    (($(grep -c '^\[rank 0\] step' "$dir/out") >= lines + try)) && break
    sleep 0.01
  done
  kill -"$sig" "$launcher"
  wait "$launcher"
  rc=$?
  want=$((128 + $(kill -l "$sig")))
  [[ $rc == "$want" ]] || { fail "try $try (SIG$sig): launcher exit $rc, want $want"; tail -5 "$dir/out"; }
  left=$(job_pids "$dir/store")
  [[ -z $left ]] || { fail "try $try: processes left: $left"; kill -KILL $left 2>/dev/null; }
  [[ -z $(ls -A "$dir/store") ]] || fail "try $try: store files left: $(ls "$dir/store")"
  "$bin/meshplan" ckpt verify "$dir/ck" >"$dir/verify" 2>&1 ||
    fail "try $try: the committed checkpoint does not verify: $(cat "$dir/verify")"
  partial=no
  if [[ -e $dir/.ck.partial ]]; then
    partial=yes
    if "$bin/meshplan" ckpt verify "$dir/.ck.partial" >"$dir/partial" 2>&1; then
      fail "try $try: the interrupted save's staging directory verifies as a checkpoint"
    fi
    grep -q 'not a checkpoint' "$dir/partial" || fail "try $try: $(cat "$dir/partial")"
  fi
  echo "try $try: SIG$sig after $((lines + try)) logged steps: exit $rc, no process left," \
    "store empty, checkpoint verifies, interrupted save left: $partial"
done
if ((failed)); then echo "signal-save: FAILED"; exit 1; fi
echo "signal-save: passed"
