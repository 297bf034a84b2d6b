#!/usr/bin/env bash
# runtime.ft.partition: a replica group cut off by the network, not killed
# (docs/fault-tolerance.md, "A partitioned group"). The three replica groups
# of test/trainer/specs/ft-hsdp3x2.json run in three network namespaces of
# this machine, joined by veth pairs on a bridge (10.213.x.0/24; nothing
# leaves the machine); Redis listens on the bridge. Mid-run the link of
# group 1 is taken down: its peers' collectives with it get no reset, only
# silence. The survivors must not wait for the collective timeout (60 s
# here): group 1's heartbeat expires (2 s), a survivor's watcher installs
# the next epoch and aborts the blocked collective, the step is discarded
# and redone without group 1. The link comes back a few steps later: group
# 1 sees the new epoch, rejoins, heals from its peers and trains on. Every
# rank exits 0 and the parameters equal an uninterrupted run (bit for bit
# under --synthetic-grads).
#
# Needs root (CAP_NET_ADMIN) for `ip netns`; skipped with a line saying so
# where that is not allowed. Creates and removes everything it uses.
#
#   fault-tolerance-partition.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
train=$bin/meshplan-train
spec=$src/test/trainer/specs/ft-hsdp3x2.json
server=$(command -v redis-server || true)
if [[ -z $server ]]; then
  echo "SKIPPED: redis-server is not installed (Debian package redis-server)"
  exit 0
fi
# A run killed by ctest's timeout cannot clean up (SIGKILL skips the trap):
# remove the namespaces, bridges and veths of runs whose process is gone, so
# that a stale bridge never holds this run's subnet.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mpft[0-9]+g[0-9]$' || true); do
  old=${ns#mpft}
  kill -0 "${old%g*}" 2>/dev/null || ip netns del "$ns" 2>/dev/null || true
done
for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
              grep -E '^mp(br[0-9]+|v[0-9]+g[0-9])$' || true); do
  old=${link#mpbr}
  old=${old#mpv}
  kill -0 "${old%g*}" 2>/dev/null || ip link del "$link" 2>/dev/null || true
done
tag=$$
net=10.213.$((tag % 200 + 20))
bridge=mpbr$tag
if ! ip netns add "mpft${tag}g0" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here (needs root / CAP_NET_ADMIN)"
  exit 0
fi
ip netns del "mpft${tag}g0"
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-ftnet-XXXXXX")
cleanup() {
  pkill -9 -f "$work/" 2>/dev/null || true
  [[ -s $work/redis.pid ]] && kill "$(cat "$work/redis.pid")" 2>/dev/null || true
  for g in 0 1 2; do
    ip netns del "mpft${tag}g$g" 2>/dev/null || true
    ip link del "mpv${tag}g$g" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

ip link add "$bridge" type bridge
ip addr add "$net.1/24" dev "$bridge"
ip link set "$bridge" up
for g in 0 1 2; do
  ns=mpft${tag}g$g
  ip netns add "$ns"
  ip link add "mpv${tag}g$g" type veth peer name eth0 netns "$ns"
  ip link set "mpv${tag}g$g" master "$bridge" up
  ip -n "$ns" addr add "$net.$((g + 10))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Protected mode refuses non-loopback clients; this server listens only on
# the test's private bridge.
"$server" --port "$port" --bind "$net.1" --protected-mode no --save '' --appendonly no \
  --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log"
for _ in $(seq 50); do
  redis-cli -h "$net.1" -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
cp -r "$src/docs" "$work/data"
common=(--spec "$spec" --data "$work/data" --batch 2 --seq-len 32 --steps 60
        --synthetic-grads)

echo "== uninterrupted"
"$bin/meshplan" run -n 6 --timeout 60 -- "$train" "${common[@]}" --log-every 60 \
  --save-params "$work/plain.params" | tail -n 1

echo "== group 1's link down at step 6, up again at step 12"
mkdir -p "$work/store"
declare -a pids
for r in 0 1 2 3 4 5; do
  g=$((r / 2))
  ip netns exec "mpft${tag}g$g" env RANK=$r WORLD_SIZE=6 LOCAL_RANK=$r \
    MESHPLAN_TIMEOUT=60 MESHPLAN_STORE="file:$work/store" MESHPLAN_JOB=net \
    MESHPLAN_HOSTNAME="$net.$((g + 10))" MESHPLAN_FT_STORE="redis://$net.1:$port" \
    "$train" "${common[@]}" --log-every 1 --save-params "$work/net.params" \
    >"$work/r$r.log" 2>&1 &
  pids[$r]=$!
done
wait_for() { # wait_for FILE PATTERN SECONDS
  local t=0
  until grep -q "$2" "$1"; do
    sleep 0.05
    t=$((t + 1))
    if ((t > $3 * 20)); then
      echo "FAIL: no \"$2\" in $1 within $3 s:" >&2
      tail -n 5 "$1" >&2
      exit 1
    fi
  done
}
wait_for "$work/r0.log" "^step 6/60" 60
ip link set "mpv${tag}g1" down
cut=$(date +%s.%N)
wait_for "$work/r0.log" "replica groups 0, 2 of 3 live" 30
echo "survivors committed without group 1 $(python3 -c "print(f'{$(date +%s.%N) - $cut:.1f}')") s after the cut (collective timeout 60 s)"
wait_for "$work/r0.log" "^step 12/60" 60
ip link set "mpv${tag}g1" up
# Every rank finishes within 150 s, or the test fails with their logs
# (instead of a silent ctest timeout).
for _ in $(seq 1500); do
  alive=0
  for r in 0 1 2 3 4 5; do kill -0 "${pids[$r]}" 2>/dev/null && alive=1; done
  ((alive)) || break
  sleep 0.1
done
if ((alive)); then
  echo "FAIL: ranks still running 150 s after the link came back:" >&2
  for r in 0 1 2 3 4 5; do echo "-- rank $r" >&2; tail -n 4 "$work/r$r.log" >&2; done
  exit 1
fi
for r in 0 1 2 3 4 5; do
  if ! wait "${pids[$r]}"; then
    echo "FAIL: rank $r failed:" >&2
    tail -n 5 "$work/r$r.log" >&2
    exit 1
  fi
done
grep -h "^fault tolerance" "$work/r0.log" "$work/r2.log"
grep -Eq "replica groups 0, 1, 2 of 3 live\); [0-9]+ steps discarded, 1 heals" "$work/r2.log"
"$train" --compare "$work/net.params" "$work/plain.params" --rtol 0 | head -n 1
echo "partition: passed"
