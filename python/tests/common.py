"""What the Python suites share: small specs and the AdamW reference."""

from __future__ import annotations

import os
import pathlib

import numpy as np

SOURCE_DIR = pathlib.Path(
    os.environ.get("MESHPLAN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2])
)
BUILD_DIR = pathlib.Path(os.environ.get("MESHPLAN_BUILD_DIR", SOURCE_DIR / "build"))
CLI = BUILD_DIR / "bin" / "meshplan"
EXAMPLES = SOURCE_DIR / "examples" / "specs"

LR, WEIGHT_DECAY, EPS = 1e-3, 0.01, 1e-8


def fsdp_spec(ranks: int, **extra) -> dict:
    """The tiny preset sharded over one FSDP axis of `ranks` devices."""
    spec = {
        "model": "tiny",
        "mesh": {"axes": [{"name": "dp", "size": ranks}]},
        "data_parallel": {"shard_axes": ["dp"]},
        "optimizer": {"name": "adamw", "lr": LR, "weight_decay": WEIGHT_DECAY, "eps": EPS},
    }
    spec.update(extra)
    return spec


def adamw_first_step(p: np.ndarray, g: np.ndarray) -> np.ndarray:
    """torch.optim.AdamW's first step (bias-corrected m = g, v = g^2) in
    float32, as the runtime's kernel computes it."""
    p = p.astype(np.float32) * np.float32(1 - LR * WEIGHT_DECAY)
    g = g.astype(np.float32)
    return p - np.float32(LR) * g / (np.abs(g) + np.float32(EPS))


def init_value(offset, shape, rank_salt: int = 0) -> np.ndarray:
    """A deterministic fill from global coordinates: every layout gives the
    same global tensor."""
    grids = np.meshgrid(*[np.arange(o, o + n) for o, n in zip(offset, shape)], indexing="ij")
    value = np.zeros(shape, dtype=np.float64)
    for axis, grid in enumerate(grids):
        value += np.sin(grid * (axis + 1.3) + rank_salt)
    return (value / 10).astype(np.float32)
