#!/usr/bin/env bash
# trainer.trace: executed-step traces (docs/observability.md). An 8-rank
# FSDP x TP run of the tiny model records steps 2..4 with --trace; then
#   - every rank wrote rank<R>.json, all of one run;
#   - `meshplan trace --merge` writes a Chrome trace with a process per
#     rank, a "steps" track and a track per stream, every collective that ran
#     on every member linked by a flow (s ... f) whose events lie inside
#     their slices, and with --spec the cost model's 8 processes beside them;
#     `-o -` writes the same document to stdout;
#   - `--summary` names a straggler per communicator group and prints waits;
#   - the same run on the host device (the device executor) traces too.
# Bad input, each one located line, exit 2, nothing written: a truncated
# file, files of two runs, a malformed value, a spec of another plan, a
# directory with no trace, --trace-steps outside --steps, a trace format
# version this build does not read, a file named for an incarnation that
# holds a rank without fault tolerance. A missing rank file is a marked gap,
# not an error; a version 1 file (before fault-tolerant traces) reads.
#
#   trace.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-trace-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
spec=$src/examples/specs/fsdp-tp.json
train() { # DIR [flags...]
  local dir=$1
  shift
  "$bin/meshplan" run -n 8 --timeout 120 -- "$bin/meshplan-train" --spec "$spec" \
    --model tiny --steps 5 --batch 2 --seq-len 32 --log-every 5 \
    --trace "$dir" --trace-steps 2:4 "$@" >"$work/train.log" 2>&1 ||
    { cat "$work/train.log" >&2; fail "training with --trace $dir"; }
}
train "$work/a"
for r in 0 1 2 3 4 5 6 7; do
  [[ -s $work/a/rank$r.json ]] || fail "no rank$r.json"
done
[[ -z $(ls "$work/a" | grep -v '^rank[0-7]\.json$') ]] || fail "stray files: $(ls "$work/a")"

"$bin/meshplan" trace --merge "$work/a" -o "$work/merged.json" --spec "$spec" --model tiny \
  >"$work/out" || fail "merge: $(cat "$work/out")"
grep -q "wrote $work/merged.json: 8 of 8 ranks, 3 steps, 8 predicted beside them" "$work/out" ||
  fail "merge said: $(cat "$work/out")"
python3 - "$work/merged.json" <<'PY'
import json, sys
from collections import defaultdict
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
def fail(m):
    sys.exit("FAIL: " + m)
names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
for r in range(8):
    if not names.get(r, "").startswith(f"rank {r}"):
        fail(f"no process for rank {r}: {names}")
    if names.get(8 + r) != f"rank {r} predicted (cost model)":
        fail(f"no prediction for rank {r}: {names}")
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
if "steps" not in threads.values() or "compute" not in threads.values():
    fail(f"tracks: {sorted(set(threads.values()))}")
slices = [e for e in ev if e["ph"] == "X" and e["pid"] < 8]
steps = sorted({e["args"]["step"] for e in slices})
if steps != [2, 3, 4]:
    fail(f"steps traced: {steps}")
coll = [e for e in slices if e["cat"] == "collective"]
if not coll:
    fail("no collective slices")
for e in coll:
    if e["args"].get("waited_for_peers_us", -1) < 0:
        fail(f"collective without a wait: {e}")
# Flows: each chain s (t...) f on distinct ranks, each event inside a slice
# of its own (pid, tid).
by_id = defaultdict(list)
for e in ev:
    if e["ph"] in "stf":
        by_id[e["id"]].append(e)
if not by_id:
    fail("no flow events")
per_track = defaultdict(list)
for e in slices:
    per_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
for i, chain in by_id.items():
    phases = "".join(e["ph"] for e in chain)
    if phases[0] != "s" or phases[-1] != "f" or set(phases[1:-1]) - {"t"}:
        fail(f"flow {i}: phases {phases}")
    if len({e["pid"] for e in chain}) != len(chain):
        fail(f"flow {i} visits a rank twice")
    for e in chain:
        if not any(a <= e["ts"] <= b for a, b in per_track[(e["pid"], e["tid"])]):
            fail(f"flow {i} event outside every slice of its track: {e}")
# 8 ranks: dp_shard groups of 4, tp pairs: each collective instance links all
# of its members.
sizes = sorted({len(c) for c in by_id.values()})
if sizes != [2, 4]:
    fail(f"flow lengths {sizes}, expected tp pairs and dp_shard groups of 4")
if t["otherData"]["missing_ranks"] != []:
    fail("missing ranks reported")
print("merged: %d slices, %d flows" % (len(slices), len(by_id)))
PY
"$bin/meshplan" trace --merge "$work/a" -o - >"$work/stdout.json" || fail "merge -o -"
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$work/stdout.json" || fail "-o - is not JSON"

"$bin/meshplan" trace --summary "$work/a" >"$work/summary" || fail "summary"
cat "$work/summary"
grep -q "8 of 8 ranks traced, steps 2..4" "$work/summary" || fail "summary header"
grep -qE "comm_mesh_dp_shard \[0,2,4,6\]: 11 collectives, .* straggler: rank [0246] \(last in [0-9]+ of 33" \
  "$work/summary" || fail "no dp_shard straggler line"
grep -qE "comm_mesh_tp \[0,1\]: 5 collectives" "$work/summary" || fail "no tp line"

# The device executor (on the host device) records the same way.
train "$work/dev" --host-device
"$bin/meshplan" trace --summary "$work/dev" | grep -q "8 of 8 ranks traced" ||
  fail "host-device trace"

# A gap: rank 5's file missing is marked, not an error.
mkdir "$work/gap" && cp "$work/a"/rank*.json "$work/gap/" && rm "$work/gap/rank5.json"
"$bin/meshplan" trace --summary "$work/gap" | grep -q "GAP: no trace file for ranks \[5\]" ||
  fail "gap not marked"
"$bin/meshplan" trace --merge "$work/gap" -o "$work/gap.json" | grep -q "1 ranks have no trace file: marked" ||
  fail "gap not marked in merge"
grep -q '"rank 5: NO TRACE FILE"' "$work/gap.json" || fail "gap process"

# Bad input.
bad() { # NAME EXPECTED-REGEX COMMAND...
  local name=$1 expected=$2
  shift 2
  rm -f "$work/bad.json"
  if "$@" >"$work/bad.out" 2>&1; then fail "$name: accepted"; fi
  local rc=0
  "$@" >/dev/null 2>&1 || rc=$?
  [[ $rc == 2 ]] || fail "$name: exit $rc"
  grep -qE "$expected" "$work/bad.out" || fail "$name: $(cat "$work/bad.out")"
  [[ $(wc -l <"$work/bad.out") == 1 ]] || fail "$name: more than one line: $(cat "$work/bad.out")"
  [[ ! -e $work/bad.json ]] || fail "$name: wrote a trace"
}
mkdir "$work/trunc" && cp "$work/a"/rank*.json "$work/trunc/"
head -c 3000 "$work/a/rank3.json" >"$work/trunc/rank3.json"
bad truncated "^meshplan: error: --merge: .*/trunc/rank3.json: line 1, column [0-9]+: " \
  "$bin/meshplan" trace --merge "$work/trunc" -o "$work/bad.json"
train "$work/b"
mkdir "$work/mixed" && cp "$work/a"/rank*.json "$work/mixed/" && cp "$work/b/rank6.json" "$work/mixed/"
bad "two runs" "^meshplan: error: --merge: .*/mixed/rank6.json: /run: \"[0-9a-f]{16}\" is another run than .*rank0.json's" \
  "$bin/meshplan" trace --merge "$work/mixed" -o "$work/bad.json"
mkdir "$work/malformed" && cp "$work/a"/rank*.json "$work/malformed/"
python3 - "$work/malformed/rank2.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["steps"][1]["begin_us"][7] = "soon"
json.dump(t, open(sys.argv[1], "w"))
PY
bad malformed "^meshplan: error: --summary: .*/malformed/rank2.json: /steps/1/begin_us/7: expected a number" \
  "$bin/meshplan" trace --summary "$work/malformed"
bad "another plan" "^meshplan: error: --spec: rank 0: the trace was recorded from another plan" \
  "$bin/meshplan" trace --merge "$work/a" -o "$work/bad.json" --spec "$src/examples/specs/fsdp-fp8-3d.json" --model tiny
# A version 1 file (before fault-tolerant traces: no incarnation, epoch or
# commit flag) still reads; a later version and a file under another
# incarnation's name do not.
mkdir "$work/v1" && cp "$work/a"/rank*.json "$work/v1/"
python3 - "$work/v1/rank1.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
assert t["version"] == 2 and "incarnation" not in t and "epoch" not in t["steps"][0]
t["version"] = 1
json.dump(t, open(sys.argv[1], "w"))
PY
"$bin/meshplan" trace --summary "$work/v1" | grep -q "8 of 8 ranks traced, steps 2..4" ||
  fail "a version 1 file did not read"
sed -i 's/"version": *1/"version":3/' "$work/v1/rank1.json"
bad "version 3" "^meshplan: error: --summary: .*/v1/rank1.json: /version: version 3 is not supported \(this build reads 1 to 2\)" \
  "$bin/meshplan" trace --summary "$work/v1"
mkdir "$work/inc" && cp "$work/a"/rank*.json "$work/inc/" && mv "$work/inc/rank4.json" "$work/inc/rank4.inc1.json"
bad "incarnation name" "^meshplan: error: --summary: .*/inc/rank4.inc1.json: /incarnation: the file holds a rank without fault tolerance" \
  "$bin/meshplan" trace --summary "$work/inc"
mkdir "$work/empty"
bad "no trace" "^meshplan: error: --merge: .*/empty: no rank<R>.json trace file" \
  "$bin/meshplan" trace --merge "$work/empty" -o "$work/bad.json"
bad "steps" "^meshplan-train: error: --trace-steps 2:9 ends after --steps 5" \
  "$bin/meshplan-train" --spec "$spec" --model tiny --steps 5 --trace "$work/x" --trace-steps 2:9
[[ ! -e $work/x ]] || fail "--trace-steps error created the directory"
echo "trainer.trace: OK"
