"""meshplan.torch: train a ``torch.nn.Module`` under a verified meshplan plan.

Autograd does the math; the plan does the rest. The runtime runs the plan's
program and calls back for each FSDP unit's forward and backward; this module
answers those calls by running the unit's torch submodules on the gathered
parameters the plan hands over (views of the runtime's buffers, not copies),
passing activations and their gradients between units in Python, and adding
each parameter's gradient into the plan's gradient buffer. The plan then
reduces the gradients, and its optimizer updates the shards. Data
parallelism of every kind the planner supports (FSDP, HSDP, extra axes,
gradient accumulation in both reduce modes), float8 all-gather and the bf16
stochastic-rounding AdamW come from the spec.

    model = Llama(config)                       # plain torch
    trainer = meshplan.torch.Trainer(model, "examples/specs/fsdp-fp8-3d.json")
    for step in range(steps):
        loss = trainer.step(tokens, targets)    # this rank's batch

A model reaches the planner as a *model document* (docs/model.schema.json)
that ``describe`` derives from the module: modules in forward order, each
parameter's name, shape and dtype, and the module kinds the planner needs.
The forward order is that of the model's *segments*: the pieces of its
forward the driver can run alone, in order, each taking the previous one's
output (the embedding, each block, the final norm, the output projection
for a decoder; the children of an ``nn.Sequential``; or a list the caller
gives). An FSDP unit is a run of whole segments.

What the plan cannot express is refused by name before any process
communicates (``meshplan.errors.ModuleError``): tied parameters, buffers
that need syncing, parameters no segment runs, shapes or dtypes the plan
does not have, and a parameter changed in place outside the plan's update.
Tensor and pipeline parallelism of torch modules are not supported yet.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

import meshplan as _mp
from meshplan.errors import ModuleError, SpecError

__all__ = [
    "Segment",
    "decoder_segments",
    "sequential_segments",
    "default_segments",
    "describe",
    "Trainer",
    "cross_entropy",
    "ModuleError",
]

_DTYPES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}
_TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


# --------------------------------------------------------------------------
# Segments: the pieces of a forward the driver runs one at a time
# --------------------------------------------------------------------------


@dataclass
class Segment:
    """One piece of the model's forward: ``module`` (at path ``name`` in the
    model) called as ``module(x, *args(x))`` on the previous segment's
    output ``x``."""

    name: str
    module: nn.Module
    args: Callable[[Any], tuple] = field(default=lambda x: ())


def decoder_segments(model: nn.Module) -> list[Segment]:
    """torchtitan's decoder layout: ``tok_embeddings``, each of ``layers``
    (a ModuleList or ModuleDict, each block called as ``block(h,
    freqs_cis)`` when the model has a ``freqs_cis`` buffer, ``block(h)``
    otherwise), ``norm``, ``output``."""
    for name in ("tok_embeddings", "layers", "norm", "output"):
        if not isinstance(getattr(model, name, None), nn.Module):
            raise ModuleError(
                f"{type(model).__name__} has no module {name!r}: it is not a "
                "torchtitan-style decoder (tok_embeddings, layers, norm, "
                "output); pass segments= to Trainer/describe",
                name,
            )
    layers = model.layers
    items = layers.items() if isinstance(layers, nn.ModuleDict) else enumerate(layers)

    def block_args(x):
        freqs = getattr(model, "freqs_cis", None)
        return () if freqs is None else (freqs,)

    out = [Segment("tok_embeddings", model.tok_embeddings)]
    out += [Segment(f"layers.{k}", block, block_args) for k, block in items]
    out += [Segment("norm", model.norm), Segment("output", model.output)]
    return out


def sequential_segments(model: nn.Sequential) -> list[Segment]:
    """Each child of an ``nn.Sequential``, in order."""
    return [Segment(name, child) for name, child in model.named_children()]


def default_segments(model: nn.Module) -> list[Segment]:
    """``sequential_segments`` for an ``nn.Sequential``, else
    ``decoder_segments``."""
    if isinstance(model, nn.Sequential):
        return sequential_segments(model)
    return decoder_segments(model)


# --------------------------------------------------------------------------
# describe: the model document of a torch module
# --------------------------------------------------------------------------


def _kind(path: str, module: nn.Module, top_level: bool) -> str | None:
    """The planner's module kind, or None for a container."""
    cls = type(module).__name__
    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, nn.Linear):
        return "output" if top_level and path == "output" else "linear"
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or cls.endswith("Norm"):
        return "norm"
    return None


def _check_module(model: nn.Module) -> None:
    """Refuses what the plan cannot express: tied parameters and buffers
    that need syncing."""
    seen: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            raise ModuleError(
                f"parameter {name!r} is the same tensor as {seen[id(p)]!r} "
                "(tied or shared parameters): a plan holds every parameter "
                "once, in one unit; untie them (e.g. copy the embedding into "
                "the output) to train under meshplan",
                name,
            )
        seen[id(p)] = name
    for mod_name, mod in model.named_modules():
        persistent = set(mod._buffers) - set(mod._non_persistent_buffers_set)
        for b in sorted(persistent):
            if mod._buffers[b] is None:
                continue
            full = f"{mod_name}.{b}" if mod_name else b
            raise ModuleError(
                f"buffer {full!r} of module {mod_name or '<root>'!r} "
                f"({type(mod).__name__}) is persistent state that would need "
                "syncing across ranks (e.g. BatchNorm running statistics); "
                "meshplan plans parameters only: register it with "
                "persistent=False if it is a constant",
                full,
            )


def _forward_order(segments: Sequence[Segment], example_input: Any) -> dict[int, int]:
    """The order in which a forward on ``example_input`` first calls each
    module (by id), through forward pre-hooks; no gradients are kept."""
    order: dict[int, int] = {}

    def seen(module, args):
        order.setdefault(id(module), len(order))  # returns None: args unchanged

    hooks = [
        mod.register_forward_pre_hook(seen)
        for seg in segments
        for mod in seg.module.modules()
    ]
    try:
        with torch.no_grad():
            x = example_input
            for seg in segments:
                x = seg.module(x, *seg.args(x))
    finally:
        for h in hooks:
            h.remove()
    return order


def _describe_module(
    path: str, local: str, module: nn.Module, top_level: bool, order: dict[int, int]
) -> dict:
    own = list(module.named_parameters(recurse=False))
    # Children in forward order where a traced forward saw them (registration
    # order breaks ties and places modules the forward never called last).
    children = sorted(
        module.named_children(), key=lambda c: order.get(id(c[1]), len(order))
    )
    kind = _kind(path, module, top_level)
    if kind is None and hasattr(module, "n_heads") and hasattr(module, "n_kv_heads"):
        kind = "attention"
    if kind in ("embedding", "linear", "output", "norm"):
        if children and any(True for _ in module.parameters()) and len(own) != len(
            list(module.parameters())
        ):
            raise ModuleError(
                f"module {path!r} ({type(module).__name__}) is a {kind} with "
                "child modules that hold parameters",
                path,
            )
        params = []
        for pname, p in own:
            if p.dtype not in _DTYPES:
                raise ModuleError(
                    f"parameter {path}.{pname} has dtype {p.dtype}; meshplan "
                    "plans float32, bfloat16 and float16 parameters",
                    f"{path}.{pname}",
                )
            params.append(
                {"name": pname, "shape": list(p.shape), "dtype": _DTYPES[p.dtype]}
            )
        if not params:
            raise ModuleError(
                f"module {path!r} ({type(module).__name__}) is a {kind} "
                "without parameters",
                path,
            )
        return {"name": local, "kind": kind, "parameters": params}
    if own:
        raise ModuleError(
            f"module {path!r} ({type(module).__name__}) holds parameters "
            f"({', '.join(n for n, _ in own)}) but is none of the kinds meshplan "
            "plans (nn.Embedding, nn.Linear, a norm); its parameters need a "
            "module of their own",
            path,
        )
    entry: dict[str, Any] = {"name": local, "kind": kind or "block", "children": []}
    if kind is None and (
        "feed_forward" in local or type(module).__name__.endswith("FeedForward")
    ):
        entry["kind"] = "feed_forward"
    if entry["kind"] == "attention":
        entry["n_heads"] = int(module.n_heads)
        entry["n_kv_heads"] = int(module.n_kv_heads)
    for cname, child in children:
        if any(True for _ in child.parameters()):
            entry["children"].append(
                _describe_module(f"{path}.{cname}", cname, child, False, order)
            )
    if not entry["children"]:
        raise ModuleError(f"module {path!r} holds no parameters", path)
    return entry


def describe(
    model: nn.Module,
    segments: Sequence[Segment] | None = None,
    name: str | None = None,
    example_input: Any = None,
) -> dict:
    """The model document (docs/model.schema.json) of a torch module: its
    segments' modules in forward order with every parameter's name, shape
    and dtype. Works on a module on the meta device.

    Within a segment, modules are listed in registration order, unless
    ``example_input`` (what the first segment takes, e.g. token ids of shape
    [1, 1]; meta tensors do for a meta module) is given: then a forward on
    it orders them as the forward calls them (torchtitan's feed-forward
    registers w1, w2, w3 and calls w1, w3, w2). The order decides only how
    a unit's parameters are laid out in its collectives, not the result."""
    _check_module(model)
    segments = list(segments) if segments is not None else default_segments(model)
    order = _forward_order(segments, example_input) if example_input is not None else {}
    paths = {id(m): n for n, m in model.named_modules()}
    covered: set[str] = set()
    modules: list[dict] = []
    tops: dict[str, dict] = {}
    for seg in segments:
        path = paths.get(id(seg.module))
        if path is None or path != seg.name:
            raise ModuleError(
                f"segment {seg.name!r} is not the module at that path of the "
                f"model ({'found at ' + repr(path) if path else 'not in the model'})",
                seg.name,
            )
        for pname, _ in seg.module.named_parameters():
            covered.add(f"{path}.{pname}")
        # A segment "layers.3" nests as layers > 3, as torchtitan names it.
        parts = path.split(".")
        entry = _describe_module(path, parts[-1], seg.module, len(parts) == 1, order)
        if len(parts) == 1:
            modules.append(entry)
            continue
        parent = tops.get(parts[0])
        if parent is None or modules[-1] is not parent:
            parent = {"name": parts[0], "kind": "block", "children": []}
            tops[parts[0]] = parent
            modules.append(parent)
        for part in parts[1:-1]:
            nxt = next((c for c in parent["children"] if c["name"] == part), None)
            if nxt is None:
                nxt = {"name": part, "kind": "block", "children": []}
                parent["children"].append(nxt)
            parent = nxt
        parent["children"].append(entry)
    for pname, _ in model.named_parameters():
        if pname not in covered:
            raise ModuleError(
                f"parameter {pname!r} is in no segment of the forward: no FSDP "
                "unit would hold it (segments: "
                f"{', '.join(s.name for s in segments)})",
                pname,
            )
    return {
        "name": name or type(model).__name__,
        "description": f"described by meshplan.torch from {type(model).__name__}",
        "modules": modules,
    }


# --------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------


@dataclass
class _Unit:
    name: str
    index: int
    segments: list[Segment]
    # plan tensor name -> (segment index within the unit, name in the segment)
    params: dict[str, tuple[int, str]]


@dataclass
class _Saved:
    """What a unit's forward keeps for its backward."""

    x: Any  # the unit's input (a leaf requiring grad, or token ids)
    y: torch.Tensor | None  # its output (the scaled loss for the last unit)
    leaves: dict[str, torch.Tensor] | None  # None: recompute in backward


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """torchtitan's cross entropy: over every token, in float32."""
    return nn.functional.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(0, -1)
    )


class Trainer:
    """Trains ``model`` under a plan of ``spec`` on this rank.

    ``spec``: a spec path, dict or ``meshplan.Spec``; the model it names is
    replaced by ``describe(model, segments)``. The rank, world size and
    store come from the environment ``meshplan run`` (or torchrun) sets
    unless given. The model's current parameter values become the shards'
    initial values (unless it is on the meta device: then call
    ``load_checkpoint`` or fill ``session.parameters()``).

    ``loss_fn(output, targets)`` gives a microbatch's loss (default:
    cross entropy over every token in float32, as torchtitan).
    ``total_steps``: the run's length, for a learning-rate schedule whose
    spec gives none (the schedule, clipping and no-decay groups are the
    plan's: the driver needs nothing else for them).
    ``example_input``: see ``describe``. ``model_from_spec``: plan the model
    the spec names (a preset or model file) instead, and refuse a module
    that does not fit it (a parameter it lacks or has extra, a shape that
    differs), naming the parameter.
    ``activation_checkpointing``: recompute each unit's forward in its
    backward instead of keeping its activations (default: the spec's
    ``activation_checkpointing``, on unless "none").
    ``metrics``: a file to write one JSON line per step to (loss, lr,
    gradient norm, tokens/s, the step's time and its breakdown, peak memory;
    ``meshplan.metrics``; draw with ``python -m meshplan.plot``). Rank 0
    writes it, or every rank when it holds ``{rank}``.
    ``trace``, ``trace_steps``: record what steps ``trace_steps`` (first,
    last; default all) did, per instruction, into ``trace``/rank<R>.json, for
    ``meshplan trace --merge`` and ``--summary`` (docs/observability.md).
    """

    def __init__(
        self,
        model: nn.Module,
        spec: "str | os.PathLike[str] | Mapping[str, Any] | _mp.Spec",
        *,
        segments: Sequence[Segment] | None = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        activation_checkpointing: bool | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        store: str | None = None,
        timeout: float | None = None,
        job: str | None = None,
        example_input: Any = None,
        model_from_spec: bool = False,
        total_steps: int | None = None,
        trace: "str | os.PathLike[str] | None" = None,
        trace_steps: tuple[int, int] | None = None,
        metrics: "str | os.PathLike[str] | None" = None,
    ):
        self.model = model
        self.segments = list(segments) if segments is not None else default_segments(model)
        self.description = describe(model, self.segments, example_input=example_input)
        self.loss_fn = loss_fn or cross_entropy
        override = None if model_from_spec else self.description
        if isinstance(spec, _mp.Spec):
            doc = json.loads(spec.text)
            base = os.path.dirname(spec.origin) if not spec.origin.startswith("<") else "."
            spec = _mp.spec(doc, base_dir=base, model=override, total_steps=total_steps)
        else:
            doc = None
            if isinstance(spec, Mapping):
                doc = dict(spec)
            else:
                with open(os.fspath(spec)) as f:
                    doc = json.load(f)
            spec = _mp.spec(spec, model=override, total_steps=total_steps)
        for key, what in (
            ("tensor_parallel", "tensor parallelism"),
            ("pipeline_parallel", "pipeline parallelism"),
        ):
            if key in doc:
                raise SpecError(
                    f"/{key}: meshplan.torch trains data parallelism (FSDP, "
                    f"HSDP, extra axes, accumulation); {what} of a torch module "
                    "is not supported yet (meshplan-train runs it for its own "
                    "Llama)"
                )
        self.spec = spec
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.data_parallel_rank, self.data_parallel_size = spec.data_parallel(self.rank)
        compute = (doc.get("mixed_precision") or {}).get("param_dtype", "float32")
        self._compute_dtype = _TORCH_DTYPES[compute]
        if activation_checkpointing is None:
            activation_checkpointing = doc.get("activation_checkpointing", "none") != "none"
        self.activation_checkpointing = bool(activation_checkpointing)

        self.plan = _mp.plan(spec, self.rank)
        # Extra axes replicate the parameters, and the plan does not reduce
        # gradients over them (docs/semantics.md): each of their ranks reads
        # other data, so the driver averages each unit's gradients over them
        # on the communicator the plan declares for the trainer
        # (`trainer_<axis>`), as meshplan-train does.
        self._extra_comms = []
        for axis in doc.get("extra_axes", []):
            over = [c["id"] for c in self.plan.communicators if c["axes"] == [axis]]
            trainer = [c for c in over if c.startswith("trainer_")]
            if not over:
                raise SpecError(f"/extra_axes: the plan has no communicator over extra axis {axis!r}")
            self._extra_comms.append((trainer or over)[-1])
        self.microbatches = 1 + max(
            (i["microbatch"] for i in self.plan.program if i["op"] == "compute"),
            default=0,
        )
        self._check_plan_fits()
        self._units = self._map_units(spec.units)
        kwargs: dict[str, Any] = {}
        if store is not None:
            kwargs["store"] = store
        if timeout is not None:
            kwargs["timeout"] = timeout
        if world_size is not None:
            kwargs["world_size"] = world_size
        if job is not None:
            kwargs["job"] = job
        if trace is not None:
            kwargs["trace"] = os.fspath(trace)
        if trace_steps is not None:
            kwargs["trace_steps"] = tuple(trace_steps)
        self.session = _mp.Session(self.plan, rank=self.rank, **kwargs)
        self.session.on_compute(self._compute)
        self._metrics = None
        if metrics is not None:
            from ..metrics import MetricsWriter

            self._metrics = MetricsWriter(metrics, self.rank)
        self._versions = {n: p._version for n, p in model.named_parameters()}
        self._shapes = {n: p.shape for n, p in model.named_parameters()}
        if not any(p.is_meta for p in model.parameters()):
            self._init_from_module()
        self._batch: tuple[list, list] | None = None
        self._saved: dict[tuple[int, int], _Saved] = {}
        self._acts: dict[int, Any] = {}
        self._grads: dict[int, torch.Tensor] = {}
        self._losses: list[float] = []
        self._pack: dict[int, str] = {}
        self._unpack: dict[str, torch.Tensor] | None = None
        self._torch_s = 0.0
        #: The last step's time split (seconds): ``wall`` (step() as the
        #: caller sees it), ``callbacks`` (the runtime's time in compute
        #: callbacks), ``torch`` (in the torch module's forward, autograd and
        #: the gradient adds), ``overhead`` (this driver and the bindings:
        #: callbacks - torch, plus step()'s own time around the runtime).
        self.last_step: dict[str, float] = {}

    # -- set-up --------------------------------------------------------------

    def _map_units(self, units: list[dict]) -> dict[str, _Unit]:
        owner: dict[str, tuple[int, str]] = {}
        for k, seg in enumerate(self.segments):
            for pname, _ in seg.module.named_parameters():
                owner[f"{seg.name}.{pname}"] = (k, pname)
        out: dict[str, _Unit] = {}
        next_segment = 0
        for index, unit in enumerate(units):
            segs = sorted({owner[p][0] for p in unit["params"]})
            if segs != list(range(segs[0], segs[-1] + 1)) or segs[0] != next_segment:
                raise ModuleError(
                    f"FSDP unit {unit['name']!r} holds parameters of segments "
                    f"{[self.segments[s].name for s in segs]}, which are not the "
                    "run of segments after the previous unit's; a unit must be "
                    "whole segments in forward order",
                    unit["name"],
                )
            for s in segs:
                held = {f"{self.segments[s].name}.{n}" for n, _ in self.segments[s].module.named_parameters()}
                missing = sorted(held - set(unit["params"]))
                if missing:
                    raise ModuleError(
                        f"FSDP unit {unit['name']!r} holds part of segment "
                        f"{self.segments[s].name!r} but not {missing[0]!r}: the "
                        "driver runs whole segments, so a unit boundary cannot "
                        "fall inside one (change data_parallel.units)",
                        unit["name"],
                    )
            next_segment = segs[-1] + 1
            out[unit["name"]] = _Unit(
                unit["name"],
                index,
                [self.segments[s] for s in segs],
                {p: (segs.index(owner[p][0]), owner[p][1]) for p in unit["params"]},
            )
        return out

    def _check_plan_fits(self) -> None:
        """Every shard the plan holds is a parameter of the module with the
        same shape and dtype (a plan made for another model is refused)."""
        params = dict(self.model.named_parameters())
        shards = [b for b in self.plan.buffers if b["kind"] == "param_shard"]
        for b in shards:
            p = params.get(b["tensor"])
            if p is None:
                raise ModuleError(
                    f"the plan's parameter {b['tensor']!r} is not a parameter of "
                    f"{type(self.model).__name__}",
                    b["tensor"],
                )
            if list(p.shape) != list(b["global_shape"]):
                raise ModuleError(
                    f"parameter {b['tensor']!r} has shape {list(p.shape)} but the "
                    f"plan has {list(b['global_shape'])}",
                    b["tensor"],
                )
        planned = {b["tensor"] for b in shards}
        for n in params:
            if n not in planned:
                raise ModuleError(f"parameter {n!r} is in no shard of the plan", n)

    def _init_from_module(self) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for t in self.session.parameters():
                src = params[t.tensor]
                box = tuple(
                    slice(o, o + n) for o, n in zip(t.offset, t.local_shape)
                )
                t.torch().copy_(src[box].to(_TORCH_DTYPES.get(t.dtype, torch.float32)))

    # -- the step --------------------------------------------------------------

    def step(self, inputs: Any, targets: Any) -> float:
        """One optimizer step on this rank's batch: ``inputs`` and
        ``targets`` split along dim 0 into the plan's microbatches. Returns
        this rank's loss (the mean over its microbatches)."""
        self._check_untouched()
        m = self.microbatches
        if inputs.shape[0] % m:
            raise ValueError(
                f"batch of {inputs.shape[0]} does not split into the plan's {m} "
                "microbatches"
            )
        start = time.perf_counter()
        lr = self.session.lr  # the rate this step runs with
        self._batch = (list(inputs.chunk(m)), list(targets.chunk(m)))
        self._losses = []
        self._torch_s = 0.0
        try:
            run_start = time.perf_counter()
            self.session.step()
            run = time.perf_counter() - run_start
        finally:
            self._batch = None
            self._saved.clear()
            self._acts.clear()
            self._grads.clear()
        loss = sum(self._losses) / max(len(self._losses), 1)
        wall = time.perf_counter() - start
        profile = self.session.profile
        callbacks = profile["callbacks"]
        self.last_step = {
            "wall": wall,
            "callbacks": callbacks,
            "torch": self._torch_s,
            "overhead": max(callbacks - self._torch_s, 0.0) + (wall - run),
        }
        if self._metrics is not None:
            from ..metrics import step_record

            clipped = profile["grad_norm"] is not None
            tokens = int(inputs.numel()) if hasattr(inputs, "numel") else int(inputs.shape[0])
            self._metrics.write(
                step_record(
                    step=self.session.steps_done,
                    rank=self.rank,
                    loss=float(loss),
                    loss_scope="rank",
                    lr=lr,
                    tokens=tokens * self.data_parallel_size,
                    step_seconds=wall,
                    compute_seconds=self._torch_s + profile["kernels"],
                    communication_seconds=profile["collectives"],
                    exposed_seconds=profile["exposed_collectives"],
                    runtime_seconds=self.last_step["overhead"],
                    grad_norm=profile["grad_norm"] if clipped else None,
                    clip_coefficient=profile["clip_coefficient"] if clipped else None,
                    update_skipped=profile["update_skipped"] if clipped else None,
                )
            )
        return loss

    def _check_untouched(self) -> None:
        for n, p in self.model.named_parameters():
            if p._version != self._versions[n]:
                raise ModuleError(
                    f"parameter {n!r} of the module was changed in place after "
                    "the Trainer took it; the plan owns the parameters (its "
                    "optimizer updates the shards): change them through "
                    "trainer.session.parameters() or a checkpoint",
                    n,
                )

    def _leaves(self, call) -> dict[str, torch.Tensor]:
        """The unit's parameters as tensors autograd can differentiate:
        float32 views as they are, bfloat16 views in bfloat16, float8 ones
        dequantized (stored / scale) into the compute dtype."""
        out = {}
        for v in call.params:
            if v.kind not in ("gathered", "param_shard", "scratch") or not v.tensor:
                continue
            t = v.torch()
            if v.dtype.startswith("float8"):
                t = (t.to(torch.float32) / v.scale).to(self._compute_dtype)
            if list(t.shape) != list(v.global_shape):
                raise ModuleError(
                    f"{v.id}: unit {call.unit!r} reads {list(t.shape)} of "
                    f"{v.tensor!r} ({list(v.global_shape)}); meshplan.torch "
                    "runs a unit on whole (gathered) parameters",
                    v.tensor,
                )
            out[v.tensor] = t.detach().requires_grad_(True)
        return out

    def _run(self, unit: _Unit, leaves: dict[str, torch.Tensor], x: Any) -> Any:
        per_segment: list[dict[str, torch.Tensor]] = [{} for _ in unit.segments]
        for tensor, (s, local) in unit.params.items():
            per_segment[s][local] = leaves[tensor]
        for seg, params in zip(unit.segments, per_segment):
            x = torch.func.functional_call(seg.module, params, (x, *seg.args(x)))
        return x

    def _pack_hook(self, t: torch.Tensor):
        # A saved tensor that is (a view of) a gathered parameter is saved as
        # a reference: the backward's gathered copy replaces it, so the
        # forward's gathered buffer can be freed in between (FSDP's reshard).
        name = self._pack.get(t.untyped_storage().data_ptr())
        if name is None:
            return t
        return (name, t.size(), t.stride(), t.storage_offset())

    def _unpack_hook(self, saved):
        if not isinstance(saved, tuple):
            return saved
        name, size, stride, offset = saved
        return self._unpack[name].detach().as_strided(size, stride, offset)

    def _compute(self, call) -> None:
        if call.shares and list(call.shares) != [0]:
            raise ModuleError(
                "meshplan.torch does not run fault-tolerant batch shares yet"
            )
        unit = self._units.get(call.unit)
        if unit is None:
            raise ModuleError(f"the plan runs unit {call.unit!r}, which the driver does not know")
        mb = call.microbatch
        last = unit.index == len(self._units) - 1
        if call.phase == "forward":
            self._forward(call, unit, mb, last)
        elif call.phase == "backward":
            self._backward(call, unit, mb, last)
        else:
            raise ModuleError(
                f"compute phase {call.phase!r} (a pipeline schedule's) is not "
                "supported by meshplan.torch"
            )

    def _input(self, unit: _Unit, mb: int):
        if unit.index == 0:
            return self._batch[0][mb]
        x = self._acts.pop(mb)
        return x.detach().requires_grad_(x.is_floating_point())

    def _finish(self, unit: _Unit, mb: int, y, last: bool):
        if last:
            loss = self.loss_fn(y, self._batch[1][mb])
            self._losses.append(float(loss.detach()))
            return loss / self.microbatches
        self._acts[mb] = y
        return y

    def _forward(self, call, unit: _Unit, mb: int, last: bool) -> None:
        leaves = self._leaves(call)
        versions = {n: t._version for n, t in leaves.items()}
        x = self._input(unit, mb)
        start = time.perf_counter()
        if self.activation_checkpointing:
            with torch.no_grad():
                y = self._finish(unit, mb, self._run(unit, leaves, x), last)
            saved = _Saved(x, None, None)
        else:
            self._pack = {t.untyped_storage().data_ptr(): n for n, t in leaves.items()}
            with torch.autograd.graph.saved_tensors_hooks(self._pack_hook, self._unpack_hook):
                y = self._finish(unit, mb, self._run(unit, leaves, x), last)
            self._pack = {}
            saved = _Saved(x, y, leaves)
        self._torch_s += time.perf_counter() - start
        self._check_versions(unit, leaves, versions)
        self._saved[(unit.index, mb)] = saved

    def _backward(self, call, unit: _Unit, mb: int, last: bool) -> None:
        saved = self._saved.pop((unit.index, mb), None)
        if saved is None:
            raise ModuleError(f"backward of unit {unit.name!r} (microbatch {mb}) before its forward")
        leaves = self._leaves(call)
        versions = {n: t._version for n, t in leaves.items()}
        grad_y = None if last else self._grads.pop(mb)
        x = saved.x
        start = time.perf_counter()
        if saved.leaves is None:  # recompute the unit's forward
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x = x.detach().requires_grad_(True)
            with torch.enable_grad():
                y = self._finish_again(unit, mb, self._run(unit, leaves, x), last)
            wrt = leaves
        else:
            y, wrt = saved.y, saved.leaves
        names = list(wrt)
        inputs = [wrt[n] for n in names]
        takes_x = isinstance(x, torch.Tensor) and x.requires_grad
        if takes_x:
            inputs.append(x)
        self._unpack = leaves
        try:
            grads = torch.autograd.grad(
                [y], inputs, grad_outputs=None if grad_y is None else [grad_y],
                allow_unused=True,
            )
        finally:
            self._unpack = None
        self._torch_s += time.perf_counter() - start
        self._check_versions(unit, leaves, versions)
        if self._extra_comms:
            grads = self._average_over_extra_axes(names, grads)
        out = {g.tensor: g for g in call.grads}
        for n, g in zip(names, grads):
            if g is None:
                continue
            view = out.get(n)
            if view is None:
                raise ModuleError(f"backward of unit {unit.name!r} has no gradient buffer for {n!r}", n)
            dst = view.torch()
            start = time.perf_counter()
            dst.add_(g.to(dst.dtype))
            self._torch_s += time.perf_counter() - start
        if takes_x:
            self._grads[mb] = grads[-1]

    def _average_over_extra_axes(self, names, grads):
        # One flat float32 all-reduce per extra axis and unit; an unused
        # parameter's gradient counts as zero (every rank must send the same
        # count).
        shapes = self._shapes
        parts = [
            (g if g is not None else torch.zeros(shapes[n])).float().reshape(-1)
            for n, g in zip(names, grads[: len(names)])
        ]
        flat = torch.cat(parts).contiguous()
        for comm in self._extra_comms:
            self.session.trainer_all_reduce(comm, flat.numpy(), "avg")
        out, at = [], 0
        for n in names:
            k = shapes[n].numel()
            out.append(flat[at : at + k].view(shapes[n]))
            at += k
        return out + list(grads[len(names) :])

    def _finish_again(self, unit: _Unit, mb: int, y, last: bool):
        # The recomputed forward: the same loss, not counted twice.
        if last:
            return self.loss_fn(y, self._batch[1][mb]) / self.microbatches
        return y

    def _check_versions(self, unit: _Unit, leaves, versions) -> None:
        for n, t in leaves.items():
            if t._version != versions[n]:
                raise ModuleError(
                    f"unit {unit.name!r} changed parameter {n!r} in place during "
                    "its forward or backward; the plan's optimizer is the only "
                    "writer of parameters",
                    n,
                )

    # -- state -------------------------------------------------------------------

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's shard of every parameter, as (offset, tensor) copies
        keyed by name."""
        return {
            t.tensor: (tuple(t.offset), t.torch().clone())
            for t in self.session.parameters()
        }

    def load_checkpoint(self, path: str) -> None:
        self.session.load_checkpoint(path)

    def save_checkpoint(self, path: str) -> None:
        self.session.save_checkpoint(path)

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
