"""meshplan.torch against torch's own FSDP2, rank by rank.

Run one process per rank:

    build/bin/meshplan run -n 8 -- .venv/bin/python examples/torch/compare_fsdp2.py \\
        --spec examples/specs/fsdp-fp8-3d.json [--spec ...] --steps 10 [--out FILE]

For each spec, in this process one after the other: the tiny Llama of
llama.py, one init, the same data per data-parallel rank, trained for STEPS
steps by FSDP2 (``fully_shard`` over Gloo with torchtitan's units: the
embedding, each block, the root holding norm and output; a 2-D mesh of
(replicate, shard) axes for HSDP; ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`` for a bf16 spec) and by ``meshplan.torch.Trainer``;
for float32 specs also by one float64 process on the global batch, the
yardstick of what fp32 noise is. Rank 0 prints a few lines per spec and
writes every rank's figures to FILE (JSON): the largest relative loss
difference over all steps and ranks, and over every parameter element the
largest difference meshplan - FSDP2, FSDP2 - float64 and meshplan - float64.

FSDP2 takes the spec's mesh, its data-parallel axes (replicate first, then
shard; extra axes are not FSDP2's) and its optimizer; float8 is meshplan's
alone, so a float8 spec compares against FSDP2 in the spec's param_dtype.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama import CONFIGS, Llama  # noqa: E402

import meshplan  # noqa: E402
import meshplan.torch as mpt  # noqa: E402

BATCH, SEQ = 2, 32


def batch(step: int, dp: int):
    """Random tokens of (step, data-parallel rank): the same on both sides."""
    g = torch.Generator().manual_seed(1000 * step + dp)
    tokens = torch.randint(0, 256, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def adamw(params, opt):
    return torch.optim.AdamW(
        params,
        lr=opt["lr"],
        betas=tuple(opt.get("betas", (0.9, 0.999))),
        eps=opt.get("eps", 1e-8),
        weight_decay=opt.get("weight_decay", 0.01),
        foreach=False,
    )


def fsdp2_model(initial, spec_doc, bf16):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dp = spec_doc.get("data_parallel", {})
    names = dp.get("replicate_axes", []) + dp.get("shard_axes", [])
    sizes = {a["name"]: a["size"] for a in spec_doc["mesh"]["axes"]}
    if set(sizes) != set(names):
        raise SystemExit(
            f"compare_fsdp2: FSDP2 takes replicate and shard axes only; the mesh "
            f"has {sorted(set(sizes) - set(names))} as well"
        )
    mesh = init_device_mesh("cpu", tuple(sizes[n] for n in names), mesh_dim_names=tuple(names))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    model = copy.deepcopy(initial)
    fully_shard(model.tok_embeddings, mesh=mesh, mp_policy=mp)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def compare(spec_doc, steps, rank, case):
    model = Llama(CONFIGS["tiny"])
    model.init_weights(seed=0)
    bf16 = (spec_doc.get("mixed_precision") or {}).get("param_dtype") == "bfloat16"

    fsdp = fsdp2_model(model, spec_doc, bf16)
    opt = adamw(fsdp.parameters(), spec_doc["optimizer"])
    trainer = mpt.Trainer(copy.deepcopy(model), spec_doc, job=f"compare{case}")
    dp_rank, dp_size = trainer.data_parallel_rank, trainer.data_parallel_size
    fsdp_losses, mp_losses = [], []
    for s in range(1, steps + 1):
        x, y = batch(s, dp_rank)
        loss = mpt.cross_entropy(fsdp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        fsdp_losses.append(loss.item())
        mp_losses.append(trainer.step(x, y))
    fsdp_full = {n: p.full_tensor().detach() for n, p in fsdp.named_parameters()}
    shards = {t.tensor: (t.offset, t.torch().float().clone()) for t in trainer.session.parameters()}
    trainer.close()

    ref64 = None
    if not bf16:
        ref = copy.deepcopy(model).double()
        ropt = adamw(ref.parameters(), spec_doc["optimizer"])
        for s in range(1, steps + 1):
            xs, ys = zip(*(batch(s, d) for d in range(dp_size)))
            loss = mpt.cross_entropy(ref(torch.cat(xs)), torch.cat(ys))
            loss.backward()
            ropt.step()
            ropt.zero_grad()
        ref64 = {n: p.detach() for n, p in ref.named_parameters()}

    result = {
        "loss_rel": max(abs(a - b) / abs(b) for a, b in zip(mp_losses, fsdp_losses)),
        "param_diff": 0.0,
        "param_diff_at": None,
        "fsdp2_vs_fp64": None if bf16 else 0.0,
        "meshplan_vs_fp64": None if bf16 else 0.0,
        "first_loss": mp_losses[0],
        "last_loss": mp_losses[-1],
    }
    for name, (offset, shard) in shards.items():
        if not shard.numel():
            continue
        box = tuple(slice(o, o + n) for o, n in zip(offset, shard.shape))
        theirs = fsdp_full[name][box].float()
        d = (shard - theirs).abs().max().item()
        if d > result["param_diff"]:
            result["param_diff"], result["param_diff_at"] = d, name
        if ref64 is not None:
            r = ref64[name][box]
            result["fsdp2_vs_fp64"] = max(result["fsdp2_vs_fp64"], (theirs.double() - r).abs().max().item())
            result["meshplan_vs_fp64"] = max(result["meshplan_vs_fp64"], (shard.double() - r).abs().max().item())
    return result


def worst(results, key):
    values = [r[key] for r in results if r[key] is not None]
    return max(values) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", action="append", required=True, help="a spec file or JSON text (repeatable)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", help="write every spec's figures here (JSON, rank 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torch's env:// rendezvous: `meshplan run` sets MASTER_ADDR and
    # MASTER_PORT as torchrun does.
    dist.init_process_group("gloo", rank=rank, world_size=world)
    summary = []
    for case, source in enumerate(args.spec):
        if source.lstrip().startswith("{"):
            spec_doc, label = json.loads(source), f"spec {case}"
        else:
            with open(source) as f:
                spec_doc, label = json.load(f), source
        start = time.monotonic()
        mine = compare(spec_doc, args.steps, rank, case)
        every = [None] * world
        dist.all_gather_object(every, mine)
        entry = {
            "spec": label,
            "steps": args.steps,
            "loss_rel": worst(every, "loss_rel"),
            "param_diff": worst(every, "param_diff"),
            "fsdp2_vs_fp64": worst(every, "fsdp2_vs_fp64"),
            "meshplan_vs_fp64": worst(every, "meshplan_vs_fp64"),
            "ranks": every,
        }
        summary.append(entry)
        if rank == 0:
            fp64 = (
                f"; fp32 noise (FSDP2 - float64) {entry['fsdp2_vs_fp64']:.2e}"
                if entry["fsdp2_vs_fp64"] is not None
                else ""
            )
            print(
                f"compare-fsdp2 {label}: {world} ranks, {args.steps} steps, loss "
                f"{every[0]['first_loss']:.4f} -> {every[0]['last_loss']:.4f} (rank 0); "
                f"meshplan vs FSDP2: losses within {entry['loss_rel']:.1e} relative, "
                f"parameters within {entry['param_diff']:.2e}{fp64} "
                f"({time.monotonic() - start:.0f} s)",
                flush=True,
            )
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
