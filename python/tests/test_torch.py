"""meshplan.torch in one process: the model document of a torch module, the
driver against plain torch (every mode the spec can ask for), and what it
refuses, by name, before anything communicates. The 8-process comparison
with FSDP2 is test_torch_fsdp2.py; a rank that fails is test_torch_ranks.py."""

from __future__ import annotations

import copy
import json
import math
import sys

import pytest
import torch
from torch import nn

import meshplan
import meshplan.torch as mpt
from common import SOURCE_DIR
from meshplan.errors import ModuleError, SpecError

sys.path.insert(0, str(SOURCE_DIR / "examples" / "torch"))
from llama import CONFIGS, Llama  # noqa: E402

OPT = {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def one_rank(**extra) -> dict:
    spec = {
        "model": "torch",
        "world_size": 1,
        "mesh": {"axes": [{"name": "fsdp", "size": 1}]},
        "data_parallel": {"shard_axes": ["fsdp"]},
        "optimizer": OPT,
    }
    spec.update(extra)
    return spec


def tiny(seed: int = 0) -> Llama:
    model = Llama(CONFIGS["tiny"])
    model.init_weights(seed)
    return model


def batches(n: int, rows: int = 2, seq: int = 16):
    g = torch.Generator().manual_seed(7)
    for _ in range(n):
        t = torch.randint(0, 256, (rows, seq + 1), generator=g)
        yield t[:, :-1], t[:, 1:]


def torch_reference(model, data, microbatches: int = 1):
    """Plain torch: AdamW on the mean of the microbatches' losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"],
                            weight_decay=OPT["weight_decay"], foreach=False)
    losses = []
    for x, y in data:
        parts = [mpt.cross_entropy(model(xm), ym) for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches))]
        loss = sum(parts) / microbatches
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def worst_difference(trainer, model) -> float:
    params = dict(model.named_parameters())
    return max((t.torch().float() - params[t.tensor].detach()).abs().max().item()
               for t in trainer.session.parameters())


# -- the model document ---------------------------------------------------------


TOKEN = torch.zeros(1, 1, dtype=torch.long)


def test_describe_gives_the_tiny_model_file():
    described = mpt.describe(Llama(CONFIGS["tiny"]), example_input=TOKEN)
    with open(SOURCE_DIR / "examples" / "models" / "tiny.json") as f:
        expected = json.load(f)
    assert described["modules"] == expected["modules"]
    # Without a traced forward: registration order (w1, w2, w3), the same
    # parameters.
    plain = json.dumps(mpt.describe(Llama(CONFIGS["tiny"]))["modules"])
    assert plain != json.dumps(expected["modules"])
    assert sorted(plain) == sorted(json.dumps(expected["modules"]))


def test_describe_works_on_the_meta_device():
    with torch.device("meta"):
        model = Llama(CONFIGS["wide"])
    with open(SOURCE_DIR / "examples" / "models" / "wide.json") as f:
        described = mpt.describe(model, example_input=TOKEN.to("meta"))
        assert described["modules"] == json.load(f)["modules"]


def test_a_described_module_plans_like_the_preset():
    spec = meshplan.spec({**one_rank(), "world_size": 8,
                          "mesh": {"axes": [{"name": "fsdp", "size": 8}]}},
                         model=mpt.describe(Llama(CONFIGS["tiny"]), example_input=TOKEN))
    preset = meshplan.spec({**one_rank(), "model": "tiny", "world_size": 8,
                            "mesh": {"axes": [{"name": "fsdp", "size": 8}]}})
    assert spec.units == preset.units
    assert meshplan.plan(spec, 3).to_json() == meshplan.plan(preset, 3).to_json()
    assert spec.data_parallel(3) == (3, 8)


# -- the driver equals plain torch -------------------------------------------------


@pytest.mark.parametrize("checkpointing", [False, True])
def test_one_rank_equals_plain_torch(checkpointing):
    model = tiny()
    expected = copy.deepcopy(model)
    with mpt.Trainer(copy.deepcopy(model), one_rank(), activation_checkpointing=checkpointing) as t:
        losses = [t.step(x, y) for x, y in batches(4)]
        ref = torch_reference(expected, batches(4))
        assert losses == pytest.approx(ref, rel=1e-6)
        assert worst_difference(t, expected) < 1e-6


@pytest.mark.parametrize("reduce", ["every_microbatch", "last_microbatch"])
def test_gradient_accumulation_equals_the_mean_of_microbatches(reduce):
    model = tiny()
    expected = copy.deepcopy(model)
    spec = one_rank(gradient_accumulation={"steps": 2, "reduce": reduce})
    with mpt.Trainer(copy.deepcopy(model), spec) as t:
        assert t.microbatches == 2
        losses = [t.step(x, y) for x, y in batches(3, rows=4)]
        assert losses == pytest.approx(torch_reference(expected, batches(3, rows=4), 2), rel=1e-6)
        assert worst_difference(t, expected) < 1e-6


def test_stochastic_rounding_adamw_trains_bf16_shards():
    # The bf16 stochastic-rounding AdamW: bf16 shards, the loss falls on a
    # repeated batch. (float8 gathers need two ranks: test_torch_ranks.py.)
    sr = one_rank(optimizer={**OPT, "param_dtype": "bfloat16", "stochastic_rounding": True, "seed": 3},
                  mixed_precision={"param_dtype": "bfloat16", "reduce_dtype": "float32"})
    x, y = next(batches(1))
    with mpt.Trainer(tiny(), sr) as t:
        assert {p.dtype for p in t.session.parameters()} == {"bfloat16"}
        losses = [t.step(x, y) for _ in range(6)]
    assert losses[-1] < losses[0] - 0.1, losses


def test_a_sequential_model_trains_with_its_children_as_segments():
    model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 32))
    expected = copy.deepcopy(model)
    spec = one_rank(data_parallel={"shard_axes": ["fsdp"], "units": [["0"], ["1", "2"], ["3"]]})
    with mpt.Trainer(copy.deepcopy(model), spec) as t:
        assert len(t.spec.units) == 3, t.spec.units
        losses = [t.step(x % 32, y % 32) for x, y in batches(3)]
    ref = torch_reference(expected, ((x % 32, y % 32) for x, y in batches(3)))
    assert losses == pytest.approx(ref, rel=1e-6)


# -- refused by name -------------------------------------------------------------


def test_tied_parameters_are_refused():
    model = tiny()
    model.output.weight = model.tok_embeddings.weight
    with pytest.raises(ModuleError, match="'output.weight' is the same tensor as 'tok_embeddings.weight'") as e:
        mpt.describe(model)
    assert e.value.name == "output.weight"


def test_a_buffer_that_needs_syncing_is_refused():
    model = nn.Sequential(nn.Embedding(32, 16), nn.BatchNorm1d(16), nn.Linear(16, 32))
    with pytest.raises(ModuleError, match="buffer '1\\.(running_mean|num_batches_tracked)' of module '1' \\(BatchNorm1d\\)"):
        mpt.describe(model)


def test_a_parameter_no_segment_runs_is_refused():
    model = tiny()
    model.scale = nn.Parameter(torch.ones(1))
    with pytest.raises(ModuleError, match="parameter 'scale' is in no segment") as e:
        mpt.Trainer(model, one_rank())
    assert e.value.name == "scale"


def test_a_module_of_no_plannable_kind_is_refused():
    model = nn.Sequential(nn.Embedding(32, 16), nn.Conv1d(16, 16, 1))
    with pytest.raises(ModuleError, match="module '1' \\(Conv1d\\) holds parameters"):
        mpt.describe(model)


def test_tensor_parallel_is_refused_with_its_pointer():
    spec = one_rank(world_size=2, mesh={"axes": [{"name": "fsdp", "size": 1}, {"name": "tp", "size": 2}]},
                    tensor_parallel={"axis": "tp", "plan": [{"pattern": "layers.*.attention.wq", "style": "colwise"}]})
    with pytest.raises(SpecError) as e:
        mpt.Trainer(tiny(), spec)
    assert e.value.pointer == "/tensor_parallel"


def test_a_spec_naming_what_the_module_lacks_is_refused_with_its_pointer():
    spec = one_rank(float8={"all_gather": True, "modules": ["layers.*.attention.wqq"]},
                    mixed_precision={"param_dtype": "bfloat16", "reduce_dtype": "float32"})
    with pytest.raises(SpecError, match="wqq") as e:
        mpt.Trainer(tiny(), spec)
    assert e.value.pointer == "/float8/modules/0"


def test_a_unit_that_splits_a_block_is_refused():
    spec = one_rank(data_parallel={"shard_axes": ["fsdp"], "units": [
        ["tok_embeddings"], ["layers.0.attention"],
        ["layers.0.attention_norm", "layers.0.ffn_norm", "layers.0.feed_forward"],
        ["layers.1"], ["norm", "output"]]})
    with pytest.raises(ModuleError, match="unit 'layers.0.attention'|FSDP unit") as e:
        mpt.Trainer(tiny(), spec)
    assert e.value.name


def test_a_parameter_changed_outside_the_plan_is_refused():
    model = tiny()
    with mpt.Trainer(model, one_rank()) as t:
        x, y = next(batches(1))
        t.step(x, y)
        with torch.no_grad():
            model.norm.weight.mul_(2)
        with pytest.raises(ModuleError, match="'norm.weight' of the module was changed in place"):
            t.step(x, y)


class _Scaler(nn.Module):
    """A norm that rescales its own weight in forward: an in-place update
    outside the plan's optimizer."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(16))

    def forward(self, x):
        with torch.no_grad():
            self.weight.mul_(0.5)
        return x * self.weight


_Scaler.__name__ = "ScalerNorm"


def test_a_forward_that_writes_its_parameter_is_refused():
    model = nn.Sequential(nn.Embedding(32, 16), _Scaler(), nn.Linear(16, 32))
    with mpt.Trainer(model, one_rank()) as t:
        x, y = next(batches(1))
        with pytest.raises(Exception, match="changed parameter '1.weight' in place"):
            t.step(x % 32, y % 32)


def test_a_module_that_does_not_fit_the_spec_model_is_refused_by_parameter():
    # model_from_spec: the spec's own model ("tiny") is planned, and the
    # module must fit it.
    spec = {**one_rank(), "model": "tiny"}
    with mpt.Trainer(tiny(), spec, model_from_spec=True) as t:
        t.step(*next(batches(1)))
    wide = Llama(CONFIGS["wide"])
    with pytest.raises(ModuleError, match=r"'tok_embeddings.weight' has shape \[256, 512\] but the plan has \[256, 64\]") as e:
        mpt.Trainer(wide, spec, model_from_spec=True)
    assert e.value.name == "tok_embeddings.weight"
    short = Llama(type(CONFIGS["tiny"])(n_layers=1))
    with pytest.raises(ModuleError, match="the plan's parameter 'layers.1.attention_norm.weight' is not a parameter"):
        mpt.Trainer(short, spec, model_from_spec=True)


def test_the_optimizer_recipe_equals_torch_on_the_llama():
    # Issue 32's recipe on a real model, through the torch driver: the
    # plan's warmup + cosine schedule, global-norm clipping (every step)
    # and no-decay groups against torch.optim.AdamW with two param groups,
    # clip_grad_norm_ and LambdaLR; fp32, one process, 20 steps, the same
    # init and data.
    from test_optimizer_step import EPS, LR, MAX_NORM, NO_DECAY, STEPS, WD, factor, no_decay, optimizer

    model = tiny()
    expected = copy.deepcopy(model)
    spec = one_rank(optimizer={**optimizer(), "betas": [0.9, 0.95], "max_norm": 0.25})
    data = list(batches(STEPS))
    with mpt.Trainer(copy.deepcopy(model), spec) as t:
        losses, norms = [], []
        for x, y in data:
            losses.append(t.step(x, y))
            norms.append(t.session.profile["grad_norm"])
        groups = [
            {"params": [p for n, p in expected.named_parameters() if not no_decay(n)], "weight_decay": WD},
            {"params": [p for n, p in expected.named_parameters() if no_decay(n)], "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=EPS, foreach=False)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        ref_losses, ref_norms = [], []
        for x, y in data:
            loss = mpt.cross_entropy(expected(x), y)
            loss.backward()
            ref_norms.append(torch.nn.utils.clip_grad_norm_(expected.parameters(), 0.25).item())
            opt.step()
            sched.step()
            opt.zero_grad()
            ref_losses.append(loss.item())
        assert NO_DECAY and MAX_NORM  # the recipe of test_optimizer_step, clipped harder here
        assert min(ref_norms) > 0.25  # every step clips
        assert norms == pytest.approx(ref_norms, rel=1e-5)
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        assert worst_difference(t, expected) < 1e-5
