"""Metrics files: one JSON object per line per step (docs/observability.md).

``meshplan-train --metrics FILE`` and ``meshplan.torch.Trainer(metrics=FILE)``
write the same keys, so ``python -m meshplan.plot`` draws either::

    {"step": 3, "rank": 0, "loss": 5.81, "loss_scope": "global", "lr": 3e-4,
     "grad_norm": 1.2, "clip_coefficient": 0.83, "update_skipped": false,
     "tokens": 1024, "tokens_per_second": 11733.0, "step_seconds": 0.087,
     "compute_seconds": 0.0035, "communication_seconds": 0.089,
     "exposed_seconds": 0.084, "runtime_seconds": 0.0003,
     "peak_rss_bytes": 812646400, "ft_epoch": 1}

``grad_norm``, ``clip_coefficient`` and ``update_skipped`` are present when
the optimizer clips; ``ft_epoch`` when the run is fault tolerant. A FILE
with ``{rank}`` in it is written by every rank; otherwise rank 0 writes it.
Every line is written whole and flushed: a run that dies leaves every
finished step readable.
"""

from __future__ import annotations

import json
import math
import os
import resource
from dataclasses import dataclass, field
from typing import Any, Iterable

from .errors import Error

__all__ = ["MetricsError", "MetricsWriter", "MetricsFile", "read_metrics", "REQUIRED_KEYS"]

#: Keys every line has, with their JSON types.
REQUIRED_KEYS: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "rank": (int,),
    "loss": (int, float, type(None)),
    "lr": (int, float, type(None)),
    "tokens": (int,),
    "tokens_per_second": (int, float, type(None)),
    "step_seconds": (int, float, type(None)),
    "compute_seconds": (int, float, type(None)),
    "communication_seconds": (int, float, type(None)),
    "exposed_seconds": (int, float, type(None)),
    "runtime_seconds": (int, float, type(None)),
    "peak_rss_bytes": (int,),
}


class MetricsError(Error, ValueError):
    """A metrics file that cannot be read at all (none of its lines is a
    step), or a bad path or argument."""


def _number(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def peak_rss_bytes() -> int:
    """This process's peak resident set so far, in bytes (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MetricsWriter:
    """Writes one line per step. ``path`` may hold ``{rank}``; without it
    only rank 0 writes (the others' ``write`` does nothing)."""

    def __init__(self, path: "str | os.PathLike[str]", rank: int = 0):
        path = os.fspath(path)
        self.path = path.replace("{rank}", str(rank))
        self._file = None
        if "{rank}" in path or rank == 0:
            try:
                self._file = open(self.path, "w", encoding="utf-8")
            except OSError as e:
                raise MetricsError(f"metrics: cannot write {self.path}: {e.strerror}") from None

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        missing = [k for k in REQUIRED_KEYS if k not in record]
        if missing:
            raise MetricsError(f"metrics: a step record lacks {', '.join(missing)}")
        clean = {k: (_number(v) if isinstance(v, float) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


@dataclass
class MetricsFile:
    """What ``read_metrics`` found: the steps in file order, and every line
    it could not use, as ``(line number, reason)`` (a gap, never a crash)."""

    path: str
    records: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[tuple[int, str]] = field(default_factory=list)

    #: The line number of each record (parallel to ``records``).
    lines: list[int] = field(default_factory=list)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of ``key``. A step with no value, and every gap
        between two steps, is a NaN point, so that a plotted curve breaks
        there rather than bridging it."""
        gaps = sorted(n for n, _ in self.gaps)
        steps: list[int] = []
        values: list[float] = []
        for i, r in enumerate(self.records):
            if i and any(self.lines[i - 1] < g < self.lines[i] for g in gaps):
                steps.append(r["step"])
                values.append(math.nan)
            v = r.get(key)
            steps.append(r["step"])
            values.append(float(v) if isinstance(v, (int, float)) else math.nan)
        return steps, values


def read_metrics(path: "str | os.PathLike[str]") -> MetricsFile:
    """Reads a metrics file. A malformed line (not JSON, not an object, a
    required key missing or of the wrong type, a step that does not
    increase) is recorded in ``gaps`` with its line number and skipped.
    Raises MetricsError when the file cannot be read or holds no step."""
    path = os.fspath(path)
    out = MetricsFile(path)
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        raise MetricsError(f"{path}: cannot read: {e.strerror}") from None
    last = None
    with f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            if not text.endswith("\n"):
                out.gaps.append((n, "the last line is cut short (the run stopped while writing it)"))
                continue
            try:
                r = json.loads(text)
            except json.JSONDecodeError as e:
                out.gaps.append((n, f"not JSON: {e.msg} at column {e.colno}"))
                continue
            if not isinstance(r, dict):
                out.gaps.append((n, "not a JSON object"))
                continue
            bad = None
            for k, types in REQUIRED_KEYS.items():
                if k not in r:
                    bad = f'no "{k}"'
                    break
                if not isinstance(r[k], types) or isinstance(r[k], bool):
                    bad = f'"{k}" is {json.dumps(r[k])}, not a number'
                    break
            if bad:
                out.gaps.append((n, bad))
                continue
            if last is not None and r["step"] <= last:
                out.gaps.append((n, f'step {r["step"]} does not follow step {last}'))
                continue
            last = r["step"]
            out.records.append(r)
            out.lines.append(n)
    if not out.records:
        why = f" (line {out.gaps[0][0]}: {out.gaps[0][1]})" if out.gaps else " (it is empty)"
        raise MetricsError(f"{path}: no step in the file{why}")
    return out


def step_record(
    *,
    step: int,
    rank: int,
    loss: float,
    lr: float | None,
    tokens: int,
    step_seconds: float,
    compute_seconds: float,
    communication_seconds: float,
    exposed_seconds: float,
    runtime_seconds: float,
    loss_scope: str = "global",
    grad_norm: float | None = None,
    clip_coefficient: float | None = None,
    update_skipped: bool | None = None,
    ft_epoch: int | None = None,
) -> dict[str, Any]:
    """A record with the keys in the order meshplan-train writes them."""
    r: dict[str, Any] = {
        "step": step,
        "rank": rank,
        "loss": _number(loss),
        "loss_scope": loss_scope,
        "lr": _number(lr),
    }
    if grad_norm is not None or clip_coefficient is not None:
        r["grad_norm"] = _number(grad_norm)
        r["clip_coefficient"] = _number(clip_coefficient)
        r["update_skipped"] = bool(update_skipped)
    r["tokens"] = tokens
    r["tokens_per_second"] = _number(tokens / step_seconds if step_seconds > 0 else 0.0)
    r["step_seconds"] = _number(step_seconds)
    r["compute_seconds"] = _number(compute_seconds)
    r["communication_seconds"] = _number(communication_seconds)
    r["exposed_seconds"] = _number(exposed_seconds)
    r["runtime_seconds"] = _number(runtime_seconds)
    r["peak_rss_bytes"] = peak_rss_bytes()
    if ft_epoch is not None:
        r["ft_epoch"] = ft_epoch
    return r
