#!/usr/bin/env bash
# runtime.failures: failures are errors, never hangs.
#  1. A rank killed mid-step (torchrun-style start, no launcher): every other
#     rank exits non-zero within the timeout with an error naming the
#     communicator, the instruction and the collective number.
#  2. The same under `meshplan run`: the launcher names the dead rank.
#  3. Refused plans and settings: one line on stderr, a non-zero exit, fast.
#  4. Plans verify rejects: a clear error on every rank, never an abort.
#
#   failures.sh BIN_DIR SPEC(3 ranks, fsdp axis)
set -uo pipefail
bin=$1 spec=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-failures-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$bin/meshplan" plan --spec "$spec" --model tiny --all -o "$work/plans" >/dev/null || exit 1
check="$bin/runtime-step-check"
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# 1. Kill rank 1 in step 2's first backward; ranks 0 and 2 must report.
mkdir "$work/store"
start=$(date +%s)
pids=()
for r in 0 1 2; do
  RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r MESHPLAN_STORE="file:$work/store" MESHPLAN_TIMEOUT=10 \
    timeout 60 "$check" --plans "$work/plans" --shard fsdp --kill-rank 1 --kill-step 2 \
    >"$work/out$r" 2>"$work/err$r" &
  pids+=($!)
done
for r in 0 1 2; do wait "${pids[$r]}"; echo $? >"$work/rc$r"; done
elapsed=$(( $(date +%s) - start ))
[[ $(cat "$work/rc1") == 137 ]] || fail "rank 1 should have died by SIGKILL (rc $(cat "$work/rc1"))"
for r in 0 2; do
  rc=$(cat "$work/rc$r")
  [[ $rc != 0 && $rc != 124 ]] || fail "rank $r: exit $rc (expected an error exit, not 0 or a hang)"
  grep -q 'on communicator "comm_mesh_fsdp"' "$work/err$r" || fail "rank $r (exit $rc): error does not name the communicator: $(cat "$work/err$r")"
  grep -q 'collective #[0-9]* of step 2' "$work/err$r" || fail "rank $r: error does not number the collective: $(cat "$work/err$r")"
  grep -q 'instruction "i[0-9]*" (' "$work/err$r" || fail "rank $r: error does not name the instruction: $(cat "$work/err$r")"
  # ... and the dead rank itself, not only the peer's address (issue 34).
  grep -qE 'rank 1(, rank [0-9]+)* ha(s|ve) not arrived and reported nothing' "$work/err$r" || fail "rank $r: error does not name the dead rank 1: $(cat "$work/err$r")"
  echo "survivor rank $r: $(cat "$work/err$r")"
done
(( elapsed <= 30 )) || fail "the survivors took ${elapsed}s (timeout 10s)"

# 2. Under the launcher.
timeout 60 "$bin/meshplan" run -n 3 --timeout 10 -- "$check" --plans "$work/plans" --shard fsdp \
  --kill-rank 1 --kill-step 2 >"$work/launch.out" 2>"$work/launch.err"
rc=$?
[[ $rc != 0 && $rc != 124 ]] || fail "meshplan run: exit $rc"
grep -q 'rank 1 was killed by signal 9' "$work/launch.err" || fail "launcher does not name rank 1: $(cat "$work/launch.err")"

# 3. Refused before any rendezvous.
refuse() { # expected-substring env... -- args...
  local want=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  env -i PATH="$PATH" "${envs[@]}" timeout 20 "$check" "$@" >"$work/r.out" 2>"$work/r.err"
  local rc=$?
  [[ $rc != 0 && $rc != 124 ]] || fail "[$want] exit $rc"
  [[ $(wc -l <"$work/r.err") == 1 ]] || fail "[$want] expected one line on stderr: $(cat "$work/r.err")"
  grep -qF -- "$want" "$work/r.err" || fail "[$want] not in: $(cat "$work/r.err")"
  [[ ! -s "$work/r.out" ]] || fail "[$want] wrote to stdout"
}
store="MESHPLAN_STORE=file:$work/store-refused"
mkdir "$work/store-refused"
refuse "the plan is for rank 0, but this process is rank 1" RANK=1 WORLD_SIZE=3 "$store" -- --plans "$work/plans/rank0.json"
refuse "the plan's mesh has 3 ranks, but WORLD_SIZE is 4" RANK=0 WORLD_SIZE=4 "$store" -- --plans "$work/plans"
refuse "RANK is not set" WORLD_SIZE=3 "$store" -- --plans "$work/plans"
refuse "MESHPLAN_STORE is not set" RANK=0 WORLD_SIZE=3 -- --plans "$work/plans"
refuse "expected file:DIR, redis://HOST:PORT or tcp://HOST:PORT" RANK=0 WORLD_SIZE=3 MESHPLAN_STORE=ftp://x -- --plans "$work/plans"
refuse "MESHPLAN_TIMEOUT" RANK=0 WORLD_SIZE=3 "$store" MESHPLAN_TIMEOUT=-1 -- --plans "$work/plans"
refuse "MESHPLAN_REDUCTION_ORDER=\"fast\": expected" RANK=0 WORLD_SIZE=3 "$store" MESHPLAN_REDUCTION_ORDER=fast -- --plans "$work/plans"
sed 's/"version": 2/"version": 1/' "$work/plans/rank0.json" >"$work/v1.json"
refuse "/version: unsupported plan version 1" RANK=0 WORLD_SIZE=3 "$store" -- --plans "$work/v1.json"
sed '0,/"count":\([0-9]*\)/s//"count":7/' "$work/plans/rank0.json" >"$work/count.json"
refuse "count 7, but its buffers pack to" RANK=0 WORLD_SIZE=3 "$store" -- --plans "$work/count.json"
refuse "No such file" RANK=0 WORLD_SIZE=3 "$store" -- --plans "$work/nope.json"

# 4. Plans `meshplan verify` rejects, given to the runtime: every member
# fails at once when the communicator is created, naming it, the collective
# and the field (before: an all-gather of another size ended in
# gloo::EnforceNotMet on Gloo's thread, std::terminate, SIGABRT); a
# communicator naming a rank outside the world is refused at open with the
# plan file and field.
edit() { # NAME PYTHON-BODY(p: rank 0's plan)
  cp -r "$work/plans" "$work/$1"
  python3 -c "import json,sys
p=json.load(open(sys.argv[1]))
prog=p['program']
def at(i): return [k for k,x in enumerate(prog) if x['id']==i][0]
$2
json.dump(p,open(sys.argv[1],'w'))" "$work/$1/rank0.json"
}
edit swap "a,b=at('i4'),at('i15'); prog[a],prog[b]=prog[b],prog[a]"
edit dtype "prog[at('i4')]['dtype']='float32'"
edit ranks "p['communicators'][0]['ranks']=[0,1,5]"
run_edit() { # NAME EXPECTED...
  local name=$1; shift
  local t0=$(date +%s)
  timeout 60 "$bin/meshplan" run -n 3 --timeout 10 -- "$check" --plans "$work/$name" --steps 2 \
    >"$work/$name.out" 2>"$work/$name.err"
  local rc=$? took=$(( $(date +%s) - t0 ))
  [[ $rc == 1 ]] || fail "[$name] exit $rc (expected 1: a rank's error)"
  ! grep -q 'signal 6\|SIGABRT\|terminate called' "$work/$name.err" || fail "[$name] a rank aborted: $(cat "$work/$name.err")"
  (( took < 10 )) || fail "[$name] took ${took}s (the timeout is 10 s: it must fail fast)"
  for want in "$@"; do
    grep -qF -- "$want" "$work/$name.err" || fail "[$name] \"$want\" not in: $(cat "$work/$name.err")"
  done
  echo "edited plan $name: exit $rc in ${took}s: $(grep -m1 'runtime-step-check' "$work/$name.err" | cut -c1-400)"
}
# Whichever rank reports first speaks: rank 0 (the edited plan) or another.
run_edit swap 'the plans of communicator "comm_mesh_fsdp" (ranks [0,1,2]) disagree' \
  "collective #2 on it, instruction" 'bfloat16 count=44' 'bfloat16 count=5504'
run_edit dtype 'the plans of communicator "comm_mesh_fsdp" (ranks [0,1,2]) disagree' \
  "collective #2 on it, instruction" 'all_gather bfloat16 count=5504' 'all_gather float32 count=5504'
run_edit ranks 'rank0.json: /communicators/0/ranks/2: rank 5 is not in the mesh (ranks 0..2)'

if (( failed )); then echo "runtime.failures: FAILED"; exit 1; fi
echo "runtime.failures: all checks passed (survivors reported in ${elapsed}s)"
