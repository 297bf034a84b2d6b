#!/usr/bin/env python3
"""runtime.ft.phases: a replica group lost at every phase of the protocol.

Runs `meshplan run -n 6 --fault-tolerant` on the real trainer (HSDP 3 groups
x FSDP 2, tiny model, real gradients) and kills ranks with SIGKILL at the
moment the ranks' own protocol trace (MESHPLAN_FT_LOG=1) or the launcher
says a phase has begun: the kill waits on that event, never on a sleep.
Every run must end with every committed step kept and the parameters equal
to the uninterrupted run's bit for bit (or, where the faults exhaust the
restarts or the quorum, stop with the message saying so), and the survivors
must commit again within a bound far below the 60 s collective timeout that
a stall would hit (docs/fault-tolerance.md, "Faults, phase by phase").

    fault-phases.py BIN_DIR SOURCE_DIR [--repeat N] [--phase NAME ...]

Each phase runs --repeat times (default 2; the kill's offset from its event
is drawn anew each time, over the window where the race lies).
"""

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

# Generous for a loaded two-core machine, far below the 60 s a stalled
# collective or vote waits: from a kill to the next step any survivor
# commits (the heartbeat expiry is 2 s), and a whole run.
RECOVERY_BOUND_S = 12.0
RUN_BOUND_S = 50.0
STEPS = 8
DELAY_MS = 60


def rank_pid(launcher_pid, rank):
    """The pid of the launcher's child with RANK=rank, or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if f"RANK={rank}".encode() in env:
            return int(entry)
    return None


class Run:
    """One launcher run; `triggers` are (regex, delay range s, ranks, times
    [, arm]): once a line matches, after a delay drawn from the range, the
    ranks get SIGKILL; `times` is how often the trigger may fire. With `arm`
    (a regex), the trigger fires only after a line matching `arm` since it
    last fired: "the next epoch line after each restart"."""

    def __init__(self, bin_dir, spec, data, work, name, env=(), flags=(),
                 triggers=(), train=(), hold=None):
        self.bin, self.spec, self.data, self.work = bin_dir, spec, data, work
        self.train = list(train)
        # hold: the ranks wait before the last step until the fault has
        # happened (MESHPLAN_TEST_HOLD): released on this line, or (True)
        # once every trigger has fired and the launcher saw each kill.
        self.hold = hold
        self.gate = os.path.join(work, name + ".gate")
        self.name, self.env, self.flags = name, list(env), list(flags)
        # [regex, delays, ranks, times left, arm regex or None, armed]
        self.triggers = [[re.compile(t[0]), t[1], t[2], t[3],
                          re.compile(t[4]) if len(t) > 4 else None,
                          len(t) <= 4] for t in triggers]
        self.kills = []  # (wall time, ranks)
        self.fired = 0  # triggers fired (their kills may be pending)
        self.unreaped = set()  # ranks killed whose exit the launcher owes
        self.lines = []

    def kill_later(self, launcher, delay, ranks):
        time.sleep(delay)
        pids = [rank_pid(launcher.pid, r) for r in ranks]
        self.unreaped.update(r for r, p in zip(ranks, pids) if p)
        now = time.time()
        for p in pids:
            if p:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.kills.append((now, ranks))

    def run(self):
        params = os.path.join(self.work, self.name + ".params")
        cmd = [os.path.join(self.bin, "meshplan"), "run", "-n", "6",
               "--fault-tolerant", "--timeout", "60", *self.flags, "--",
               "env", "MESHPLAN_FT_LOG=1",
               f"MESHPLAN_TEST_STEP_DELAY_MS={DELAY_MS}", *self.env,
               *([f"MESHPLAN_TEST_HOLD={STEPS - 1}:{self.gate}"]
                 if self.hold else []),
               os.path.join(self.bin, "meshplan-train"), "--spec", self.spec,
               "--data", self.data, "--batch", "2", "--seq-len", "32",
               "--log-every", "1", "--steps", str(STEPS),
               "--save-params", params, *self.train]
        start = time.time()
        launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        timer = threading.Timer(RUN_BOUND_S + 60, launcher.kill)
        timer.start()
        threads = []
        for line in launcher.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
            m = re.search(r"^meshplan run: rank (\d+) exited", line)
            if m:
                self.unreaped.discard(int(m.group(1)))
            if self.hold and not os.path.exists(self.gate):
                if isinstance(self.hold, str):
                    release = re.search(self.hold, line)
                else:
                    release = (all(t[3] == 0 for t in self.triggers) and
                               self.fired == len(self.kills) and
                               not self.unreaped)
                if release:
                    open(self.gate, "w").close()
            for t in self.triggers:
                if t[4] is not None and t[4].search(line):
                    t[5] = True
                if t[3] > 0 and t[5] and t[0].search(line):
                    t[3] -= 1
                    t[5] = t[4] is None
                    self.fired += 1
                    th = threading.Thread(
                        target=self.kill_later,
                        args=(launcher, random.uniform(*t[1]), t[2]))
                    th.start()
                    threads.append(th)
        code = launcher.wait()
        timer.cancel()
        for th in threads:
            th.join()
        self.wall = time.time() - start
        self.code = code
        self.params = params
        with open(os.path.join(self.work, self.name + ".log"), "w") as f:
            f.write("\n".join(l for _, l in self.lines) + "\n")
        return self

    def recovery(self):
        """Seconds from each failure (the launcher's line saying a replica
        failed, whoever killed its rank) to the next step any rank commits
        (its trace line, stamped with the seconds of the hour)."""
        commits = []
        for _, line in self.lines:
            m = re.search(r"ft-log +([0-9.]+) rank \d+: commits step", line)
            if m:
                commits.append(float(m.group(1)))
        out = []
        for when, line in self.lines:
            if not re.search(r"^meshplan run: replica \d+ failed", line):
                continue
            hour = when % 3600
            after = [c + (3600 if c < hour - 1800 else 0) for c in commits]
            after = [c for c in after if c >= hour]
            out.append(min(after) - hour if after else None)
        return out

    def redone_commits(self):
        """Steps committed in two epochs: a committed step thrown away."""
        epochs = {}
        for _, line in self.lines:
            m = re.search(r"commits step (\d+) of epoch (\d+)", line)
            if m:
                epochs.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        return sorted(s for s, e in epochs.items() if len(e) > 1)

    def failed_replicas(self):
        return {int(m.group(1)) for _, l in self.lines
                for m in [re.search(r"^meshplan run: replica (\d+) failed", l)]
                if m}


def compare(bin_dir, a, b):
    r = subprocess.run([os.path.join(bin_dir, "meshplan-train"), "--compare",
                        a, b, "--rtol", "0"], capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr).strip().splitlines()[:1]


# name: (what, env, flags, triggers, expected exit, expected text, the
# replicas that may fail: a bystander restarted is a failure)
# Triggers' events: the ranks' trace lines (FaultTolerance.cpp, ftLog) and
# the launcher's epoch lines.
#
# A restarted group 1 back in an epoch: "replica 1 joined", or, when it came
# back before its loss was seen (a kill the others noticed only by the
# heartbeat's expiry), "same replicas 0, 1, 2 live". Waiting for "joined"
# alone once held the other groups at the gate forever (max-restarts, 1 run
# in 36 under load), so the triggers take either, armed by the restart.
REJOINED = (r"meshplan run: epoch \d+: (replica 1 joined|same replicas "
            r"(\d+, )*1(, \d+)* live)")
RESTARTED = r"meshplan run: replica 1 failed: .*restarting it"
PHASES = {
    "startup": (
        "rank 4 killed as it registers, before the first quorum",
        [], [], [(r"\[rank 4\] ft-log .*registered", (0.0, 0.05), [4], 1)],
        0, None, {2}),
    "first-rendezvous": (
        "rank 4 killed 0-120 ms after epoch 1 (the fault-tolerant "
        "groups' first rendezvous)",
        [], [], [(r"meshplan run: epoch 1:", (0.0, 0.12), [4], 1)], 0, None, {2}),
    "before-first-commit": (
        "rank 2 killed in step 1's forward (MESHPLAN_TEST_KILL=1:2)",
        ["MESHPLAN_TEST_KILL=1:2"], [], [], 0, None, {1}),
    "commit-vote": (
        "rank 4 killed right after its ok vote on step 3",
        [], [], [(r"\[rank 4\] ft-log .*votes ok on step 3 ", (0.0, 0.01), [4],
                  1)], 0, None, {2}),
    "heal-source": (
        "group 1 killed at step 2; rank 4 (a heal source) killed 0-30 ms "
        "into the heal",
        ["MESHPLAN_TEST_KILL=2:2,3"], [],
        [(r"\[rank 4\] ft-log .*heal in epoch \d+ starts as source",
          (0.0, 0.03), [4], 1)], 0, None, {1, 2},
        {"hold": REJOINED}),
    "heal-joiner": (
        "group 1 killed at step 2; restarted rank 2 killed 0-30 ms into its "
        "heal",
        ["MESHPLAN_TEST_KILL=2:2,3"], [],
        [(r"\[rank 2\] ft-log .*heal in epoch \d+ starts as joiner",
          (0.0, 0.03), [2], 1)], 0, None, {1}, {"hold": True}),
    "after-rejoin": (
        "group 1 killed at step 2; rank 2 killed 0-150 ms after the epoch "
        "it rejoined in",
        ["MESHPLAN_TEST_KILL=2:2,3"], [],
        [(REJOINED, (0.0, 0.15), [2], 1, RESTARTED)],
        0, None, {1}, {"hold": True}),
    "two-groups": (
        "groups 1 and 2 killed at once at step 3 (no quorum until they are "
        "back)",
        ["MESHPLAN_TEST_KILL=3:2,3,4,5"], [], [], 0, None, {1, 2}),
    "two-ranks": (
        "ranks 3 and 4 (of groups 1 and 2) killed at once at step 3",
        ["MESHPLAN_TEST_KILL=3:3,4"], [], [], 0, None, {1, 2}),
    "max-restarts": (
        "group 1 killed at step 2 and then each time it rejoins, past "
        "--max-restarts 2: given up, the others finish",
        ["MESHPLAN_TEST_KILL=2:2,3"], ["--max-restarts", "2"],
        [(REJOINED, (0.0, 0.05), [2], 2, RESTARTED)],
        0, "replica 1 failed and has used its 2 restarts", {1},
        {"hold": True}),
    "tp-in-groups": (
        "tensor parallel inside the groups (ft-hsdp3-tp2.json, synthetic "
        "gradients): rank 2 killed in step 2's forward, the step redone",
        ["MESHPLAN_TEST_KILL=2:2"], [], [], 0, None, {1},
        {"spec": "ft-hsdp3-tp2.json", "train": ["--synthetic-grads"]}),
    "quorum-lost": (
        "group 1 killed with --max-restarts 0 --min-replicas 3: the job "
        "stops, saying why",
        ["MESHPLAN_TEST_KILL=2:2"], ["--max-restarts", "0", "--min-replicas",
                                     "3"], [], 1, "quorum cannot be met", {1}),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("src")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--phase", action="append")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if not shutil.which("redis-server"):
        print("SKIPPED: redis-server is not installed")
        return 0
    work = tempfile.mkdtemp(prefix="meshplan-ft-phases-")
    data = os.path.join(work, "data")
    shutil.copytree(os.path.join(a.src, "docs"), data)
    failures = 0
    try:
        refs = {}

        def reference(spec, train):
            """The uninterrupted run (fault tolerance off), once per spec."""
            k = (spec, tuple(train))
            if k not in refs:
                refs[k] = os.path.join(work, f"plain{len(refs)}.params")
                subprocess.run(
                    [os.path.join(a.bin, "meshplan"), "run", "-n", "6",
                     "--timeout", "60", "--",
                     os.path.join(a.bin, "meshplan-train"), "--spec", spec,
                     "--data", data, "--batch", "2", "--seq-len", "32",
                     "--log-every", str(STEPS), "--steps", str(STEPS),
                     "--save-params", refs[k], *train], check=True,
                    stdout=subprocess.DEVNULL)
            return refs[k]
        for name in a.phase or PHASES:
            (what, env, flags, triggers, want_code, want_text,
             may_fail) = PHASES[name][:7]
            opts = PHASES[name][7] if len(PHASES[name]) > 7 else {}
            spec = os.path.join(a.src, "test/trainer/specs",
                                opts.get("spec", "ft-hsdp3x2.json"))
            train = opts.get("train", [])
            ref = reference(spec, train)
            print(f"== {name}: {what}", flush=True)
            for i in range(a.repeat):
                r = Run(a.bin, spec, data, work, f"{name}.{i}", env, flags,
                        [list(t) for t in triggers], train,
                        opts.get("hold")).run()
                text = "\n".join(l for _, l in r.lines)
                rec = r.recovery()
                problems = []
                if r.code != want_code:
                    problems.append(f"exit {r.code}, expected {want_code}")
                if want_text and want_text not in text:
                    problems.append(f"no line saying \"{want_text}\"")
                if triggers and not r.kills:
                    problems.append("the kill's event never came")
                redone = r.redone_commits()
                if redone:
                    problems.append(f"steps {redone} committed twice")
                bystanders = r.failed_replicas() - may_fail
                if bystanders:
                    problems.append(f"replicas {sorted(bystanders)} failed "
                                    "(bystanders)")
                if r.wall > RUN_BOUND_S:
                    problems.append(f"took {r.wall:.1f} s (bound "
                                    f"{RUN_BOUND_S:.0f} s)")
                if want_code == 0:
                    for x in rec:
                        if x is not None and x > RECOVERY_BOUND_S:
                            problems.append(f"next commit {x:.1f} s after "
                                            "a kill")
                    same, line = compare(a.bin, r.params, ref)
                    if not same:
                        problems.append("parameters differ from the "
                                        f"uninterrupted run: {line}")
                recs = ", ".join("-" if x is None else f"{x:.1f} s"
                                 for x in rec)
                print(f"  run {i + 1}: exit {r.code}, {r.wall:.1f} s; "
                      f"kill to next commit: {recs or 'n/a'}"
                      + ("" if not problems else "; FAIL: " +
                         "; ".join(problems)), flush=True)
                if problems:
                    failures += 1
                    for _, l in r.lines[-40:]:
                        print("    | " + l)
    finally:
        if a.keep or failures:
            print(f"(kept {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("fault phases: " + ("all passed" if not failures
                              else f"{failures} runs failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
