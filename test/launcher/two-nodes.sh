#!/usr/bin/env bash
# trainer.launch.two-nodes: a real two-node job (docs/runtime.md, "Two
# nodes"). Two network namespaces of this machine stand for two nodes,
# joined by one veth pair (10.214.x.1 and .2/30; nothing leaves the
# machine); node 0 hosts the Redis store. Each node runs
#   meshplan run -n 4 --nnodes 2 --node-rank K --store redis://NODE0:PORT
# and meshplan-train on test/trainer/specs/hsdp2-fsdp2-tp2.json: one replica
# per node (HSDP across the nodes), FSDP 2 x TP 2 inside each node.
#  1. The final parameters equal the one-process reference bit for bit;
#     again with torchrun on each node instead (--nnodes 2 --node-rank K
#     --master-addr NODE0: the ranks meet in torchrun's c10d store on node
#     0, no MESHPLAN_STORE), where PYTHON has torch.
#  2. Node 1 killed mid-run (every process in its namespace, SIGKILL): node
#     0's launcher stops the job, exit 1, with a line naming the rank that
#     failed, the peer (node 1's address) it lost, and a dead rank with its
#     node ("rank 5 (node 1) ... reported nothing").
#
# Needs root (CAP_NET_ADMIN) for `ip netns` and redis-server: skipped (exit
# 77) with one line where either is missing. Creates and removes everything
# it uses.
#
#   two-nodes.sh BIN_DIR SOURCE_DIR [PYTHON]
set -euo pipefail
bin=$1 src=$2 python=${3:-python3}
train=$bin/meshplan-train
spec=$src/test/trainer/specs/hsdp2-fsdp2-tp2.json
server=$(command -v redis-server || true)
if [[ -z $server ]]; then
  echo "SKIPPED: redis-server is not installed (Debian package redis-server)"
  exit 77
fi
# A run killed by ctest's timeout cannot clean up (SIGKILL skips the trap):
# remove the namespaces of runs whose process is gone.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mp2n[0-9]+[ab]$' || true); do
  old=${ns#mp2n}
  kill -0 "${old%[ab]}" 2>/dev/null || ip netns del "$ns" 2>/dev/null || true
done
tag=$$
if ! ip netns add "mp2n${tag}a" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here (needs root / CAP_NET_ADMIN)"
  exit 77
fi
ip netns add "mp2n${tag}b"
net=10.214.$((tag % 250))
node0=$net.$((4 * (tag / 250 % 60) + 1))
node1=${node0%.*}.$((${node0##*.} + 1))
work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-two-nodes-XXXXXX")
cleanup() {
  for ns in "mp2n${tag}a" "mp2n${tag}b"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
# The veth pair: one end in each namespace (deleting a namespace deletes
# its end, and with it the pair).
ip link add "mp2v${tag}" netns "mp2n${tag}a" type veth peer name "mp2w${tag}" netns "mp2n${tag}b"
ip -n "mp2n${tag}a" addr add "$node0/30" dev "mp2v${tag}"
ip -n "mp2n${tag}b" addr add "$node1/30" dev "mp2w${tag}"
for ns in "mp2n${tag}a" "mp2n${tag}b"; do
  ip -n "$ns" link set lo up
done
ip -n "mp2n${tag}a" link set "mp2v${tag}" up
ip -n "mp2n${tag}b" link set "mp2w${tag}" up

port=6379
# Protected mode refuses non-loopback clients; this server listens only on
# node 0's end of the private link.
ip netns exec "mp2n${tag}a" "$server" --port "$port" --bind "$node0" --protected-mode no \
  --save '' --appendonly no --daemonize yes --pidfile "$work/redis.pid" \
  --logfile "$work/redis.log"
for _ in $(seq 50); do
  ip netns exec "mp2n${tag}b" redis-cli -h "$node0" -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done

# node K JOB LOG [LAUNCHER FLAGS... --] TRAINER FLAGS...: `meshplan run` for
# node K in its namespace, in the background; the ranks reach their peers at
# the node's own address.
node() {
  local k=$1 job=$2 log=$3
  shift 3
  local launcher=()
  if [[ $* == *" -- "* ]]; then
    while [[ $1 != -- ]]; do launcher+=("$1"); shift; done
    shift
  fi
  local ns=mp2n${tag}a addr=$node0
  if ((k == 1)); then ns=mp2n${tag}b addr=$node1; fi
  ip netns exec "$ns" env MESHPLAN_HOSTNAME="$addr" MESHPLAN_JOB="$job" \
    "$bin/meshplan" run -n 4 --nnodes 2 --node-rank "$k" \
    --store "redis://$node0:$port" --master-addr "$node0" --master-port 29500 \
    --timeout "${timeout:-60}" "${launcher[@]}" -- "$train" --spec "${spec_override:-$spec}" \
    --batch 2 --seq-len 32 "$@" >"$log" 2>&1 &
}

# kill_node_1_after LOG STEP: once node 0's rank 0 logged STEP, kill every
# process in node 1's namespace; prints nothing.
kill_node_1_after() {
  for _ in $(seq 1200); do
    grep -q "^\[rank 0\] step $2/" "$1" && break
    sleep 0.05
  done
  grep -q "^\[rank 0\] step $2/" "$1" || {
    echo "FAIL: no step $2 within 60 s:" >&2
    cat "$1" >&2
    exit 1
  }
  for pid in $(ip netns pids "mp2n${tag}b"); do kill -9 "$pid" 2>/dev/null || true; done
}

echo "== two nodes x 4 ranks against the one-process reference"
"$train" --spec "$spec" --batch 2 --seq-len 32 --steps 6 --log-every 6 --reference \
  --save-params "$work/one.params" | tail -n 1
node 0 equal "$work/node0.log" --steps 6 --log-every 2 --save-params "$work/two.params"
p0=$!
node 1 equal "$work/node1.log" --steps 6 --log-every 2 --save-params "$work/two.params"
p1=$!
for k in 0 1; do
  pid=$p0
  ((k == 0)) || pid=$p1
  if ! wait "$pid"; then
    echo "FAIL: node $k:" >&2
    cat "$work/node$k.log" >&2
    exit 1
  fi
done
grep '^\[rank 0\] step 6' "$work/node0.log"
"$train" --compare "$work/two.params" "$work/one.params" --rtol 0 | head -n 1

echo "== the same under torchrun on each node (its store on node 0), no MESHPLAN_STORE"
if "$python" -c 'import torch.distributed.run' 2>/dev/null; then
  for k in 0 1; do
    ns=mp2n${tag}a addr=$node0
    if ((k == 1)); then ns=mp2n${tag}b addr=$node1; fi
    ip netns exec "$ns" env -u MESHPLAN_STORE MESHPLAN_HOSTNAME="$addr" MESHPLAN_TIMEOUT=60 \
      "$python" -m torch.distributed.run --nnodes 2 --node-rank "$k" --nproc-per-node 4 \
      --master-addr "$node0" --master-port 29400 --no-python "$train" --spec "$spec" \
      --batch 2 --seq-len 32 --steps 6 --log-every 6 --save-params "$work/torchrun.params" \
      >"$work/torchrun$k.log" 2>&1 &
    pids[$k]=$!
  done
  for k in 0 1; do
    if ! wait "${pids[$k]}"; then
      echo "FAIL: torchrun on node $k:" >&2
      grep -v '^\[W' "$work/torchrun$k.log" | tail -n 20 >&2
      exit 1
    fi
  done
  "$train" --compare "$work/torchrun.params" "$work/one.params" --rtol 0 | head -n 1
else
  echo "(skipped: $python has no torch)"
fi

echo "== node 1 killed mid-run"
node 0 kill "$work/kill0.log" --steps 400 --log-every 1
p0=$!
node 1 kill "$work/kill1.log" --steps 400 --log-every 1
p1=$!
kill_node_1_after "$work/kill0.log" 3
killed=$(date +%s.%N)
wait "$p1" 2>/dev/null || true
code=0
wait "$p0" || code=$?
took=$(python3 -c "print(f'{$(date +%s.%N) - $killed:.1f}')")
if ((code != 1)); then
  echo "FAIL: node 0's meshplan run exited $code (want 1):" >&2
  tail -n 20 "$work/kill0.log" >&2
  exit 1
fi
# The rank that saw the loss first, naming the peer's address (node 1),
# and the launcher's verdict.
grep -m 1 -E "rank [0-3].*$node1" "$work/kill0.log" || {
  echo "FAIL: no line names node 1 ($node1):" >&2
  tail -n 20 "$work/kill0.log" >&2
  exit 1
}
# ... and the dead ranks themselves with their node (issue 34): a survivor's
# diagnosis names the members that reported nothing (docs/runtime.md, "Which
# rank did not arrive").
grep -m 1 -oE "rank [4-7] \(node 1\)[^;]*reported nothing[^;]*" "$work/kill0.log" || {
  echo "FAIL: no line names a rank of node 1 as the one that did not arrive:" >&2
  tail -n 20 "$work/kill0.log" >&2
  exit 1
}
grep -m 1 '^meshplan run: rank [0-3] exited with status' "$work/kill0.log"
echo "node 0 stopped ${took} s after node 1 was killed"

echo "== --fault-tolerant: node 1 killed mid-run"
# One replica group per node: the survivor is 1 of 2 groups, not the strict
# majority a quorum needs (two halves must never both train on), so node 0
# stops too, saying so, once its quorum wait (--timeout) runs out.
spec_override=$src/test/trainer/specs/ft-hsdp2-fsdp4.json
timeout=10
ft=(--fault-tolerant --job "ft$tag" --max-restarts 0 --heartbeat-ms 1000 --)
node 0 ft "$work/ft0.log" "${ft[@]}" --steps 400 --log-every 1
p0=$!
node 1 ft "$work/ft1.log" "${ft[@]}" --steps 400 --log-every 1
p1=$!
kill_node_1_after "$work/ft0.log" 5
wait "$p1" 2>/dev/null || true
code=0
wait "$p0" || code=$?
if ((code != 1)) || ! grep -m 1 "quorum cannot be met: 1 of 2 replica groups remain" "$work/ft0.log"; then
  echo "FAIL: node 0's fault-tolerant launcher exited $code (want 1, no quorum):" >&2
  tail -n 20 "$work/ft0.log" >&2
  exit 1
fi
grep -m 1 "found no quorum" "$work/ft0.log"
echo "two nodes: passed"
