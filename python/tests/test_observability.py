"""What a run did: metrics files (meshplan.metrics), their plots
(meshplan.plot), and executed-step traces from the Python driver
(Trainer(trace=...)), read back by `meshplan trace`. docs/observability.md.
The 8-rank trace through meshplan-train is test/trainer/trace.sh."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

import meshplan
import meshplan.torch as mpt
from common import BUILD_DIR, SOURCE_DIR
from meshplan.errors import SessionError
from meshplan.metrics import MetricsError, MetricsWriter, read_metrics, REQUIRED_KEYS
from meshplan.plot import main as plot_main

sys.path.insert(0, str(SOURCE_DIR / "examples" / "torch"))
from llama import CONFIGS, Llama  # noqa: E402

MESHPLAN = BUILD_DIR / "bin" / "meshplan"


def one_rank_spec(**extra) -> dict:
    spec = {
        "model": "torch",
        "world_size": 1,
        "mesh": {"axes": [{"name": "fsdp", "size": 1}]},
        "data_parallel": {"shard_axes": ["fsdp"]},
        "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                      "weight_decay": 0.1, "max_norm": 1.0},
    }
    spec.update(extra)
    return spec


def batches(n: int, rows: int = 2, seq: int = 16):
    g = torch.Generator().manual_seed(7)
    for _ in range(n):
        t = torch.randint(0, 256, (rows, seq + 1), generator=g)
        yield t[:, :-1], t[:, 1:]


def test_trainer_writes_metrics_and_trace(tmp_path):
    model = Llama(CONFIGS["tiny"])
    model.init_weights(0)
    metrics = tmp_path / "run.jsonl"
    trace = tmp_path / "trace"
    losses = []
    with mpt.Trainer(model, one_rank_spec(), metrics=metrics, trace=trace, trace_steps=(2, 3)) as t:
        for x, y in batches(4):
            losses.append(t.step(x, y))
    run = read_metrics(metrics)
    assert run.gaps == []
    assert [r["step"] for r in run.records] == [1, 2, 3, 4]
    for r, loss in zip(run.records, losses):
        assert set(REQUIRED_KEYS) <= set(r)
        assert r["loss"] == pytest.approx(loss, rel=1e-6)
        assert r["loss_scope"] == "rank"
        assert r["tokens"] == 2 * 16
        assert r["step_seconds"] > 0 and r["tokens_per_second"] > 0
        assert r["lr"] == pytest.approx(1e-3)
        assert r["grad_norm"] > 0 and 0 < r["clip_coefficient"] <= 1
        assert r["peak_rss_bytes"] > 10 << 20
    # The trace: steps 2 and 3 of rank 0, read by the CLI.
    out = subprocess.run([MESHPLAN, "trace", "--summary", trace], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "1 of 1 ranks traced, steps 2..3" in out.stdout
    doc = json.loads((trace / "rank0.json").read_text())
    assert [s["step"] for s in doc["steps"]] == [2, 3]
    assert len(doc["steps"][0]["begin_us"]) == len(doc["instructions"]) > 0


def test_session_trace_arguments(tmp_path):
    spec = meshplan.spec(one_rank_spec(model="tiny"))
    plan = meshplan.plan(spec, rank=0)
    with pytest.raises(SessionError, match=r"trace_steps: needs trace=DIR"):
        meshplan.Session(plan, trace_steps=(1, 2))
    with pytest.raises(SessionError, match=r"trace_steps: expected \(first, last\) with 1 <= first <= last, got \(3, 2\)"):
        meshplan.Session(plan, trace=str(tmp_path / "t"), trace_steps=(3, 2))


def write_lines(path, lines):
    path.write_text("".join(lines))
    return path


def good(step, loss=5.0):
    r = {k: 0 for k in REQUIRED_KEYS}
    r.update(step=step, loss=loss, step_seconds=0.01, tokens=64, tokens_per_second=6400.0)
    return json.dumps(r) + "\n"


def test_read_metrics_marks_gaps(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [
        good(1), "{not json\n", good(2), json.dumps({"step": 3}) + "\n", good(3),
        good(3), json.dumps([1, 2]) + "\n", good(4, loss=4.0), '{"step": 5, "lo',
    ])
    run = read_metrics(path)
    assert [r["step"] for r in run.records] == [1, 2, 3, 4]
    assert [n for n, _ in run.gaps] == [2, 4, 6, 7, 9]
    reasons = dict(run.gaps)
    assert reasons[2].startswith("not JSON")
    assert reasons[4] == 'no "rank"'
    assert reasons[6] == "step 3 does not follow step 3"
    assert reasons[7] == "not a JSON object"
    assert "cut short" in reasons[9]
    steps, loss = run.series("loss")
    # A break (NaN) between every two steps a bad line separates.
    assert steps == [1, 2, 2, 3, 3, 4, 4]
    assert [math.isnan(v) for v in loss] == [False, True, False, True, False, True, False]


def test_read_metrics_errors(tmp_path):
    with pytest.raises(MetricsError, match=r"cannot read"):
        read_metrics(tmp_path / "absent.jsonl")
    with pytest.raises(MetricsError, match=r"no step in the file \(line 1: not JSON"):
        read_metrics(write_lines(tmp_path / "bad.jsonl", ["nope\n"]))
    with pytest.raises(MetricsError, match=r"no step in the file \(it is empty\)"):
        read_metrics(write_lines(tmp_path / "empty.jsonl", []))
    w = MetricsWriter(tmp_path / "w.jsonl")
    with pytest.raises(MetricsError, match=r"lacks"):
        w.write({"step": 1})
    with pytest.raises(MetricsError, match=r"cannot write"):
        MetricsWriter(tmp_path / "no" / "dir.jsonl")
    # Without {rank}, only rank 0 writes.
    MetricsWriter(tmp_path / "r.jsonl", rank=3).close()
    assert not (tmp_path / "r.jsonl").exists()
    MetricsWriter(tmp_path / "r{rank}.jsonl", rank=3).close()
    assert (tmp_path / "r3.jsonl").exists()


def test_plot(tmp_path, capsys):
    a = write_lines(tmp_path / "a.jsonl", [good(s, 6 - s * 0.1) for s in range(1, 20)])
    b = write_lines(tmp_path / "b.jsonl", [good(s, 6 - s * 0.05) for s in range(1, 10)] + ["oops\n"] + [good(s) for s in range(10, 20)])
    out = tmp_path / "cmp.png"
    assert plot_main([str(a), str(b), "-o", str(out), "--label", "A", "--label", "B"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert f"{b}:10: not JSON" in err and "(shown as a gap)" in err
    # A file with no step: exit 2, nothing written.
    bad = write_lines(tmp_path / "bad.jsonl", ["x\n"])
    out2 = tmp_path / "none.png"
    assert plot_main([str(a), str(bad), "-o", str(out2)]) == 2
    assert not out2.exists()
    assert f"{bad}: no step in the file" in capsys.readouterr().err
    assert plot_main([str(a), "-o", str(out2), "--label", "x", "--label", "y"]) == 2
    assert not out2.exists()
