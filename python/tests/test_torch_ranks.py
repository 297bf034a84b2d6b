"""meshplan.torch over several processes (real Gloo, through `meshplan
run`): float8 all-gathers with the bf16 stochastic-rounding AdamW, and a
rank whose forward raises, which must end every rank's step with that
error, never a hang."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

from common import CLI

WORKER = os.path.join(os.path.dirname(__file__), "torch_worker.py")


def run(world, *args, timeout=300):
    start = time.monotonic()
    proc = subprocess.run([CLI, "run", "-n", str(world), "--timeout", "120", "--", sys.executable, WORKER, *args],
                          timeout=timeout, capture_output=True, text=True)
    return proc, time.monotonic() - start


def test_float8_gathers_and_sr_adamw_train(tmp_path):
    out = str(tmp_path / "f8")
    proc, _ = run(2, "float8", out)
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        res = json.load(open(f"{out}.rank{r}"))
        assert "float8_e4m3fn" in res["dtypes"], res
        assert res["shards"] == ["bfloat16"], res
        losses = res["losses"]
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.1, losses


def test_a_failing_forward_ends_every_rank_with_its_error(tmp_path):
    out = str(tmp_path / "fail")
    proc, took = run(2, "fail", out, "1")
    # The launcher reports the failure; no rank waits for the 120 s timeout.
    assert proc.returncode != 0 or took < 100
    assert took < 100, (took, proc.stderr[-2000:])
    failing = json.load(open(f"{out}.rank1"))
    assert failing["raised"] == "RuntimeError", failing
    assert "injected failure in layers.0" in failing["message"], failing
    peer = json.load(open(f"{out}.rank0"))
    assert peer["raised"] == "StepError", peer
    assert peer["rank"] == 1 and "injected failure in layers.0" in peer["message"], peer
