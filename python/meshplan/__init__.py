"""meshplan: a declarative parallelism planner and runtime.

State the parallelism you want (a spec: an N-D device mesh with named axes,
FSDP/HSDP, tensor parallel, float8 all-gather, the optimizer); meshplan plans
every rank's communicators, collectives and buffers, proves that all ranks
agree, and runs the plan on Gloo (CPU) or NCCL (CUDA)::

    import meshplan
    spec = meshplan.Spec.from_file("examples/specs/fsdp-tp.json")
    plans = meshplan.plan(spec)               # every rank's plan
    assert meshplan.verify(plans)["ok"]
    print(meshplan.plan(spec, rank=0).explain())

    with meshplan.Session(plans[rank]) as session:   # store from the env
        session.on_compute(forward_backward)          # your model's math
        session.init_parameters(init)
        for _ in range(steps):
            session.step()

See docs/python.md. The C++ library does all the work; this package binds it
(no semantics are re-derived in Python).
"""

from __future__ import annotations

import json as _json
import os as _os
from typing import Any, Mapping

from . import errors
from ._meshplan import ComputeCall, Plan, Session, Spec, Tensor, load_plans
from ._meshplan import _verify
from ._meshplan import plan as _plan
from ._meshplan import _tune
from .errors import *  # noqa: F401,F403  (Error, SpecError, ...)

__version__ = "0.1.0"

__all__ = [
    "Spec",
    "Plan",
    "Session",
    "Tensor",
    "ComputeCall",
    "spec",
    "plan",
    "verify",
    "VerifyResult",
    "load_plans",
    "tune",
    "errors",
] + errors.__all__


def spec(
    source: "str | _os.PathLike[str] | Mapping[str, Any]",
    *,
    base_dir: "str | _os.PathLike[str] | None" = None,
    world_size: int | None = None,
    model: "str | Mapping[str, Any] | None" = None,
    total_steps: int | None = None,
) -> Spec:
    """A Spec from a file path or from a dict (the JSON document as Python
    objects). A relative "model" path resolves against the file's directory,
    or ``base_dir`` (default: the working directory) for a dict. ``model``,
    a model document (dict or JSON text, docs/model.schema.json; what
    ``meshplan.torch.describe`` returns), replaces the model the spec
    names. ``total_steps``: the run's length, for an
    ``optimizer.lr_schedule`` that gives no ``total_steps`` (a trainer's
    step count)."""
    if model is not None and not isinstance(model, str):
        model = _json.dumps(model)
    if isinstance(source, Mapping):
        text = _json.dumps(source)
        return Spec.from_json(
            text,
            base_dir=_os.fspath(base_dir or "."),
            world_size=world_size,
            model=model,
            total_steps=total_steps,
        )
    return Spec.from_file(
        _os.fspath(source), world_size=world_size, model=model, total_steps=total_steps
    )


_load_spec = spec


def _refuse_unknown(function: str, keywords: dict[str, Any], renamed: dict[str, str]) -> None:
    """TypeError for keywords a function does not take, naming the new
    keyword where an old one was renamed (as the CLI refuses --tokens)."""
    if not keywords:
        return
    name = next(iter(keywords))
    if name in renamed:
        raise TypeError(f"{function}(): {name}= was renamed: use {renamed[name]}")
    raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")


def plan(
    spec: "Spec | str | _os.PathLike[str] | Mapping[str, Any]",
    rank: int | None = None,
    *,
    tokens_per_rank: int | None = None,
    global_batch_tokens: int | None = None,
    seq_len: int | None = None,
    context_parallel: str | None = None,
    **unknown: Any,
) -> "Plan | list[Plan]":
    """Plans a spec: the plan of ``rank``, or every rank's plan (a list by
    rank) when rank is None. ``tokens_per_rank`` (a data-parallel rank's
    tokens per microbatch), ``global_batch_tokens`` (per optimizer step, the
    whole job; give one of the two), ``seq_len`` and ``context_parallel``
    are `meshplan plan`'s --tokens-per-rank, --global-batch-tokens,
    --seq-len and --context-parallel: the work the cost model charges,
    which does not change the program. Unset, they come from the spec's
    "batch", else 8192 tokens of sequences of 8192, as in the CLI."""
    _refuse_unknown(
        "plan",
        unknown,
        {"tokens": "tokens_per_rank= (per data-parallel rank per microbatch) "
         "or global_batch_tokens= (per optimizer step)"},
    )
    if not isinstance(spec, Spec):
        spec = _load_spec(spec)
    return _plan(
        spec,
        rank,
        tokens_per_rank=tokens_per_rank,
        global_batch_tokens=global_batch_tokens,
        seq_len=seq_len,
        context_parallel=context_parallel,
    )


class VerifyResult:
    """What verify() proved: ``ok``, the first ``failure`` (a dict with kind,
    rank, index, instruction, comm, other_rank and message) or None, and
    ``stats`` (ranks, communicators, collectives, instructions). True when
    ok."""

    __slots__ = ("ok", "failure", "stats")

    def __init__(self, result: dict[str, Any]):
        self.ok: bool = result["ok"]
        self.failure: dict[str, Any] | None = result["failure"]
        self.stats: dict[str, int] = result["stats"]

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        if self.ok:
            return f"<meshplan.VerifyResult ok: {self.stats}>"
        return f"<meshplan.VerifyResult failed: {self.failure['message']!r}>"


def verify(plans: "list[Plan]") -> VerifyResult:
    """Proves that the ranks' plans agree: every communicator is defined
    alike by its members, their collective sequences match, and the programs
    cannot deadlock (plan::verifyPlans). Raises PlanError for an unusable
    set (empty, a rank twice, a rank missing)."""
    return VerifyResult(_verify(list(plans)))


def tune(
    model: str,
    world: int,
    *,
    device: str = "h100-sxm-80gb",
    global_batch_tokens: int | None = None,
    seq_len: int = 8192,
    max_context_parallel: int = 8,
    max_accumulation_steps: int = 8,
    pipeline_parallel: int = 0,
    confirm: int = 8,
    base_dir: "str | _os.PathLike[str]" = ".",
    include_over_capacity: bool = False,
    **unknown: Any,
) -> list[dict[str, Any]]:
    """Searches the layouts of ``model`` (a preset or a model JSON path) on
    ``world`` devices, as `meshplan tune` does: the candidates that fit,
    fastest first. Each is a dict with the degrees (pp, dp_replicate,
    dp_shard, cp, tp), the estimated step and peak memory, and ``spec``: a
    meshplan.Spec that ``plan`` accepts. ``global_batch_tokens`` is
    `meshplan tune`'s --global-batch-tokens (per optimizer step; unset: one
    sequence per rank)."""
    _refuse_unknown("tune", unknown, {"tokens_per_step": "global_batch_tokens="})
    if global_batch_tokens is not None and global_batch_tokens < 1:
        raise errors.TuneError(f"global_batch_tokens: must be > 0, not {global_batch_tokens}")
    return _tune(
        model,
        world,
        device,
        0 if global_batch_tokens is None else global_batch_tokens,
        seq_len,
        max_context_parallel,
        max_accumulation_steps,
        pipeline_parallel,
        confirm,
        _os.fspath(base_dir),
        include_over_capacity,
    )
