#!/usr/bin/env bash
# runtime.ft.launcher: `meshplan run --fault-tolerant` with real processes and
# a real (private) redis-server (docs/fault-tolerance.md, "Launcher").
#
# Usage: fault-tolerant.sh MESHPLAN FTLAUNCHRANK
#
# 1. 3 replica groups x 2 ranks, rank 2 (group 1) kills itself with signal 9
#    at step 3: the launcher names it, stops rank 3, restarts group 1 with
#    MESHPLAN_FT_INCARNATION=1, prints the first quorum, the lost and the
#    joined epoch, and exits 0; groups 0 and 2 are started exactly once.
# 2. --max-restarts 0, --min-replicas 3: the same kill ends the job with
#    "quorum cannot be met", exit 1, and no rank or redis-server left behind.
# 2b. Two launchers (--nnodes 2, one group each, a Redis store here): node 1's
#    group lost with --max-restarts 0 stops the job (1 of 2 is no majority);
#    a launcher started into that job later is refused with the reason.
# 3. SIGTERM to the launcher: forwarded, nothing restarted, exit 143.
# 4. Bad flags: one line each, exit 2, nothing started.
# Exit 77 (skipped) where redis-server is not installed.
set -u
meshplan=$1 rank=$2
if [ ! -x /usr/bin/redis-server ] && [ ! -x /usr/local/bin/redis-server ]; then
  echo "SKIP: redis-server is not installed (Debian's package redis-server)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-ftl-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
check() { # check DESCRIPTION COMMAND...
  if "${@:2}"; then
    echo "ok: $1"
  else
    echo "FAIL: $1"
    failures=$((failures + 1))
  fi
}
has() { grep -qF -- "$2" "$1"; }
lines() { grep -cF -- "$2" "$1"; }
# Everything a case started must be gone: the ranks (by the pids they
# logged) and the private redis-server (by its port).
nothing_left() {
  local dir=$1 pid port
  for pid in $(sed -n 's/^start .* pid \([0-9]*\) .*/\1/p' "$dir"/rank-*.log); do
    if kill -0 "$pid" 2>/dev/null; then
      echo "  pid $pid is still alive"
      return 1
    fi
  done
  port=$(sed -n 's/.*store redis:\/\/127.0.0.1:\([0-9]*\)$/\1/p' "$dir"/rank-0.log | head -1)
  [ -n "$port" ] || { echo "  no store port logged"; return 1; }
  if pgrep -f "redis-server 127.0.0.1:$port" >/dev/null; then
    echo "  redis-server on port $port is still running"
    return 1
  fi
  return 0
}

# --- 1. A group restarted while the others run on ---------------------------
d=$work/restart
mkdir -p "$d"
start=$(date +%s.%N)
timeout 60 "$meshplan" run -n 6 --fault-tolerant --heartbeat-ms 1000 --grace 2 \
  -- "$rank" --ranks-per-group 2 --steps 12 --step-ms 150 \
  --kill-rank 2 --kill-step 3 --log "$d" >"$d/out" 2>"$d/err"
code=$?
echo "case 1: launcher exit $code after $(echo "$(date +%s.%N) - $start" | bc) s"
sed 's/^/  | /' "$d/err"
check "restart: the launcher exits 0" test "$code" -eq 0
check "restart: names the killed rank" has "$d/err" "meshplan run: rank 2 exited with signal 9"
check "restart: stops rank 3" has "$d/err" "rank 3 exited with signal 15 (SIGTERM) (stopped by the launcher)"
check "restart: restarts replica 1" has "$d/err" "meshplan run: replica 1 restarted (incarnation 1): ranks 2, 3"
check "restart: first quorum" has "$d/err" "meshplan run: epoch 1: replicas 0, 1, 2 live; 3 of 3 live"
check "restart: the loss" grep -qE "meshplan run: epoch [0-9]+: replica 1 lost \(rank 2 exited with signal 9\); 2 of 3 live" "$d/err"
check "restart: the rejoin" grep -qE "meshplan run: epoch [0-9]+: replica 1 joined; 3 of 3 live" "$d/err"
lost_line=$(grep -nE "replica 1 lost" "$d/err" | head -1 | cut -d: -f1)
joined_line=$(grep -nE "replica 1 joined" "$d/err" | head -1 | cut -d: -f1)
check "restart: lost before joined" test "${lost_line:-0}" -gt 0 -a "${joined_line:-0}" -gt "${lost_line:-0}"
for r in 0 1 4 5; do
  check "restart: rank $r started once, incarnation 0, finished" \
    test "$(lines "$d/rank-$r.log" "start rank $r ")" -eq 1 -a \
    "$(lines "$d/rank-$r.log" "incarnation 0 pid")" -eq 1 -a \
    "$(lines "$d/rank-$r.log" "done rank $r incarnation 0")" -eq 1
done
for r in 2 3; do
  check "restart: rank $r started in incarnations 0 and 1, finished in 1" \
    test "$(lines "$d/rank-$r.log" "incarnation 0 pid")" -eq 1 -a \
    "$(lines "$d/rank-$r.log" "incarnation 1 pid")" -eq 1 -a \
    "$(lines "$d/rank-$r.log" "done rank $r incarnation 1")" -eq 1
done
check "restart: nothing left behind" nothing_left "$d"

# --- 2. Out of restarts, below min_replicas: the job stops ------------------
d=$work/quorum
mkdir -p "$d"
timeout 60 "$meshplan" run -n 6 --fault-tolerant --max-restarts 0 \
  --min-replicas 3 --heartbeat-ms 1000 --grace 2 \
  -- "$rank" --ranks-per-group 2 --steps 40 --step-ms 150 \
  --kill-rank 2 --kill-step 3 --log "$d" >"$d/out" 2>"$d/err"
code=$?
echo "case 2: launcher exit $code"
sed 's/^/  | /' "$d/err"
check "quorum: the launcher exits 1" test "$code" -eq 1
check "quorum: names the killed rank" has "$d/err" "meshplan run: rank 2 exited with signal 9"
check "quorum: gives replica 1 up" has "$d/err" "replica 1 failed and has used its 0 restarts"
check "quorum: says why" has "$d/err" "meshplan run: quorum cannot be met: 2 of 3 replica groups remain (replica 1 given up), min_replicas 3; stopping the job"
check "quorum: no rank restarted" test "$(cat "$d"/rank-*.log | grep -c '^start')" -eq 6
check "quorum: nothing left behind" nothing_left "$d"

# --- 2b. Several nodes: a job that could form no quorum is not joined -------
# Two launchers on this host, one replica group each, their Redis store
# started here: node 1's group is lost with --max-restarts 0, so 1 of 2
# groups is no strict majority and node 1's launcher stops the job and
# records why; node 0's is then stopped. A launcher started into that job
# later (a reused --job) is refused with the reason, not joined.
d=$work/nodes
mkdir -p "$d"
source "$(dirname "$0")/../lib/redis.sh"
start_loopback_redis "$(command -v redis-server || echo /usr/local/bin/redis-server)" "$d" ||
  exit 1
port=$REDIS_PORT
trap 'kill "$(cat "$d/redis.pid" 2>/dev/null)" 2>/dev/null; rm -rf "$work"' EXIT
node() { # node K [PREFIX...]: one launcher of the two-node job "stopped"
  local k=$1
  shift
  "$@" "$meshplan" run -n 2 --nnodes 2 --node-rank "$k" --fault-tolerant \
    --store "redis://127.0.0.1:$port" --job stopped --max-restarts 0 \
    --heartbeat-ms 1000 --grace 2 \
    -- "$rank" --ranks-per-group 2 --steps 600 --step-ms 100 \
    --kill-rank 2 --kill-step 3 --log "$d"
}
node 0 >"$d/out0" 2>"$d/err0" &
node0=$!
node 1 timeout 60 >"$d/out1" 2>"$d/err1"
code=$?
kill -TERM "$node0" 2>/dev/null
wait "$node0"
echo "case 2b: node 1's launcher exit $code"
sed 's/^/  | /' "$d/err1"
check "nodes: node 1's launcher exits 1" test "$code" -eq 1
check "nodes: says why" has "$d/err1" "meshplan run: quorum cannot be met: 1 of 2 replica groups remain (replica 1 given up), a strict majority of 2 needs 2; stopping the job"
"$meshplan" run -n 2 --nnodes 2 --node-rank 1 --fault-tolerant \
  --store "redis://127.0.0.1:$port" --job stopped -- touch "$d/started" \
  >"$d/out2" 2>"$d/err2"
code=$?
sed 's/^/  | /' "$d/err2"
check "nodes: a launcher into the stopped job exits 2" test "$code" -eq 2
check "nodes: ... with the reason" has "$d/err2" "meshplan: error: --job: job \"stopped\" already has keys in redis://127.0.0.1:$port and was stopped (quorum cannot be met: 1 of 2 replica groups remain (replica 1 given up), a strict majority of 2 needs 2; a new run needs a new job name)"
check "nodes: ... and starts nothing" test ! -e "$d/started"
kill "$(cat "$d/redis.pid")" 2>/dev/null

# --- 3. A signal to the launcher is forwarded; nothing restarts ------------
d=$work/signal
mkdir -p "$d"
set -m # a background job of a script would start with SIGINT ignored
"$meshplan" run -n 4 --fault-tolerant --grace 2 \
  -- "$rank" --ranks-per-group 2 --steps 200 --step-ms 100 --log "$d" \
  >"$d/out" 2>"$d/err" &
launcher=$!
set +m
for _ in $(seq 200); do
  grep -q "epoch 1:" "$d/err" 2>/dev/null && break
  sleep 0.05
done
kill -TERM "$launcher"
wait "$launcher"
code=$?
echo "case 3: launcher exit $code"
sed 's/^/  | /' "$d/err"
check "signal: exit 143" test "$code" -eq 143
check "signal: forwarded" has "$d/err" "received SIGTERM; stopping the ranks"
check "signal: nothing restarted" test "$(cat "$d"/rank-*.log | grep -c '^start')" -eq 4
check "signal: nothing left behind" nothing_left "$d"

# --- 4. Bad flags ------------------------------------------------------------
bad() { # bad EXPECTED-MESSAGE FLAGS...
  local out err code
  out=$("$meshplan" run -n 2 "${@:2}" -- "$rank" 2>"$work/bad.err")
  code=$?
  err=$(cat "$work/bad.err")
  if [ "$code" -eq 2 ] && [ -z "$out" ] && [ "$(wc -l <"$work/bad.err")" -eq 1 ] &&
    grep -qF -- "$1" "$work/bad.err"; then
    echo "ok: bad flags ${*:2}: $err"
  else
    echo "FAIL: bad flags ${*:2}: exit $code, stderr: $err"
    failures=$((failures + 1))
  fi
}
bad "--max-restarts: must be an integer from 0 to 1000, not \"-1\"" --fault-tolerant --max-restarts -1
bad "--min-replicas: must be an integer from 1 to 65536, not \"0\"" --fault-tolerant --min-replicas 0
bad "--heartbeat-ms: must be an integer from 100 to 3600000, not \"5\"" --fault-tolerant --heartbeat-ms 5
bad "--store: --fault-tolerant keeps the replica groups' membership in Redis" --fault-tolerant --store "file:$work/store"
bad "--store: cannot reach redis://127.0.0.1:1: Connection refused" --fault-tolerant --store redis://127.0.0.1:1
bad "--max-restarts: only with --fault-tolerant" --max-restarts 2
bad "--min-replicas: only with --fault-tolerant" --min-replicas 2
bad "--heartbeat-ms: only with --fault-tolerant" --heartbeat-ms 500
bad "--job: \"a b\" must be 1-128 characters of [A-Za-z0-9._-]" --fault-tolerant --job "a b"
bad "--job: --fault-tolerant with --nnodes 2 needs one job name" --fault-tolerant --nnodes 2 --store redis://127.0.0.1:1
check "bad flags: no store directory left" test ! -e "$work/store"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
