#!/usr/bin/env bash
# runtime.redis-store: the same plan execution with a Redis rendezvous store
# (what several machines use): starts a private redis-server on a free
# loopback port, runs 3 ranks through `meshplan run --store redis://...`, and
# stops the server by its pid.
#
#   redis-store.sh BIN_DIR SPEC(3 ranks, fsdp axis)
set -euo pipefail
bin=$1 spec=$2
command -v redis-server >/dev/null || { echo "redis-server not found (scripts/setup.sh installs it)"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-redis-XXXXXX")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
  --dir "$work" --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 50); do
  grep -q "Ready to accept connections" "$work/redis.log" && break
  sleep 0.1
done
"$bin/meshplan" plan --spec "$spec" --model tiny --all -o "$work/plans" >/dev/null
"$bin/meshplan" run -n 3 --timeout 30 --store "redis://127.0.0.1:$port" -- \
  "$bin/runtime-step-check" --plans "$work/plans" --steps 2 --shard fsdp
