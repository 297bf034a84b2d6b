#!/usr/bin/env bash
# Runs one libFuzzer target over its seed corpus for a set time and prints a
# one-line summary; exits non-zero on any finding (crash, sanitizer report,
# leak, timeout, out-of-memory).
#
#   run-fuzzer.sh [--work DIR] [--artifacts DIR] FUZZER SEED_DIR SECONDS [FLAG...]
#
# New inputs go to the work corpus (default: a temporary directory removed at
# exit), never into SEED_DIR, so the checked-in corpus stays as it is; a
# persistent --work directory lets `make fuzz` resume where it stopped.
# Findings are written to --artifacts (default: ./fuzz-artifacts/NAME/), and
# kept. Extra FLAGs go to libFuzzer: `make fuzz` adds -fork=1
# -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 so that one finding
# does not end the run (every finding of the set time is kept).
set -euo pipefail

work= artifacts=
while [ $# -gt 0 ]; do
  case $1 in
  --work) work=$2; shift 2 ;;
  --artifacts) artifacts=$2; shift 2 ;;
  *) break ;;
  esac
done
if [ $# -lt 3 ]; then
  echo "usage: run-fuzzer.sh [--work DIR] [--artifacts DIR] FUZZER SEED_DIR SECONDS [FLAG...]" >&2
  exit 2
fi
fuzzer=$1 seeds=$2 seconds=$3
shift 3
name=$(basename "$fuzzer")
name=${name#fuzz-}
here=$(cd "$(dirname "$0")" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-fuzz-$name-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -z "$work" ]; then
  work=$tmp/corpus
fi
artifacts=${artifacts:-$PWD/fuzz-artifacts/$name}
mkdir -p "$work" "$artifacts"

# The same sanitizer settings as the asan test preset, when run by hand.
# allow_user_poisoning=0: LLVM's allocators, inlined into instrumented code,
# poison memory that the uninstrumented libMLIR.so then writes
# (docs/reliability.md).
export ASAN_OPTIONS=${ASAN_OPTIONS:-allow_user_poisoning=0:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/../scripts/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

dict=()
if [ -f "$here/dict/$name.dict" ]; then
  dict=(-dict="$here/dict/$name.dict")
fi

# -timeout: one input taking this long is a finding. The limits of
# docs/limits.md bound a command to about a second in a Release build at the
# limit (a listing of 2^22 numbers, 2^22 placement checks); the sanitizers
# and the coverage instrumentation cost 10-40x, and the targets run their
# own round-trip checks on top, so an input at a limit takes 4-12 s of CPU
# here (docs/reliability.md, "Results"). 30 s of wall time keeps those
# from being reported on a loaded machine while a hang still is.
# -rss_limit_mb / -malloc_limit_mb: an input that makes meshplan allocate
# 2 GiB is a finding too (docs/limits.md: limits are checked before any
# allocation whose size depends on the input).
log=$tmp/log
before=$(ls -A "$artifacts" | wc -l)
start=$SECONDS
set +e
"$fuzzer" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" "$@" \
  "$work" "$seeds" >"$log" 2>&1
rc=$?
set -e
secs=$((SECONDS - start))

# The last status line: "#N ... cov: C ft: F corp: K/..." (or, with -fork,
# "#N: cov: C ft: F corp: K ..."); runs from -print_final_stats when there.
last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
runs=${runs:-$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")}
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
found=$(($(ls -A "$artifacts" | wc -l) - before))
if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
  # The report itself (the sanitizer's or libFuzzer's), then the summary.
  grep -vE '^#[0-9]+|^ *NEW_FUNC' "$log" | tail -80 >&2
  [ "$rc" -ne 0 ] || rc=1
fi
echo "fuzz-$name: ${runs:-?} runs in ${secs}s, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, findings: $([ "$found" -eq 0 ] && echo none || echo "$found in $artifacts")"
exit "$rc"
