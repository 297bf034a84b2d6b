"""meshplan.Session on one rank: zero-copy views, callbacks, errors,
checkpoints, the profile."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import meshplan
from common import adamw_first_step, fsdp_spec, init_value


def open_session(**extra) -> meshplan.Session:
    return meshplan.Session(meshplan.plan(fsdp_spec(1, **extra), 0))


def fill(session):
    session.init_parameters(lambda v: v.copy_(init_value(v.offset, v.local_shape)))


def test_writes_through_views_reach_the_runtime():
    with open_session() as s:
        fill(s)
        first = s.parameters()[0]
        # A write through a torch tensor is seen by numpy and by the runtime:
        # the optimizer updates the written value.
        first.torch().fill_(2.0)
        assert np.all(first.numpy() == 2.0)
        s.on_compute(lambda call: None)  # zero gradients
        s.step()
        expected = adamw_first_step(np.full(first.local_shape, 2.0), np.zeros(first.local_shape))
        np.testing.assert_array_equal(s.tensor(first.id).numpy(), expected)
        # Views share memory: no copy was made anywhere.
        assert first.numpy().ctypes.data == s.tensor(first.id).numpy().ctypes.data
        assert first.torch().data_ptr() == first.numpy().ctypes.data


def test_gradients_written_in_callbacks_drive_the_optimizer():
    with open_session() as s:
        fill(s)
        seen = []

        def compute(call):
            seen.append((call.phase, call.unit, call.microbatch, call.step))
            if call.phase == "forward":
                assert all(p.kind in ("gathered", "param_shard") for p in call.params)
            else:
                for g in call.grads:
                    g.numpy()[...] += 0.25

        s.on_compute(compute)
        s.step()
        assert seen[0] == ("forward", "tok_embeddings", 0, 1)
        assert [x[0] for x in seen].count("backward") == 4
        for p in s.parameters():
            expected = adamw_first_step(init_value(p.offset, p.local_shape), np.full(p.local_shape, 0.25))
            np.testing.assert_allclose(p.numpy(), expected, rtol=0, atol=1e-7)
        assert s.steps_done == 1
        profile = s.profile
        assert profile["wall"] > 0 and profile["callbacks"] > 0
        assert len(profile["instruction_start"]) == len(s.plan.program)


def test_specific_callbacks_win_over_the_fallback():
    with open_session() as s:
        fill(s)
        units = []
        s.on_compute(lambda call: units.append("any"))
        s.on_compute(lambda call: units.append("norm"), "forward", "norm+output")
        s.step()
        assert units.count("norm") == 1 and units.count("any") == 7


def test_a_callback_exception_is_reraised_with_the_instruction():
    with open_session() as s:
        fill(s)

        class BadBatch(Exception):
            pass

        def compute(call):
            if call.unit == "layers.1" and call.phase == "forward":
                raise BadBatch("token 7 out of range")

        s.on_compute(compute)
        with pytest.raises(BadBatch, match="token 7") as e:
            s.step()
        note = "\n".join(e.value.__notes__)
        assert "rank 0" in note and 'instruction "' in note and "forward layers.1" in note
        # The traceback reaches into the callback.
        assert any(f.name == "compute" for f in __import__("traceback").extract_tb(e.value.__traceback__))
        with pytest.raises(meshplan.StepError, match="earlier step failed"):
            s.step()


def test_bfloat16_views_and_wrong_writes():
    spec = fsdp_spec(1, optimizer={"name": "adamw", "param_dtype": "bfloat16", "stochastic_rounding": True, "seed": 7},
                     mixed_precision={"param_dtype": "bfloat16", "reduce_dtype": "float32"})
    with meshplan.Session(meshplan.plan(spec, 0)) as s:
        w = s.parameters()[0]
        assert w.dtype == "bfloat16"
        with pytest.raises(meshplan.ViewError, match="numpy has no bfloat16"):
            w.numpy()
        t = w.torch()
        assert t.dtype == torch.bfloat16 and list(t.shape) == w.local_shape
        t.fill_(1.5)
        assert np.all(w.numpy(raw=True) == np.array([1.5], dtype=np.float32).view(np.uint32) >> 16)
        w.copy_(torch.full(w.local_shape, 0.5, dtype=torch.bfloat16))
        assert float(w.torch()[0, 0]) == 0.5
        with pytest.raises(meshplan.ViewError, match="expected shape"):
            w.copy_(np.zeros((3, 3), dtype=np.float32))
        with pytest.raises(meshplan.ViewError, match="expected dtype bfloat16"):
            w.copy_(np.zeros(w.local_shape, dtype=np.float64))


def test_closed_sessions_and_returned_calls_raise():
    s = open_session()
    fill(s)
    kept = []
    s.on_compute(lambda call: kept.append((call, call.params)))
    s.step()
    call, params = kept[0]
    with pytest.raises(meshplan.ClosedError, match="returned"):
        params[0].numpy()
    with pytest.raises(meshplan.ClosedError):
        call.phase
    w = s.parameters()[0]
    array = w.numpy()
    before = array.copy()
    s.close()
    s.close()  # idempotent
    with pytest.raises(meshplan.ClosedError, match="closed"):
        w.numpy()
    with pytest.raises(meshplan.ClosedError):
        s.step()
    with pytest.raises(meshplan.ClosedError):
        s.parameters()
    # An array made before close keeps the memory alive, even past the
    # session object.
    del s, w, kept, call, params
    gc.collect()
    np.testing.assert_array_equal(array, before)


def test_checkpoint_round_trip_and_bad_directories(tmp_path):
    with open_session() as s:
        fill(s)
        s.on_compute(lambda call: [g.numpy().__iadd__(0.5) for g in call.grads])
        s.step()
        before = {p.id: p.numpy().copy() for p in s.parameters()}
        s.save_checkpoint(str(tmp_path / "ckpt"), model="tiny")
        for p in s.parameters():
            p.numpy()[...] = 0
        state = s.load_checkpoint(str(tmp_path / "ckpt"))
        assert state["step"] == 1
        for p in s.parameters():
            np.testing.assert_array_equal(p.numpy(), before[p.id])
        with pytest.raises(meshplan.CheckpointError, match="nope"):
            s.load_checkpoint(str(tmp_path / "nope"))
        for p in s.parameters():  # nothing changed
            np.testing.assert_array_equal(p.numpy(), before[p.id])


def test_store_errors():
    two = meshplan.plan(fsdp_spec(2), 0)
    with pytest.raises(meshplan.StoreError, match="MESHPLAN_STORE is not set"):
        meshplan.Session(two)
    with pytest.raises(meshplan.StoreError, match="store"):
        meshplan.Session(two, store="ftp://nowhere")
    # A Redis store nobody listens on: an error, not a hang.
    with pytest.raises(meshplan.SessionError):
        s = meshplan.Session(two, store="redis://127.0.0.1:1", timeout=5)
        s.step()


def test_a_peer_that_never_comes_times_out(tmp_path):
    # Rank 1 of a two-rank plan never starts: the first collective gives up
    # at the timeout with an error naming the communicator.
    s = meshplan.Session(meshplan.plan(fsdp_spec(2), 0), store=f"file:{tmp_path}", timeout=2)
    fill(s)
    s.on_compute(lambda call: None)
    with pytest.raises(meshplan.StepError) as e:
        s.step()
    assert e.value.rank == 0 and "communicator" in str(e.value)


def test_init_parameters_exceptions_propagate():
    with open_session() as s:
        def init(view):
            raise KeyError(view.tensor)

        with pytest.raises(KeyError, match="tok_embeddings.weight"):
            s.init_parameters(init)


def test_plan_files_and_directories_open(tmp_path):
    p = meshplan.plan(fsdp_spec(1), 0)
    p.save(str(tmp_path / "rank0.json"))
    with meshplan.Session(str(tmp_path / "rank0.json")) as s:
        assert s.rank == 0 and s.plan == p
    with meshplan.Session(tmp_path, rank=0) as s:
        assert s.plan == p
    with pytest.raises(meshplan.PlanError, match="rank3.json"):
        meshplan.Session(tmp_path, rank=3)


def test_a_callback_writing_the_wrong_shape_fails_the_step():
    with open_session() as s:
        fill(s)

        def compute(call):
            if call.phase == "backward":
                call.grads[0].copy_(np.zeros((2, 2), dtype=np.float32))

        s.on_compute(compute)
        with pytest.raises(meshplan.ViewError, match="expected shape") as e:
            s.step()
        assert any("backward" in n for n in e.value.__notes__)
