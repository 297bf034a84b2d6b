"""The Python session opened by other launchers than `meshplan run`
(docs/runtime.md, "torchrun", "Slurm"): torchrun itself, whose c10d
TCPStore at MASTER_ADDR:MASTER_PORT is the store, and srun's variables with
a file: store; launcher variables that disagree are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import meshplan
from common import fsdp_spec

WORKER = os.path.join(os.path.dirname(__file__), "rank_worker.py")
# Every launcher's variables, removed from the environment the tests start
# their ranks in (ctest may itself run under a launcher).
LAUNCHER_VARIABLES = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MESHPLAN_STORE",
                      "MESHPLAN_JOB", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                      "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                      "SLURM_JOB_ID", "SLURM_STEP_ID"]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(extra)
    return env


def check(out, world):
    for r in range(world):
        res = json.load(open(f"{out}.rank{r}"))
        # Every shard equals one AdamW step with the mean gradient.
        assert res["worst"] < 1e-6, res
        assert res["steps"] == 1 and res["communicators"], res


def test_torchrun_starts_python_sessions(tmp_path):
    pytest.importorskip("torch.distributed.run")
    out = str(tmp_path / "torchrun")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                           WORKER, "train", out], env=clean_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check(out, 3)


def test_srun_variables_start_python_sessions(tmp_path):
    out = str(tmp_path / "slurm")
    (tmp_path / "store").mkdir()
    procs = [subprocess.Popen([sys.executable, WORKER, "train", out],
                              env=clean_env(SLURM_PROCID=str(r), SLURM_NTASKS="3", SLURM_LOCALID=str(r),
                                            SLURM_NODEID="0", SLURM_NNODES="1", SLURM_JOB_ID="77",
                                            SLURM_STEP_ID="0", MESHPLAN_STORE=f"file:{tmp_path / 'store'}",
                                            MESHPLAN_TIMEOUT="60"))
             for r in range(3)]
    assert [p.wait(timeout=240) for p in procs] == [0, 0, 0]
    check(out, 3)


@pytest.mark.parametrize("variables, message", [
    ({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
     "RANK=0 disagrees with srun's SLURM_PROCID=1"),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, "MESHPLAN_STORE is not set: srun"),
    ({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "x"},
     "MASTER_ADDR is not set although torchrun's TORCHELASTIC_RUN_ID=x is"),
])
def test_launcher_variables_that_do_not_fit_are_refused(monkeypatch, tmp_path, variables, message):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if "RANK" in variables and "SLURM_PROCID" in variables:
        monkeypatch.setenv("MESHPLAN_STORE", f"file:{tmp_path}")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    two = meshplan.plan(fsdp_spec(2), 0)
    with pytest.raises(meshplan.StoreError, match=message.replace("(", r"\(")):
        meshplan.Session(two)
