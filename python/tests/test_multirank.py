"""Several processes, each one rank, over real Gloo: through `meshplan run`
(the environment it sets), and a failing rank that must not hang the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from common import CLI

WORKER = os.path.join(os.path.dirname(__file__), "rank_worker.py")


def results(out, world):
    return [json.load(open(f"{out}.rank{r}")) for r in range(world)]


def test_two_and_four_ranks_train_through_meshplan_run(tmp_path):
    for world in (2, 4):
        out = str(tmp_path / f"train{world}")
        subprocess.run(
            [CLI, "run", "-n", str(world), "--timeout", "60", "--", sys.executable, WORKER, "train", out],
            check=True,
            timeout=240,
        )
        for r in results(out, world):
            # Every shard equals one AdamW step with the mean gradient.
            assert r["worst"] < 1e-6, r
            assert r["steps"] == 1
            assert r["communicators"], r


def test_a_rank_that_raises_ends_every_rank_promptly(tmp_path):
    world, failing = 3, 1
    out = str(tmp_path / "fail")
    env = dict(os.environ, WORLD_SIZE=str(world), MESHPLAN_STORE=f"file:{tmp_path / 'store'}",
               MESHPLAN_TIMEOUT="120")
    (tmp_path / "store").mkdir()
    start = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, WORKER, "fail", out, str(failing)], env=dict(env, RANK=str(r)))
        for r in range(world)
    ]
    ended = {}
    while len(ended) < world and time.monotonic() - start < 150:
        for r, p in enumerate(procs):
            if r not in ended and p.poll() is not None:
                ended[r] = time.monotonic() - start
        time.sleep(0.05)
    for r, p in enumerate(procs):
        assert p.wait(timeout=1) == 0, r
    # The peers end far below the 120 s timeout: the failing rank reported
    # the failure and aborted its communicators, so they did not wait for
    # it. The failing rank itself may wait for a Gloo collective of its own
    # that abort does not end (docs/runtime.md, "When a rank fails"), but
    # never past the timeout.
    for r in range(world):
        assert ended[r] < (120 if r == failing else 30), ended
    seen = results(out, world)
    assert seen[failing]["raised"] == "ZeroDivisionError"
    assert any("rank 1" in n and "layers.0" in n for n in seen[failing]["notes"])
    for r, s in enumerate(seen):
        if r == failing:
            continue
        # The peers' error names the rank that failed first and its
        # instruction.
        assert s["raised"] == "StepError", s
        assert s["rank"] == failing and s["instruction"], s
        assert "ZeroDivisionError" in s["message"], s
