"""Explicit dtype casts in `meshplan ckpt import|reshard --dtype-cast`
(docs/checkpoint-format.md, "Dtype casts"): refused without the flag (the
message names it); with it, float32 -> bfloat16 -> float32 and float16 ->
bfloat16 / float32 give exactly torch's (bfloat16) and numpy's (float16)
round-to-nearest-even bits on edge values: ties both ways, subnormals of
every format, overflow to infinity, infinities and NaN; the cast checkpoint
verifies and records what it came from. (No plan stores float16 parameters,
so float32 -> float16 narrowing is checked in unittests/Checkpoint against
the compiler's IEEE conversion; float16 sources are checked here.)
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from common import CLI, EXAMPLES, SOURCE_DIR  # noqa: E402

FP32_SPEC = EXAMPLES / "fsdp-tp.json"  # float32 master weights (dp_shard 4 x tp 2)
BF16_SPEC = SOURCE_DIR / "test" / "runtime" / "specs" / "hsdp2x3-sr.json"  # bfloat16 master


def ckpt(*args):
    return subprocess.run([str(CLI), "ckpt", *map(str, args)], capture_output=True, text=True)


def bits(f32: list[int]) -> np.ndarray:
    return np.array(f32, dtype=np.uint32).view(np.float32)


def edge_values() -> np.ndarray:
    """float32 values at the rounding edges of bfloat16 and float16."""
    v = [
        0x00000000, 0x80000000,              # +-0
        0x00000001, 0x80000001, 0x007FFFFF,  # float32 subnormals (bf16 keeps some)
        0x00008000, 0x00018000, 0x00010000,  # bf16 subnormal ties: to even down / up
        0x3F808000, 0x3F818000,              # bf16 ties: even down, odd up
        0x3F808001, 0x3F807FFF,              # just above / below a bf16 tie
        0x7F7FFFFF, 0xFF7FFFFF,              # float32 max: bf16 rounds to +-inf
        0x7F7F7FFF,                          # just below the bf16 overflow tie
        0x7F800000, 0xFF800000,              # +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001,  # NaNs (quiet, negative, signalling)
    ]
    f16 = [
        65504.0, 65519.0, 65519.996, 65520.0, 65536.0, -65520.0,  # float16 overflow edge
        2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 3 * 2.0 ** -25,  # float16 subnormal ties
        2.0 ** -26, 5 * 2.0 ** -25, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -25,
        1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -11 + 2.0 ** -30,  # float16 ties
        -(1 + 2.0 ** -11), 2049.0, 2051.0, 6.1035156e-05,
    ]
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal(4000) * 2.0 ** rng.integers(-30, 20, 4000)).astype(np.float32)
    raw = rng.integers(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([bits(v), np.array(f16, dtype=np.float32), wide, raw])


def tiny_tensors(fill: np.ndarray, torch_dtype) -> dict:
    """The tiny preset's 21 parameters; tok_embeddings holds `fill` first."""
    shapes = {"tok_embeddings.weight": (256, 64), "norm.weight": (64,), "output.weight": (256, 64)}
    for l in range(2):
        p = f"layers.{l}."
        shapes.update({p + "attention_norm.weight": (64,), p + "ffn_norm.weight": (64,),
                       p + "attention.wq.weight": (64, 64), p + "attention.wk.weight": (32, 64),
                       p + "attention.wv.weight": (32, 64), p + "attention.wo.weight": (64, 64),
                       p + "feed_forward.w1.weight": (128, 64),
                       p + "feed_forward.w3.weight": (128, 64),
                       p + "feed_forward.w2.weight": (64, 128)})
    rng = np.random.default_rng(1)
    out = {}
    for name, shape in shapes.items():
        v = rng.standard_normal(shape).astype(np.float32)
        if name == "tok_embeddings.weight":
            flat = v.reshape(-1)
            flat[: fill.size] = fill
        t = torch.from_numpy(v)
        out[name] = t if torch_dtype == torch.float32 else t.to(torch_dtype)
    return out


def write(tmp: pathlib.Path, name: str, tensors: dict) -> pathlib.Path:
    path = tmp / name
    safetensors_torch.save_file(tensors, path)
    return path


def export(checkpoint: pathlib.Path, out: pathlib.Path) -> dict:
    done = ckpt("export", checkpoint, "-o", out)
    assert done.returncode == 0, done.stderr
    return safetensors_torch.load_file(out)


def same_bits(got: torch.Tensor, want: torch.Tensor):
    """Bit for bit, except that a NaN need only stay a NaN (torch's own
    conversions differ in the NaN they give: scalar 0x7FC0, vectorized
    0xFFFF)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.float()), nan)
    g = got.view(torch.int16 if got.element_size() == 2 else torch.int32)[~nan]
    w = want.view(torch.int16 if want.element_size() == 2 else torch.int32)[~nan]
    mismatch = (g != w).nonzero()
    assert mismatch.numel() == 0, (mismatch[:5], g[mismatch[:5]], w[mismatch[:5]])


def one_error_line(run) -> str:
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_import_without_the_flag_is_refused_naming_it(tmp_path):
    src = write(tmp_path, "f32.safetensors", tiny_tensors(edge_values(), torch.float32))
    line = one_error_line(ckpt("import", src, "--spec", BF16_SPEC, "-o", tmp_path / "x"))
    assert line == (f'meshplan: error: {src}: tensor "tok_embeddings.weight" is F32 in the file '
                    "but the plan stores it as BF16 (bfloat16); import converts no dtype without "
                    "--dtype-cast (round to nearest even)")
    assert not (tmp_path / "x").exists()


def test_import_casts_float32_to_bfloat16_as_torch_rounds(tmp_path):
    values = tiny_tensors(edge_values(), torch.float32)
    src = write(tmp_path, "f32.safetensors", values)
    out = tmp_path / "bf16"
    done = ckpt("import", src, "--spec", BF16_SPEC, "--dtype-cast", "-o", out)
    assert done.returncode == 0, done.stderr
    assert "21 parameters float32->bfloat16 (round to nearest even)" in done.stdout
    assert ckpt("verify", out).returncode == 0
    inspect = ckpt("inspect", out).stdout
    assert f"  from:       {src} (safetensors)\n" in inspect
    assert "  converted:  21 parameters float32->bfloat16 (round to nearest even)\n" in inspect
    meta = json.loads((out / "checkpoint.json").read_text())
    assert meta["written_by"]["conversion"].startswith("21 parameters float32->bfloat16")
    got = export(out, tmp_path / "bf16.safetensors")
    for name, v in values.items():
        same_bits(got[name], v.to(torch.bfloat16))
    # The edges, spelled out (torch agrees, checked above).
    emb = got["tok_embeddings.weight"].reshape(-1).view(torch.int16).numpy().astype(np.uint16)
    assert list(emb[5:12]) == [0x0000, 0x0002, 0x0001, 0x3F80, 0x3F82, 0x3F81, 0x3F80]
    assert list(emb[12:15]) == [0x7F80, 0xFF80, 0x7F7F]


def test_import_casts_float16_exactly_and_to_bfloat16(tmp_path):
    # float16 sources: every float16 bit pattern, widened exactly to float32
    # (numpy) and rounded once to bfloat16 (torch, through float32).
    every = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    values = tiny_tensors(np.zeros(0, np.float32), torch.float32)
    f16 = {k: torch.from_numpy(v.numpy().astype(np.float16)) for k, v in values.items()}
    f16["tok_embeddings.weight"] = torch.from_numpy(every.copy()).reshape(256, 256)[:, :64].clone()
    f16["output.weight"] = torch.from_numpy(every.copy()).reshape(256, 256)[:, 64:128].clone()
    src = write(tmp_path, "f16.safetensors", f16)
    line = one_error_line(ckpt("import", src, "--spec", FP32_SPEC, "--model", "tiny", "-o",
                               tmp_path / "x"))
    assert "is F16 in the file but the plan stores it as F32 (float32); import converts no " \
           "dtype without --dtype-cast" in line
    wide = tmp_path / "f32"
    assert ckpt("import", src, "--spec", FP32_SPEC, "--model", "tiny", "--dtype-cast", "-o",
                wide).returncode == 0
    got = export(wide, tmp_path / "wide.safetensors")
    for name, v in f16.items():
        want = torch.from_numpy(v.numpy().astype(np.float32))  # numpy's exact widening
        same_bits(got[name], want)
    narrow = tmp_path / "bf16"
    assert ckpt("import", src, "--spec", BF16_SPEC, "--dtype-cast", "-o", narrow).returncode == 0
    got = export(narrow, tmp_path / "narrow.safetensors")
    for name, v in f16.items():
        same_bits(got[name], v.float().to(torch.bfloat16))


def test_reshard_casts_and_keeps_or_resets_the_optimizer(tmp_path):
    values = tiny_tensors(edge_values(), torch.float32)
    src = write(tmp_path, "f32.safetensors", values)
    f32 = tmp_path / "f32"
    assert ckpt("import", src, "--spec", FP32_SPEC, "--model", "tiny", "-o", f32).returncode == 0
    line = one_error_line(ckpt("reshard", f32, "--spec", BF16_SPEC, "-o", tmp_path / "x"))
    assert line.startswith(f'meshplan: error: {f32}: tensor "tok_embeddings.weight" is float32 in '
                           "the checkpoint but bfloat16 in the plan (no conversion on load "
                           "without an explicit cast: --dtype-cast)")
    assert not (tmp_path / "x").exists()
    line = one_error_line(ckpt("reshard", f32, "--spec", BF16_SPEC, "--dtype-cast",
                               "--optimizer-state", "drop", "-o", tmp_path / "x"))
    assert line == 'meshplan: error: --optimizer-state: "drop": expected keep or reset'

    bf16 = tmp_path / "bf16"
    done = ckpt("reshard", f32, "--spec", BF16_SPEC, "--dtype-cast", "-o", bf16)
    assert done.returncode == 0, done.stderr
    assert "21 parameters float32->bfloat16 (round to nearest even)" in done.stdout
    assert ckpt("verify", bf16).returncode == 0
    inspect = ckpt("inspect", bf16).stdout
    assert f"  from:       {f32} (meshplan checkpoint of mesh dp_shard=4,tp=2, step 0)\n" in inspect
    got = export(bf16, tmp_path / "bf16.safetensors")
    for name, v in values.items():
        same_bits(got[name], v.to(torch.bfloat16))
    # And back: bfloat16 widens to float32 exactly.
    back = tmp_path / "back"
    done = ckpt("reshard", bf16, "--spec", FP32_SPEC, "--model", "tiny", "--dtype-cast", "-o", back)
    assert done.returncode == 0, done.stderr
    assert "21 parameters bfloat16->float32" in done.stdout
    got = export(back, tmp_path / "back.safetensors")
    for name, v in values.items():
        same_bits(got[name], v.to(torch.bfloat16).float())

    reset = tmp_path / "reset"
    done = ckpt("reshard", f32, "--spec", BF16_SPEC, "--dtype-cast", "--optimizer-state", "reset",
                "-o", reset)
    assert done.returncode == 0, done.stderr
    assert "optimizer state reset" in done.stdout
    meta = json.loads((reset / "checkpoint.json").read_text())
    assert meta["training"]["step"] == 0
    assert meta["written_by"]["conversion"].endswith("optimizer state reset")
