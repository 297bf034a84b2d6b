"""One rank of test_torch_ranks.py, run by `meshplan run -n WORLD` (RANK,
WORLD_SIZE and MESHPLAN_STORE from the environment).

    torch_worker.py float8 OUT        float8 all-gather + SR AdamW, 8 steps
    torch_worker.py fail OUT RANK     RANK raises in layers.0's forward of step 2
    torch_worker.py extra OUT         FSDP 2 x an extra axis of 2, accumulating
                                      2 microbatches, against float64 plain
                                      torch on the global batch
    torch_worker.py cpp OUT SPEC CK0 CKN STEPS DATA
                                      from checkpoint CK0, STEPS steps on
                                      meshplan-train's data (the text DATA);
                                      then compare with meshplan-train's
                                      checkpoint CKN, and with float64 plain
                                      torch on the global batch (the scale of
                                      float32 noise)
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

import torch

from common import SOURCE_DIR

sys.path.insert(0, str(SOURCE_DIR / "examples" / "torch"))
from data import TextData  # noqa: E402
from llama import CONFIGS, Llama  # noqa: E402

import meshplan.torch as mpt  # noqa: E402

TIMEOUT = 40  # the fail mode's session timeout (seconds)
OPT = {"name": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def spec(world: int, **extra) -> dict:
    return {
        "model": "torch",
        "world_size": world,
        "mesh": {"axes": [{"name": "fsdp", "size": world}]},
        "data_parallel": {"shard_axes": ["fsdp"]},
        "optimizer": OPT,
        **extra,
    }


def data(dp: int):
    g = torch.Generator().manual_seed(dp)
    t = torch.randint(0, 256, (2, 17), generator=g)
    return t[:, :-1], t[:, 1:]


def main():
    mode, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model = Llama(CONFIGS["tiny"])
    model.init_weights(0)
    result = {}
    if mode == "float8":
        bf16 = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
        doc = spec(world, mixed_precision=bf16,
                   float8={"all_gather": True, "scaling": "tensorwise"},
                   optimizer={**OPT, "param_dtype": "bfloat16", "stochastic_rounding": True, "seed": 5})
        with mpt.Trainer(model, doc) as t:
            result["dtypes"] = sorted({b["dtype"] for b in t.plan.buffers})
            result["shards"] = sorted({p.dtype for p in t.session.parameters()})
            x, y = data(t.data_parallel_rank)
            result["losses"] = [t.step(x, y) for _ in range(8)]
    elif mode == "extra":
        doc = spec(world, mesh={"axes": [{"name": "fsdp", "size": world // 2}, {"name": "abcd", "size": 2}]},
                   extra_axes=["abcd"], gradient_accumulation={"steps": 2, "reduce": "every_microbatch"})
        reference = copy.deepcopy(model).double()
        steps = 4

        def rows(step, dp):
            g = torch.Generator().manual_seed(100 * step + dp)
            t = torch.randint(0, 256, (4, 17), generator=g)
            return t[:, :-1], t[:, 1:]

        with mpt.Trainer(model, doc) as t:
            dp, dps = t.data_parallel_rank, t.data_parallel_size
            result["dp"] = [dp, dps, t.microbatches]
            result["losses"] = [t.step(*rows(s, dp)) for s in range(1, steps + 1)]
            mine = {p.tensor: (p.offset, p.torch().clone()) for p in t.session.parameters()}
        opt = torch.optim.AdamW(reference.parameters(), lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"],
                                weight_decay=OPT["weight_decay"], foreach=False)
        initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
        for s in range(1, steps + 1):
            xs, ys = zip(*(rows(s, d) for d in range(dps)))
            mpt.cross_entropy(reference(torch.cat(xs)), torch.cat(ys)).backward()
            opt.step()
            opt.zero_grad()
        ref = dict(reference.named_parameters())
        diff2 = update2 = 0.0
        for n, (offset, value) in mine.items():
            box = tuple(slice(o, o + k) for o, k in zip(offset, value.shape))
            diff2 += (value.double() - ref[n].detach()[box]).square().sum().item()
            update2 += (ref[n].detach()[box] - initial[n][box]).square().sum().item()
        result["rel_fp64"] = (diff2 / update2) ** 0.5
    elif mode == "cpp":
        spec_file, ck0, ckn, steps, path = sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7]
        text = TextData(path)
        reference = copy.deepcopy(model).double()
        with mpt.Trainer(model, spec_file) as t:
            t.load_checkpoint(ck0)
            dp, dps = t.data_parallel_rank, t.data_parallel_size
            # The checkpoint's values, for the float64 run.
            with torch.no_grad():
                start = {p.tensor: (p.offset, p.torch().clone()) for p in t.session.parameters()}
            result["losses"] = [
                t.step(*text.rank_batch(0, s, t.microbatches, dp, 2, 32)) for s in range(1, steps + 1)
            ]
            mine = {p.tensor: (p.offset, p.torch().clone()) for p in t.session.parameters()}
            t.load_checkpoint(ckn)
            theirs = {p.tensor: p.torch().clone() for p in t.session.parameters()}
        # float64 plain torch from the same values (every rank holds the
        # whole init: it is the same on every rank) on the global batch.
        params = dict(reference.named_parameters())
        with torch.no_grad():
            for n, p in model.named_parameters():
                params[n].copy_(p.double())
        opt = torch.optim.AdamW(reference.parameters(), lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"],
                                weight_decay=OPT["weight_decay"], foreach=False)
        for s in range(1, steps + 1):
            xs, ys = zip(*(text.rank_batch(0, s, 1, d, 2, 32) for d in range(dps)))
            mpt.cross_entropy(reference(torch.cat(xs)), torch.cat(ys)).backward()
            opt.step()
            opt.zero_grad()
        # Over this rank's shards: the largest difference, and the relative
        # L2 size of the differences against the 5 steps' update.
        worst = noise = cpp_noise = 0.0
        diff2 = diff64 = cpp64 = update2 = 0.0
        for n, (offset, value) in mine.items():
            if not value.numel():
                continue
            box = tuple(slice(o, o + k) for o, k in zip(offset, value.shape))
            r64 = params[n].detach()[box]
            d, d64, c64 = value - theirs[n], value.double() - r64, theirs[n].double() - r64
            worst = max(worst, d.abs().max().item())
            noise = max(noise, d64.abs().max().item())
            cpp_noise = max(cpp_noise, c64.abs().max().item())
            diff2 += d.double().square().sum().item()
            diff64 += d64.square().sum().item()
            cpp64 += c64.square().sum().item()
            update2 += (value - start[n][1]).double().square().sum().item()
        result.update(worst=worst, fp64_noise=noise, cpp_fp64_noise=cpp_noise,
                      rel=(diff2 / update2) ** 0.5, rel_fp64=(diff64 / update2) ** 0.5,
                      cpp_rel_fp64=(cpp64 / update2) ** 0.5)
    else:
        failing = int(sys.argv[3])
        layer = model.layers["0"]
        forward = layer.forward
        calls = {"n": 0}

        def flaky(*args):
            calls["n"] += 1
            if rank == failing and calls["n"] == 2:
                raise RuntimeError("injected failure in layers.0")
            return forward(*args)

        layer.forward = flaky
        t = mpt.Trainer(model, spec(world), timeout=TIMEOUT)
        x, y = data(t.data_parallel_rank)
        start = time.monotonic()
        try:
            for _ in range(3):
                start = time.monotonic()
                t.step(x, y)
            result["raised"] = None
        except Exception as e:  # noqa: BLE001 - the test reads what it was
            result["raised"] = type(e).__name__
            result["message"] = str(e)
            result["rank"] = getattr(e, "rank", None)
        # How long the failing step took on this rank.
        result["step_seconds"] = time.monotonic() - start
        t.close()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
