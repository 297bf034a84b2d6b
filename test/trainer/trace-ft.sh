#!/usr/bin/env bash
# trainer.trace.ft: executed-step traces of a fault-tolerant run
# (docs/observability.md, "Fault-tolerant runs"). `meshplan run -n 6
# --fault-tolerant` of the HSDP 3x2 spec (test/trainer/specs/ft-hsdp3x2.json),
# both ranks of replica 1 killed with SIGKILL at step 4, which the launcher
# restarts (incarnation 1); every step is traced. Then:
#   - ranks 0, 1, 4, 5 wrote rank<R>.inc0.json, ranks 2 and 3 one file per
#     incarnation (the killed one's steps before the kill survive it);
#   - the survivors hold step 4 twice: discarded in epoch 1, committed in
#     a later epoch, and every attempt names the fault_tolerant
#     communicator's members in its epoch (the live groups' ranks);
#   - `meshplan trace --merge` marks the discarded attempt (DISCARDED, cat
#     "discarded"), names both incarnations in rank 2's process, and every
#     flow links only ranks of one epoch that are members of the
#     communicator in that epoch (the steps' members in the rank files);
#   - `--summary` counts committed steps only and lists the discarded
#     attempts;
#   - a restarted process with an unknown clock offset is marked in both;
#     a redo in the same epoch as its discarded attempt is a located error.
#
#   trace-ft.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
if ! command -v redis-server >/dev/null; then
  echo "SKIPPED: redis-server is not installed (Debian package redis-server)"
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trace-ft-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# Each rank sleeps before each step so that the restarted group starts,
# plans and joins while the survivors still train (as runtime.ft.trainer).
start=$(date +%s)
"$bin/meshplan" run -n 6 --fault-tolerant --timeout 60 -- env MESHPLAN_TEST_KILL=4:2,3 \
  MESHPLAN_TEST_STEP_DELAY_MS=200 "$bin/meshplan-train" \
  --spec "$src/test/trainer/specs/ft-hsdp3x2.json" --data "$src/docs" --batch 2 \
  --seq-len 32 --log-every 16 --steps 16 --trace "$work/t" --trace-steps 2:16 \
  >"$work/run.log" 2>&1 || { tail -n 30 "$work/run.log" >&2; fail "the fault-tolerant run"; }
echo "run: $(($(date +%s) - start)) s"
grep -E "^meshplan run: (rank 2 exited|epoch)" "$work/run.log"
grep -q "replica 1 joined" "$work/run.log" || fail "replica 1 never rejoined"

ls "$work/t"
expected="rank0.inc0.json rank1.inc0.json rank2.inc0.json rank2.inc1.json rank3.inc0.json rank3.inc1.json rank4.inc0.json rank5.inc0.json"
[[ $(cd "$work/t" && ls | sort | tr '\n' ' ') == "$expected " ]] ||
  fail "files: $(ls "$work/t")"

"$bin/meshplan" trace --merge "$work/t" -o "$work/merged.json" >"$work/out" ||
  fail "merge: $(cat "$work/out")"
cat "$work/out"
grep -qE "wrote $work/merged.json: 6 of 6 ranks \(8 process files\), 15 steps \([1-9][0-9]* discarded attempts\)" \
  "$work/out" || fail "merge said: $(cat "$work/out")"
"$bin/meshplan" trace --summary "$work/t" >"$work/summary" || fail "summary"
cat "$work/summary"
grep -q "6 of 6 ranks traced, steps 2..16" "$work/summary" || fail "summary header"
grep -q "incarnations of restarted ranks: rank 2: 0 1; rank 3: 0 1" "$work/summary" ||
  fail "summary: incarnations"
grep -qE "^discarded attempts \(not counted below\): [1-9].*rank 0 step 4 \(epoch 1, incarnation 0\)" \
  "$work/summary" || fail "summary: rank 0's discarded step 4"

python3 - "$work/t" "$work/merged.json" <<'PY'
import json, os, sys
from collections import defaultdict
tdir, merged = sys.argv[1], sys.argv[2]
def fail(m):
    sys.exit("FAIL: " + m)
files = {}
for name in os.listdir(tdir):
    t = json.load(open(os.path.join(tdir, name)))
    if t["version"] != 2 or not t["fault_tolerant"]:
        fail(f"{name}: version {t['version']}, fault_tolerant {t.get('fault_tolerant')}")
    files[(t["rank"], t["incarnation"])] = t
# The killed ranks: steps 2, 3 before the kill, later steps after the heal.
for r in (2, 3):
    before = [s["step"] for s in files[(r, 0)]["steps"]]
    after = [s["step"] for s in files[(r, 1)]["steps"]]
    if before != [2, 3]:
        fail(f"rank {r} incarnation 0 steps {before}")
    if not after or after[0] <= 4 or after[-1] != 16:
        fail(f"rank {r} incarnation 1 steps {after}")
    if files[(r, 1)]["run"] != files[(0, 0)]["run"]:
        fail("the restarted process has another run nonce")
    if files[(r, 1)]["clock"]["method"] not in ("same host", "incarnation 0's store ping (same host)"):
        fail(f"restarted clock {files[(r, 1)]['clock']}")
# A survivor: step 4 discarded in epoch 1, then committed in a later epoch.
s0 = files[(0, 0)]["steps"]
fours = [(s["epoch"], s["committed"]) for s in s0 if s["step"] == 4]
if len(fours) < 2 or fours[0] != (1, False) or fours[-1][1] is not True or fours[-1][0] <= 1:
    fail(f"rank 0's attempts of step 4: {fours}")
if [s["step"] for s in s0 if s["committed"]] != list(range(2, 17)):
    fail("rank 0's committed steps")
# The fault_tolerant communicators' members per epoch, per process (the
# same communicator id is another group on each shard coordinate).
def members(rank, epoch, comm):
    for (r, inc), t in files.items():
        for st in t["steps"]:
            m = st.get("members", {}).get(comm)
            if r == rank and st["epoch"] == epoch and m is not None:
                return m
    return None
ft_comms = {c for t in files.values() for st in t["steps"] for c in st.get("members", {})}
if ft_comms != {"comm_mesh_dp_replicate"}:
    fail(f"fault_tolerant communicators recorded: {ft_comms}")
c = "comm_mesh_dp_replicate"
if members(0, 1, c) != [0, 2, 4] or members(0, 2, c) != [0, 4] or members(5, 2, c) != [1, 5]:
    fail(f"rank 0's members in epochs 1, 2: {members(0, 1, c)}, {members(0, 2, c)}; rank 5's in 2: {members(5, 2, c)}")
last = files[(2, 1)]["steps"][-1]["epoch"]
if members(2, last, c) != [0, 2, 4] or members(0, last, c) != [0, 2, 4]:
    fail(f"epoch {last}: rank 2 (restarted) and rank 0 disagree or miss a member")
t = json.load(open(merged))
ev = t["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
if "incarnations 0, 1" not in names.get(2, ""):
    fail(f"rank 2's process: {names.get(2)}")
slices = [e for e in ev if e["ph"] == "X"]
disc = [e for e in slices if e["cat"] == "step,discarded"]
if not any(e["pid"] == 0 and e["name"] == "step 4 (epoch 1): DISCARDED" for e in disc):
    fail(f"rank 0's discarded step 4 not marked: {[e['name'] for e in disc]}")
if not any(e["cat"].endswith(",discarded") and e["cat"] != "step,discarded" for e in slices):
    fail("no instruction slice of a discarded attempt")
if t["otherData"]["incarnations"]["2"] != [0, 1] or t["otherData"]["discarded_attempts"] < 1:
    fail(f"otherData {t['otherData']}")
# Flows: every chain's events begin a collective slice of one epoch and one
# step, and its ranks are members of that communicator in that epoch.
start_of = {(e["pid"], e["tid"], e["ts"]): e for e in slices if e["cat"].startswith("collective")}
chains = defaultdict(list)
for e in ev:
    if e["ph"] in "stf":
        chains[e["id"]].append(e)
if not chains:
    fail("no flows")
crossed = 0
for i, chain in chains.items():
    sl = []
    for e in chain:
        s = start_of.get((e["pid"], e["tid"], e["ts"]))
        if s is None:
            fail(f"flow {i}: no collective slice starts at {e}")
        sl.append(s)
    epochs = {(s["args"]["epoch"], s["args"]["step"], s["args"]["comm"]) for s in sl}
    if len(epochs) != 1:
        fail(f"flow {i} links attempts of several epochs/steps: {epochs}")
    (epoch, step, comm), = epochs
    ranks = sorted(e["pid"] for e in chain)
    if comm in ft_comms:
        # The flow's ranks are members of each one's group in that epoch;
        # a committed attempt ran on every member, all traced, so its flow
        # is the whole group. (A discarded one may miss the killed ranks.)
        crossed += 1
        committed = sl[0]["args"]["committed"]
        for r in ranks:
            m = members(r, epoch, comm)
            if m is None or not set(ranks) <= set(m) or (committed and m != ranks):
                fail(f"flow {i} (committed: {committed}): ranks {ranks}, but rank {r}'s {comm} in epoch {epoch} is {m}")
if crossed == 0:
    fail("no flow on a fault_tolerant communicator")
print(f"merged: {len(slices)} slices, {len(chains)} flows ({crossed} on fault_tolerant "
      f"communicators), {len(disc)} discarded step slices")
PY
# A restarted process whose clock could not be aligned (restarted on a host
# where its rank never ran) is marked, not an error; a redo that does not
# come in a later epoch is a located error.
cp -r "$work/t" "$work/u"
python3 - "$work/u/rank2.inc1.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["clock"] = {"offset_seconds": 0, "uncertainty_seconds": 0, "method": "unknown"}
json.dump(t, open(sys.argv[1], "w"))
PY
"$bin/meshplan" trace --summary "$work/u" | grep -q "NOT ALIGNED (restarted on another host than rank 0's): rank 2 incarnation 1" ||
  fail "unknown clock not marked in the summary"
"$bin/meshplan" trace --merge "$work/u" -o "$work/u.json" >/dev/null || fail "merge of an unknown clock"
grep -q '"incarnation 1 (clock unknown: times on its own clock)"' "$work/u.json" ||
  fail "unknown clock not marked in the merged trace"
python3 - "$work/u/rank0.inc0.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
fours = [i for i, s in enumerate(t["steps"]) if s["step"] == 4]
first, k = fours[0], fours[-1]
t["steps"][k]["epoch"] = 1
t["steps"][k]["members"] = t["steps"][first]["members"]
json.dump(t, open(sys.argv[1], "w"))
PY
if "$bin/meshplan" trace --summary "$work/u" >"$work/bad" 2>&1; then fail "a redo in the same epoch was accepted"; fi
grep -qE "^meshplan: error: --summary: .*/u/rank0.inc0.json: /steps/[0-9]+/epoch: step 4 is redone in epoch 1, not after its discarded attempt's epoch 1$" \
  "$work/bad" || fail "redo error: $(cat "$work/bad")"
echo "trainer.trace.ft: OK"
