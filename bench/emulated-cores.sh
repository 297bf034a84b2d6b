#!/usr/bin/env bash
# Runs N ranks under `meshplan run`, each capped at a fixed share of one CPU
# by the kernel's CFS bandwidth control, so that N ranks on a machine with
# fewer cores behave as N slower cores would: a rank never runs faster
# because another rank is idle (a pipeline stage waiting in its bubble would
# otherwise hand its core to the other stages, and the measured bubble would
# say more about the scheduler than about the schedule). docs/pipeline.md,
# "Measured bubble".
#
#   bench/emulated-cores.sh --cpu F -n N [--period-us P] -- PROGRAM ARGS
#
# F: each rank's share of one CPU (0 < F <= 1; N * F should stay below the
# machine's cores, leaving room for the launcher and the kernel). Every
# thread of a rank (Gloo's I/O thread, the executor's workers) draws on its
# rank's share. P: the accounting period (default 20000 us); a rank runs at
# most F * P in each period.
#
# Needs root and the cgroup "cpu" controller (cgroup v2 with cpu.max, or
# v1's cpu.cfs_quota_us); says so and exits 2 otherwise. The groups are
# removed on exit.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
meshplan="${MESHPLAN:-$here/build/bin/meshplan}"

usage() {
  echo "usage: $0 --cpu F -n N [--period-us P] -- PROGRAM ARGS" >&2
  exit 2
}

# Inside a rank: join its group, then become the program.
if [[ "${1:-}" == "--join" ]]; then
  dir="$2"
  shift 2
  [[ "${1:-}" == "--" ]] && shift
  echo $$ >"$dir/rank${RANK:?RANK is not set}/cgroup.procs"
  exec "$@"
fi

cpu="" ranks="" period=20000
while [[ $# -gt 0 ]]; do
  case "$1" in
  --cpu) cpu="${2:-}"; shift 2 ;;
  -n) ranks="${2:-}"; shift 2 ;;
  --period-us) period="${2:-}"; shift 2 ;;
  --) shift; break ;;
  *) usage ;;
  esac
done
[[ $# -gt 0 && -n "$cpu" && -n "$ranks" ]] || usage
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || { echo "$0: -n: not a positive integer: $ranks" >&2; exit 2; }
[[ "$period" =~ ^[1-9][0-9]*$ && "$period" -ge 1000 && "$period" -le 1000000 ]] ||
  { echo "$0: --period-us: not an integer in 1000..1000000: $period" >&2; exit 2; }
quota=$(awk -v f="$cpu" -v p="$period" 'BEGIN {
  if (f !~ /^[0-9]*\.?[0-9]+$/ || f <= 0 || f > 1) exit 1; q = int(f * p + 0.5);
  if (q < 1000) q = 1000; print q }') ||
  { echo "$0: --cpu: not a share of one CPU in (0, 1]: $cpu" >&2; exit 2; }
[[ -x "$meshplan" ]] || { echo "$0: $meshplan is not built (cmake --build --preset default)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "$0: needs root to create cgroups" >&2; exit 2; }

# cgroup v2 (cpu.max) where the cpu controller is enabled there, else v1.
if [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
  root=/sys/fs/cgroup/meshplan-emulated-$$
  mkdir "$root"
  echo +cpu >"$root/cgroup.subtree_control"
  limit() { echo "$quota $period" >"$1/cpu.max"; }
elif [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
  root=/sys/fs/cgroup/cpu/meshplan-emulated-$$
  mkdir "$root"
  limit() { echo "$period" >"$1/cpu.cfs_period_us"; echo "$quota" >"$1/cpu.cfs_quota_us"; }
else
  echo "$0: no cgroup cpu controller (neither /sys/fs/cgroup/cgroup.controllers with cpu nor /sys/fs/cgroup/cpu)" >&2
  exit 2
fi
cleanup() {
  for ((r = 0; r < ranks; ++r)); do rmdir "$root/rank$r" 2>/dev/null || true; done
  rmdir "$root" 2>/dev/null || true
}
trap cleanup EXIT
for ((r = 0; r < ranks; ++r)); do
  mkdir "$root/rank$r"
  limit "$root/rank$r"
done
echo "emulated-cores: $ranks ranks, each at most $quota us of CPU per $period us ($(nproc) cores here)" >&2
"$meshplan" run -n "$ranks" -- "$0" --join "$root" -- "$@"
