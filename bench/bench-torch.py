"""meshplan.torch against torch FSDP2 on Gloo, side by side in one run (issue
"meshplan.torch"): step time of the torch driver over FSDP2's (target <=
1.0), and the driver's own overhead per step (time in meshplan.torch and
the bindings, not in torch or the runtime: Trainer.last_step["overhead"])
as a fraction of the step (target < 5% on the wide model).

    build/bin/meshplan run -n 8 --timeout 600 -- .venv/bin/python bench/bench-torch.py \\
        [--models tiny,wide] [--steps 12] [--tokens 2048]

Per model, each of the 8 ranks builds the same Llama (examples/torch/
llama.py, float32) under FSDP 8 twice: torch's `fully_shard` (torchtitan's
units) and meshplan.torch with the spec of the same units. They alternate
step by step (which side goes first alternates too) on the same data,
every step after a barrier, and a step's time is the slowest rank's. The
first 2 steps of each side are warm-up. Rank 0 prints medians and ratios.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "torch"))
from llama import CONFIGS, Llama  # noqa: E402

import meshplan.torch as mpt  # noqa: E402

OPT = {"name": "adamw", "lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def bench_model(name: str, steps: int, tokens: int, rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = Llama(CONFIGS[name])
    model.init_weights(0)
    seq = 256
    rows = max(tokens // seq, 1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    fsdp = copy.deepcopy(model)
    fully_shard(fsdp.tok_embeddings, mesh=mesh)
    for block in fsdp.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp, mesh=mesh, reshard_after_forward=False)
    opt = torch.optim.AdamW(fsdp.parameters(), lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"],
                            weight_decay=OPT["weight_decay"])
    spec = {"model": "torch", "world_size": world, "mesh": {"axes": [{"name": "fsdp", "size": world}]},
            "data_parallel": {"shard_axes": ["fsdp"]}, "optimizer": OPT}
    trainer = mpt.Trainer(copy.deepcopy(model), spec, job=f"bench-{name}",
                          example_input=torch.zeros(1, 1, dtype=torch.long))

    def fsdp_step(x, y):
        loss = mpt.cross_entropy(fsdp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    times = {"fsdp2": [], "meshplan": []}
    overhead, walls = [], []
    g = torch.Generator().manual_seed(rank)
    for step in range(steps):
        t = torch.randint(0, 256, (rows, seq + 1), generator=g)
        x, y = t[:, :-1], t[:, 1:]
        order = ["fsdp2", "meshplan"] if step % 2 == 0 else ["meshplan", "fsdp2"]
        for side in order:
            dist.barrier()
            start = time.perf_counter()
            if side == "fsdp2":
                fsdp_step(x, y)
            else:
                trainer.step(x, y)
            took = slowest(time.perf_counter() - start)
            if step >= 2:
                times[side].append(took)
                if side == "meshplan":
                    overhead.append(slowest(trainer.last_step["overhead"]))
                    walls.append(took)
    trainer.close()
    fsdp2 = statistics.median(times["fsdp2"])
    mine = statistics.median(times["meshplan"])
    over = statistics.median(o / w for o, w in zip(overhead, walls))
    return {"model": name, "fsdp2_ms": fsdp2 * 1e3, "meshplan_ms": mine * 1e3, "ratio": mine / fsdp2,
            "overhead_ms": statistics.median(overhead) * 1e3, "overhead_fraction": over,
            "params": sum(p.numel() for p in model.parameters()), "tokens_per_rank": rows * seq}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny,wide")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torch's env:// rendezvous: `meshplan run` sets MASTER_ADDR and
    # MASTER_PORT as torchrun does.
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = [bench_model(m, args.steps, args.tokens, rank, world) for m in args.models.split(",")]
    dist.destroy_process_group()
    if rank == 0:
        print(f"bench-torch: {world} ranks, FSDP {world}, float32, medians of {args.steps - 2} steps "
              "(slowest rank per step), sides alternating")
        print(f"{'model':6} {'params':>10} {'tokens/rank':>11} {'FSDP2 ms':>9} {'meshplan ms':>11} "
              f"{'ratio':>6} {'overhead ms':>11} {'overhead %':>10}")
        ok = True
        for r in results:
            print(f"{r['model']:6} {r['params']:>10} {r['tokens_per_rank']:>11} {r['fsdp2_ms']:>9.1f} "
                  f"{r['meshplan_ms']:>11.1f} {r['ratio']:>6.3f} {r['overhead_ms']:>11.2f} "
                  f"{100 * r['overhead_fraction']:>9.2f}%")
            ok &= r["ratio"] <= 1.0
            if r["model"] == "wide":
                ok &= r["overhead_fraction"] < 0.05
        print("targets: ratio <= 1.0 on every model; overhead < 5% of the step on wide: "
              + ("met" if ok else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
