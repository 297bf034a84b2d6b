# Shared by the tests that check a job leaves nothing running (sourced).
#
# job_pids STORE_DIR: the live processes (not zombies) whose environment
# names the job's store, MESHPLAN_STORE=file:STORE_DIR; this shell and its
# subshells excepted. Call it after the launcher has exited.
job_pids() {
  local f p
  for f in $(grep -lsxzF "MESHPLAN_STORE=file:$1" /proc/[0-9]*/environ); do
    p=${f#/proc/}; p=${p%/environ}
    [[ $p == self || $p == "$BASHPID" || $p == $$ ]] && continue
    [[ $(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1) =~ ^[A-Y]$ ]] && echo "$p"
  done
}

# rank_pid LAUNCHER RANK: the launcher's child process with that RANK.
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    grep -qsxzF "RANK=$2" "/proc/$p/environ" && { echo "$p"; return; }
  done
}
