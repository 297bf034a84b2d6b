#!/usr/bin/env bash
# trainer.bubble: `meshplan-train --cost-model` under a pipeline prints the
# measured bubble per pp coordinate next to the cost model's (each step
# replayed through the plans, then the median times, then the plan's flops)
# and the textbook formula, with a measured / model ratio that is a positive
# number (docs/pipeline.md, "Measured bubble"). The figures themselves
# depend on the machine; their shape and their sanity do not: every bubble
# is a percentage in [0, 100), the replayed model's step lies within a
# factor of 2 of the measured one, and the measured dispatch latency is a
# number of milliseconds >= 0 that lengthens the replayed step (the model
# without it is printed beside it).
#
#   bubble.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
out=$("$bin/meshplan" run -n 2 -- "$bin/meshplan-train" \
  --spec "$src/test/trainer/specs/bubble-pp2-1f1b.json" --steps 3 \
  --batch 2 --cost-model 2>&1)
fail() {
  echo "FAIL: $1" >&2
  echo "$out" >&2
  exit 1
}
measured=$(grep -E "pipeline bubble \(1f1b, p 2, m 8, v 1;" <<<"$out") ||
  fail "no measured bubble line"
replay=$(grep -E "cost model replaying each step" <<<"$out") ||
  fail "no replayed model line"
grep -qE "cost model with the median cost of every local instruction" <<<"$out" ||
  fail "no median-time model line"
grep -qE "cost model with the plan's flops" <<<"$out" || fail "no flops model line"
grep -qE "textbook \(p-1\)/\(m\+p-1\) = 11\.1%" <<<"$out" || fail "no textbook line"
pct='([0-9]+\.[0-9])% ([0-9]+\.[0-9])%, mean ([0-9]+\.[0-9])% \(step ([0-9.]+) ms\)'
[[ $measured =~ measured\ $pct ]] || fail "measured line: $measured"
m_step=${BASH_REMATCH[4]}
for v in "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"; do
  awk -v v="$v" 'BEGIN { exit !(v >= 0 && v < 100) }' || fail "measured bubble $v%"
done
[[ $replay =~ :\ $pct\;\ measured\ /\ model\ ([0-9]+\.[0-9]+) ]] ||
  fail "replay line: $replay"
r_step=${BASH_REMATCH[4]} ratio=${BASH_REMATCH[5]}
for v in "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"; do
  awk -v v="$v" 'BEGIN { exit !(v >= 0 && v < 100) }' || fail "model bubble $v%"
done
awk -v r="$ratio" 'BEGIN { exit !(r > 0) }' || fail "ratio $ratio"
[[ $replay =~ dispatch\ latency\ after\ it\ is\ ready,\ median\ ([0-9]+\.[0-9]+)\ ms ]] ||
  fail "no dispatch latency in the replay line: $replay"
dispatch=${BASH_REMATCH[1]}
[[ $replay =~ without\ the\ dispatch\ latency:\ mean\ ([0-9]+\.[0-9])%\ \(step\ ([0-9.]+)\ ms\) ]] ||
  fail "no replay without the dispatch latency: $replay"
awk -v a="${BASH_REMATCH[2]}" -v b="$r_step" 'BEGIN { exit !(a <= b) }' ||
  fail "the dispatch latency shortened the replayed step (${BASH_REMATCH[2]} ms without, $r_step ms with)"
awk -v a="$m_step" -v b="$r_step" 'BEGIN { exit !(b > a / 2 && b < a * 2) }' ||
  fail "replayed step $r_step ms against measured $m_step ms"
echo "ok: measured / model $ratio (steps: measured $m_step ms, model $r_step ms; dispatch $dispatch ms)"
