#!/usr/bin/env bash
# trainer.launch.three-nodes-ft: a node lost from a fault-tolerant job of
# three nodes (docs/runtime.md, "Two nodes"; docs/fault-tolerance.md,
# "Several nodes"). Three network namespaces of this machine stand for
# three nodes: node 0's namespace holds a bridge, and one veth pair from
# each of nodes 1 and 2 ends on it (10.215.x.1, .2, .3/24; nothing leaves
# the machine, nothing is created outside the namespaces). Node 0 hosts the
# Redis store. Each node runs
#   meshplan run -n 2 --nnodes 3 --node-rank K --fault-tolerant
#     --store redis://NODE0:PORT --job J -- meshplan-train ...
# on test/trainer/specs/ft-hsdp3x2.json: three replica groups on the
# managed axis, one per node (ranks 2K, 2K+1), FSDP over 2 inside each.
# Mid-run node 2 is killed (every process in its namespace, its launcher
# included, SIGKILL). Its group is 1 of 3: the other two are a strict
# majority, so nodes 0 and 1 install the next epoch without it, redo the
# step in flight with group 2's share of the batch, and finish:
#  - both survivors' launchers exit 0 and print the epoch that lost
#    replica 2, naming node 2 and its ranks (it ran on another node: what
#    the launcher knows of it is its expired heartbeat and its rank keys);
#  - the ranks' own summary says the last step committed with groups 0, 1;
#  - their final parameters equal the uninterrupted run's bit for bit, real
#    gradients and all (the survivors keep the lost group's share apart and
#    sum the shares in group order: fault-tolerance.md, "Exact sums"), as
#    runtime.ft.trainer case 2 compares in one namespace.
# Then a launcher started into that finished job (its heartbeats expired)
# is refused, exit 2. Last, node 2 is killed at step 4 again and its
# launcher started again from scratch once the survivors have moved on: it
# joins the running job (its ranks at a fresh incarnation, so that they
# never meet their dead predecessors' rendezvous keys), group 2 heals from
# its peers and trains on, and the parameters equal the uninterrupted
# run's bit for bit again. And a node whose launcher starts after the other
# nodes' ranks opened the job joins it at incarnation 0 (before, it was
# refused: the job name "already has keys"), bit for bit again.
#
# Needs root (CAP_NET_ADMIN) for `ip netns` and redis-server: skipped (exit
# 77) with one line where either is missing. Creates and removes everything
# it uses, and removes the namespaces of earlier runs that died.
#
#   three-nodes-ft.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
train=$bin/meshplan-train
spec=$src/test/trainer/specs/ft-hsdp3x2.json
server=$(command -v redis-server || true)
if [[ -z $server ]]; then
  echo "SKIPPED: redis-server is not installed (Debian package redis-server)"
  exit 77
fi
# A run killed by ctest's timeout cannot clean up (SIGKILL skips the trap):
# remove the namespaces of runs whose process is gone (their processes
# first: a namespace whose processes live on is only unnamed by `del`).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mp3n[0-9]+[abc]$' || true); do
  old=${ns#mp3n}
  if ! kill -0 "${old%[abc]}" 2>/dev/null; then
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  fi
done
tag=$$
nss=("mp3n${tag}a" "mp3n${tag}b" "mp3n${tag}c")
if ! ip netns add "${nss[0]}" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here (needs root / CAP_NET_ADMIN)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-three-nodes-XXXXXX")
cleanup() {
  for ns in "${nss[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap too.
trap 'exit 143' TERM
trap 'exit 130' INT
ip netns add "${nss[1]}"
ip netns add "${nss[2]}"
# The addresses live only inside this run's namespaces, so runs side by
# side never collide; the subnet still differs per run for readable logs.
net=10.215.$((tag % 250))
addr=("$net.1" "$net.2" "$net.3")
ip -n "${nss[0]}" link add br0 type bridge
ip -n "${nss[0]}" addr add "${addr[0]}/24" dev br0
for k in 1 2; do
  ip link add "mp3v${tag}$k" netns "${nss[0]}" type veth peer name eth0 netns "${nss[$k]}"
  ip -n "${nss[0]}" link set "mp3v${tag}$k" master br0 up
  ip -n "${nss[$k]}" addr add "${addr[$k]}/24" dev eth0
  ip -n "${nss[$k]}" link set eth0 up
done
ip -n "${nss[0]}" link set br0 up
for ns in "${nss[@]}"; do ip -n "$ns" link set lo up; done

port=6379
# Protected mode refuses non-loopback clients; this server listens only on
# node 0's address on the private bridge.
ip netns exec "${nss[0]}" "$server" --port "$port" --bind "${addr[0]}" --protected-mode no \
  --save '' --appendonly no --daemonize yes --pidfile "$work/redis.pid" \
  --logfile "$work/redis.log"
for k in 1 2; do
  for _ in $(seq 100); do
    ip netns exec "${nss[$k]}" redis-cli -h "${addr[0]}" -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
done
# The trainer's text (docs/ by default) copied once, so that both runs train
# on the same tokens even if the tree changes meanwhile.
cp -r "$src/docs" "$work/data"
steps=30
common=(--spec "$spec" --data "$work/data" --batch 2 --seq-len 32 --steps "$steps")

echo "== uninterrupted (one node, fault tolerance off)"
"$bin/meshplan" run -n 6 --timeout 60 -- "$train" "${common[@]}" --log-every "$steps" \
  --save-params "$work/plain.params" | tail -n 1

declare -a pids
# start_node K JOB: node K's launcher in its namespace, in the background,
# logging to $work/JOB.nodeK.log. Every rank sleeps 150 ms before each step,
# so that a kill lands mid-run and a restarted node (its start-up takes a
# few seconds on a loaded machine) finds the survivors still training.
start_node() {
  local k=$1 job=$2
  ip netns exec "${nss[$k]}" env MESHPLAN_HOSTNAME="${addr[$k]}" \
    MESHPLAN_TEST_STEP_DELAY_MS=150 \
    "$bin/meshplan" run -n 2 --nnodes 3 --node-rank "$k" --timeout 60 \
    --store "redis://${addr[0]}:$port" --fault-tolerant --job "$job$tag" \
    --max-restarts 0 --heartbeat-ms 2000 -- \
    "$train" "${common[@]}" --log-every 1 --save-params "$work/$job.params" \
    >>"$work/$job.node$k.log" 2>&1 &
  pids[$k]=$!
}
# wait_for FILE PATTERN SECONDS: until FILE has a line matching PATTERN.
wait_for() {
  local t=0
  until grep -Eq "$2" "$1"; do
    sleep 0.05
    t=$((t + 1))
    if ((t > $3 * 20)); then
      echo "FAIL: no \"$2\" in $1 within $3 s:" >&2
      tail -n 8 "$1" >&2
      exit 1
    fi
  done
}
# kill_node_2: every process in node 2's namespace (its launcher too).
kill_node_2() {
  for pid in $(ip netns pids "${nss[2]}"); do kill -9 "$pid" 2>/dev/null || true; done
  wait "${pids[2]}" 2>/dev/null || true
}
# finish JOB NODES...: each node's launcher exits 0 within 120 s, or the
# test fails with its log (instead of a silent ctest timeout).
finish() {
  local job=$1 k alive
  shift
  for _ in $(seq 1200); do
    alive=0
    for k in "$@"; do kill -0 "${pids[$k]}" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for k in "$@"; do
    code=0
    if kill -0 "${pids[$k]}" 2>/dev/null; then
      code="still running after 120 s"
    else
      wait "${pids[$k]}" || code=$?
    fi
    if [[ $code != 0 ]]; then
      echo "FAIL: $job: node $k's launcher: $code (want exit 0):" >&2
      tail -n 20 "$work/$job.node$k.log" >&2
      exit 1
    fi
  done
}
# lost_line JOB K: node K's launcher names the lost group, its node and its
# ranks.
lost_line() {
  grep -m 1 -E "^meshplan run: epoch [0-9]+: replica 2 lost \(heartbeat of ranks 4, 5 on node 2 expired\); 2 of 3 live" \
    "$work/$1.node$2.log" || {
    echo "FAIL: $1: node $2's launcher did not report replica 2 lost:" >&2
    grep '^meshplan run' "$work/$1.node$2.log" >&2
    exit 1
  }
}

echo "== three nodes, --fault-tolerant; node 2 killed at step 4"
for k in 0 1 2; do start_node "$k" lost; done
# Node 0's rank 0 at step 4: every group is training in the first epoch.
wait_for "$work/lost.node0.log" '^\[rank 0\] step 4/' 90
kill_node_2
killed=$(date +%s.%N)
finish lost 0 1
echo "nodes 0 and 1 finished $(python3 -c "print(f'{$(date +%s.%N) - $killed:.1f}')") s after node 2 was killed"
grep -m 1 "^meshplan run: epoch 1: " "$work/lost.node0.log"
lost_line lost 0
lost_line lost 1
grep -m 1 -E "^\[rank 0\] fault tolerance: .*committed in epoch [0-9]+ \(replica groups 0, 1 of 3 live\)" \
  "$work/lost.node0.log" || {
  echo "FAIL: rank 0 committed no step with groups 0 and 1 alone:" >&2
  grep 'fault tolerance' "$work/lost.node0.log" >&2
  exit 1
}
grep -q "^\[rank 0\] step $steps/$steps" "$work/lost.node0.log"
"$train" --compare "$work/lost.params" "$work/plain.params" --rtol 0 | head -n 1

echo "== a node started into the finished job is refused"
# Once the last heartbeats have expired (a clean exit leaves them to expire).
for _ in $(seq 200); do
  [[ $(ip netns exec "${nss[0]}" redis-cli -h "${addr[0]}" -p "$port" exists \
       "meshplan:{lost$tag}:hb:0" "meshplan:{lost$tag}:hb:1" "meshplan:{lost$tag}:hb:2") == 0 ]] && break
  sleep 0.05
done
code=0
ip netns exec "${nss[2]}" "$bin/meshplan" run -n 2 --nnodes 3 --node-rank 2 \
  --store "redis://${addr[0]}:$port" --fault-tolerant --job "lost$tag" -- true \
  >"$work/stale.log" 2>&1 || code=$?
if ((code != 2)) || ! grep -q "none of its replica groups is alive" "$work/stale.log"; then
  echo "FAIL: a launcher joining a finished job exited $code (want 2):" >&2
  cat "$work/stale.log" >&2
  exit 1
fi
sed "s/lost$tag/lostTAG/; s/$net/NET/" "$work/stale.log"

echo "== node 2 killed at step 4 and started again: it rejoins and heals"
for k in 0 1 2; do start_node "$k" back; done
wait_for "$work/back.node0.log" '^\[rank 0\] step 4/' 90
kill_node_2
# Once the survivors have moved on without it (the epoch that lost it),
# node 2's launcher starts again from scratch, as after a reboot.
wait_for "$work/back.node0.log" "^meshplan run: epoch [0-9]+: replica 2 lost" 60
start_node 2 back
finish back 0 1 2
grep -m 1 "^meshplan run: joining the running job" "$work/back.node2.log"
for k in 0 1; do
  grep -m 1 -E "^meshplan run: epoch [0-9]+: replica 2 joined; 3 of 3 live" "$work/back.node$k.log" || {
    echo "FAIL: node $k's launcher did not report replica 2 joined:" >&2
    grep '^meshplan run' "$work/back.node$k.log" >&2
    exit 1
  }
done
grep -m 1 -E "^\[rank 4\] fault tolerance: .*replica groups 0, 1, 2 of 3 live\); [0-9]+ steps discarded, 1 heals" \
  "$work/back.node2.log" || {
  echo "FAIL: rank 4 did not heal and commit with all three groups:" >&2
  grep 'fault tolerance\|error' "$work/back.node2.log" >&2
  exit 1
}
"$train" --compare "$work/back.params" "$work/plain.params" --rtol 0 | head -n 1

echo "== node 2 started late, after nodes 0 and 1's ranks opened the job"
for k in 0 1; do start_node "$k" late; done
for _ in $(seq 1200); do
  [[ $(ip netns exec "${nss[0]}" redis-cli -h "${addr[0]}" -p "$port" exists \
       "meshplan:{late$tag}:hb:0") == 1 ]] && break
  sleep 0.05
done
start_node 2 late
finish late 0 1 2
# It joins as a first start: its ranks never ran, so they keep incarnation 0.
grep -m 1 "^meshplan run: joining the running job" "$work/late.node2.log" |
  sed "s/late$tag/lateTAG/"
if grep -q "ran in it before" "$work/late.node2.log"; then
  echo "FAIL: node 2's first start took a restart's incarnation:" >&2
  grep '^meshplan run' "$work/late.node2.log" >&2
  exit 1
fi
"$train" --compare "$work/late.params" "$work/plain.params" --rtol 0 | head -n 1
echo "three nodes: passed"
