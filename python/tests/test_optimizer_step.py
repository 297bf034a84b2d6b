"""The runtime's optimizer step against torch's recipe: torch.optim.AdamW
with two param groups (no weight decay on the norms and the embedding),
torch.nn.utils.clip_grad_norm_, and torchtitan's warmup + cosine schedule
under LambdaLR; fp32, one process, 20 steps, the same initial weights and
the same gradient function (a pull of every weight towards per-step
targets, computed from the current weights, so each side follows its own
trajectory). Also Session.lr / set_lr and a skipped non-finite step."""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch

import meshplan
from common import fsdp_spec, init_value

STEPS, LR, WD, EPS, MAX_NORM = 20, 2e-3, 0.1, 1e-8, 0.5
WARMUP, MIN_LR_FACTOR = 5, 0.1
NO_DECAY = ["**norm", "tok_embeddings"]


def optimizer() -> dict:
    return {
        "name": "adamw",
        "lr": LR,
        "betas": [0.9, 0.95],
        "eps": EPS,
        "weight_decay": WD,
        "lr_schedule": {
            "warmup_steps": WARMUP,
            "decay_type": "cosine",
            "min_lr_factor": MIN_LR_FACTOR,
            "total_steps": STEPS,
        },
        "max_norm": MAX_NORM,
        "no_decay": NO_DECAY,
    }


def factor(current: int) -> float:
    """torchtitan's linear_warmup_stable_decay for this schedule (no
    decay_ratio: decay over every step after the warmup), LambdaLR's 0-based
    index."""
    warmup, decay = WARMUP, STEPS - WARMUP
    stable = STEPS + 1 - warmup - decay
    if current < warmup:
        return float((current + 1) / warmup)
    if current < warmup + stable:
        return 1.0
    progress = float(current + 1 - (warmup + stable)) / decay
    return MIN_LR_FACTOR + (1 - MIN_LR_FACTOR) * (0.5 * (1.0 + math.cos(math.pi * progress)))


def gradient(name: str, step: int, w: np.ndarray) -> np.ndarray:
    """0.5 (w - target), target drawn per (tensor, step): large enough that
    clipping at 0.5 scales every step."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), step])
    target = rng.standard_normal(w.shape).astype(np.float32)
    return (np.float32(0.5) * (w - target)).astype(np.float32)


def no_decay(name: str) -> bool:
    return name.endswith("norm.weight") or name == "tok_embeddings.weight"


def open_session(**opt) -> meshplan.Session:
    o = optimizer()
    o.update(opt)
    s = meshplan.Session(meshplan.plan(fsdp_spec(1, optimizer=o), 0))
    s.init_parameters(lambda v: v.copy_(init_value(v.offset, v.local_shape)))
    return s


def pull(s: meshplan.Session, poison_step: int = 0):
    def compute(call):
        if call.phase != "backward":
            return
        weights = {p.tensor: p.numpy() for p in call.params}
        for g in call.grads:
            g.numpy()[...] += gradient(g.tensor, call.step, weights[g.tensor])
            if call.step == poison_step and g.tensor == "tok_embeddings.weight":
                g.numpy().flat[0] = np.nan

    s.on_compute(compute)


def test_the_step_equals_torchs_adamw_with_groups_clipping_and_schedule():
    with open_session() as s:
        pull(s)
        params = {p.tensor: p for p in s.parameters()}
        names = sorted(params)
        # torch's side, from the same initial weights.
        ref = {
            n: torch.nn.Parameter(torch.from_numpy(init_value([0] * len(params[n].global_shape), params[n].global_shape)))
            for n in names
        }
        groups = [
            {"params": [ref[n] for n in names if not no_decay(n)], "weight_decay": WD},
            {"params": [ref[n] for n in names if no_decay(n)], "weight_decay": 0.0},
        ]
        assert groups[1]["params"], "the no_decay group selects something"
        opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=EPS, foreach=False)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        for step in range(1, STEPS + 1):
            # The same rate, to the bit, before each step.
            assert s.lr == opt.param_groups[0]["lr"], step
            for n in names:
                ref[n].grad = torch.from_numpy(gradient(n, step, ref[n].detach().numpy().copy()))
            norm = torch.nn.utils.clip_grad_norm_([ref[n] for n in names], MAX_NORM, foreach=False)
            opt.step()
            sched.step()
            s.step()
            prof = s.profile
            assert not prof["update_skipped"]
            assert prof["clip_coefficient"] < 1.0
            np.testing.assert_allclose(prof["grad_norm"], float(norm), rtol=2e-6)
        worst = 0.0
        for n in names:
            got, want = params[n].numpy(), ref[n].detach().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=n)
            worst = max(worst, float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3))))
        print(f"max relative difference after {STEPS} steps: {worst:.3g}")


def test_the_plan_carries_the_optimizer_step():
    o = meshplan.plan(fsdp_spec(1, optimizer=optimizer()), 0).optimizer
    assert o["max_norm"] == MAX_NORM and o["norm_type"] == "2"
    assert o["lr_schedule"]["total_steps"] == STEPS and o["lr_schedule"]["decay_ratio"] is None
    assert "norm.weight" in o["no_decay"] and "output.weight" not in o["no_decay"]


def test_set_lr_overrides_the_schedule_until_cleared():
    with open_session() as s:
        pull(s)
        assert s.lr == LR * factor(0)
        s.set_lr(1e-4)
        assert s.lr == 1e-4
        s.step()
        assert s.lr == 1e-4
        s.set_lr(None)
        assert s.lr == LR * factor(1)
        try:
            s.set_lr(-1.0)
        except meshplan.Error as e:
            assert "learning rate" in str(e)
        else:
            raise AssertionError("a negative rate was accepted")


def test_a_non_finite_norm_skips_the_update_and_says_so():
    with open_session() as s:
        pull(s, poison_step=2)
        s.step()
        before = {p.tensor: p.numpy().copy() for p in s.parameters()}
        state = [t.numpy().copy() for t in s.optimizer_state()]
        s.step()
        prof = s.profile
        assert prof["update_skipped"] and math.isnan(prof["grad_norm"])
        for p in s.parameters():
            np.testing.assert_array_equal(p.numpy(), before[p.tensor])
        for t, old in zip(s.optimizer_state(), state):
            np.testing.assert_array_equal(t.numpy(), old)
        s.step()
        assert not s.profile["update_skipped"]
        assert any(not np.array_equal(p.numpy(), before[p.tensor]) for p in s.parameters())
