#!/usr/bin/env bash
# Runs the benchmark programs of an already-built tree and prints their
# summaries. Builds nothing: `make bench` (or
# `cmake --build build --target bench-core-queries`) builds first.
#
#   bench/run.sh [BUILD_DIR] [extra Google Benchmark flags...]
#
# BUILD_DIR defaults to "build". Extra flags go to every program, e.g.
#   bench/run.sh build --benchmark_repetitions=9 --benchmark_min_time=0.2
# Exit status is non-zero when a program reports FAIL (a query, or a plan
# instantiation, whose time grows with the world size by more than 2x).
set -euo pipefail

build_dir=${1:-build}
shift || true

status=0
for name in bench-core-queries bench-plan-instantiate bench-propagation bench-planner \
  bench-pipeline bench-tune bench-runtime-kernels; do
  program="$build_dir/bin/$name"
  if [[ ! -x "$program" ]]; then
    echo "run.sh: $program not found; build it first:" >&2
    echo "  cmake --build $build_dir -j2 --target $name" >&2
    exit 2
  fi
  echo "== $program $*"
  "$program" "$@" || status=$?
done
# Forks its own 4 ranks and takes no Google Benchmark flags.
program="$build_dir/bin/bench-runtime-collectives"
if [[ -x "$program" ]]; then
  echo "== $program"
  "$program" || status=$?
fi
# Forks its own 4 ranks; writes about 2 GiB under /tmp (deleted after).
program="$build_dir/bin/bench-checkpoint"
if [[ -x "$program" ]]; then
  echo "== $program"
  "$program" || status=$?
fi
# Forks its own ranks (up to 6) and a private redis-server; skips (77) without
# /usr/bin/redis-server; about 5 GiB of memory at its peak (the heal of 1 GiB).
program="$build_dir/bin/bench-fault-tolerance"
if [[ -x "$program" ]]; then
  echo "== $program"
  rc=0
  "$program" || rc=$?
  if [[ $rc -ne 0 && $rc -ne 77 ]]; then status=$rc; fi
fi
# Starts meshplan-train on 8 processes itself (build/bin/meshplan-train).
program="$build_dir/bin/bench-trainer"
if [[ -x "$program" ]]; then
  echo "== $program"
  "$program" || status=$?
fi
exit "$status"
