"""One rank of the multi-process tests (test_multirank.py): RANK,
WORLD_SIZE and MESHPLAN_STORE come from the environment, as `meshplan run`
sets them, or what torchrun or srun set (test_launchers.py)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import meshplan
from common import adamw_first_step, fsdp_spec, init_value


def train(out_path: str) -> None:
    """Each rank adds (rank + 1) to every gradient; the plan averages them
    over the FSDP axis, so the update uses the mean."""
    # torchrun and `meshplan run` set RANK and WORLD_SIZE; srun
    # SLURM_PROCID and SLURM_NTASKS (the session reads the same).
    world = int(os.environ.get("WORLD_SIZE") or os.environ["SLURM_NTASKS"])
    rank = int(os.environ.get("RANK") or os.environ["SLURM_PROCID"])
    plan = meshplan.plan(meshplan.spec(fsdp_spec(world)), rank)
    with meshplan.Session(plan) as session:
        session.init_parameters(lambda v: v.copy_(init_value(v.offset, v.local_shape)))

        def compute(call):
            if call.phase == "backward":
                for g in call.grads:
                    g.numpy()[...] += rank + 1

        session.on_compute(compute)
        session.step()
        mean = sum(r + 1 for r in range(world)) / world
        worst = 0.0
        for p in session.parameters():
            expected = adamw_first_step(
                init_value(p.offset, p.local_shape), np.full(p.local_shape, mean)
            )
            worst = max(worst, float(np.max(np.abs(p.numpy() - expected))))
        result = {
            "rank": rank,
            "worst": worst,
            "steps": session.steps_done,
            "communicators": session.created_communicators(),
        }
    with open(out_path + f".rank{rank}", "w") as f:
        json.dump(result, f)


def fail(out_path: str, failing_rank: int) -> None:
    """Rank `failing_rank`'s forward of layers.0 raises; every rank records
    what step() raised."""
    # torchrun and `meshplan run` set RANK and WORLD_SIZE; srun
    # SLURM_PROCID and SLURM_NTASKS (the session reads the same).
    world = int(os.environ.get("WORLD_SIZE") or os.environ["SLURM_NTASKS"])
    rank = int(os.environ.get("RANK") or os.environ["SLURM_PROCID"])
    plan = meshplan.plan(meshplan.spec(fsdp_spec(world)), rank)
    session = meshplan.Session(plan)
    session.init_parameters(lambda v: v.copy_(init_value(v.offset, v.local_shape)))

    def compute(call):
        if rank == failing_rank and call.unit == "layers.0":
            raise ZeroDivisionError(f"bad batch on rank {rank}")

    session.on_compute(compute)
    try:
        session.step()
        result = {"raised": None}
    except Exception as e:  # what each rank sees
        result = {
            "raised": type(e).__name__,
            "message": str(e),
            "notes": getattr(e, "__notes__", []),
            "rank": getattr(e, "rank", None),
            "instruction": getattr(e, "instruction", None),
        }
    with open(out_path + f".rank{rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    scenario, out = sys.argv[1], sys.argv[2]
    if scenario == "train":
        train(out)
    elif scenario == "fail":
        fail(out, int(sys.argv[3]))
    else:
        sys.exit(f"unknown scenario {scenario}")
