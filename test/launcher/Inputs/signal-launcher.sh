#!/usr/bin/env bash
# Usage: signal-launcher.sh SIGNAL DIR MESHPLAN
# Starts a 2-rank job whose ranks record their pids in DIR, start a
# background `sleep` (a process the rank started: not the launcher's child)
# and sleep, sends SIGNAL to the launcher once both run, then prints the
# launcher's exit code, whether each rank and its background process are
# still alive, and whether the job's store directory is left.
sig=$1 dir=$2 meshplan=$3
# Job control: a background job of a plain script starts with SIGINT ignored.
set -m
mkdir -p "$dir"
"$meshplan" run -n 2 --grace 5 -- sh -c \
  'echo "${MESHPLAN_STORE#file:}" >"$0/store"; sleep 30 & echo $! >"$0/bg.$RANK"
   echo $$ >"$0/pid.$RANK.tmp" && mv "$0/pid.$RANK.tmp" "$0/pid.$RANK"; exec sleep 30' \
  "$dir" &
launcher=$!
for _ in $(seq 200); do
  [ -e "$dir/pid.0" ] && [ -e "$dir/pid.1" ] && break
  sleep 0.05
done
kill -"$sig" "$launcher"
wait "$launcher"
echo "launcher exit $?"
# A rank counts as gone once it has exited (a zombie waiting for init to reap
# it has). The launcher reaps its ranks before it exits, so they must be gone
# at once; only a SIGKILLed launcher leaves that to the kernel
# (PR_SET_PDEATHSIG), which may take a moment.
gone() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
  [ -z "$state" ] || [ "$state" = Z ]
}
tries=1
[ "$sig" = KILL ] && tries=100
for r in 0 1; do
  pid=$(cat "$dir/pid.$r")
  for _ in $(seq "$tries"); do gone "$pid" && break; sleep 0.05; done
  if gone "$pid"; then
    echo "rank $r gone"
  else
    echo "rank $r alive"
    kill -KILL "$pid"
  fi
done
# What the ranks started, and the store directory: the launcher's stop
# signals each rank's process group; a SIGKILLed launcher leaves both to its
# guardian process.
for r in 0 1; do
  pid=$(cat "$dir/bg.$r")
  for _ in $(seq "$tries"); do gone "$pid" && break; sleep 0.05; done
  if gone "$pid"; then
    echo "rank $r child gone"
  else
    echo "rank $r child alive"
    kill -KILL "$pid"
  fi
done
store=$(cat "$dir/store")
for _ in $(seq "$tries"); do [ -e "$store" ] || break; sleep 0.05; done
if [ -e "$store" ]; then echo "store left: $store"; else echo "store removed"; fi
