"""The exceptions meshplan raises.

Every error the C++ planner or runtime reports crosses into Python as one of
these, carrying the message the CLI prints (``str(e)``) and, parsed out of
it, where the problem is: the JSON pointer into a spec or plan, the rank and
the instruction of a failed step.
"""

from __future__ import annotations

import re

__all__ = [
    "Error",
    "SpecError",
    "PlanError",
    "TuneError",
    "SessionError",
    "StoreError",
    "StepError",
    "CheckpointError",
    "ClosedError",
    "ViewError",
    "ModuleError",
]

_POINTER = re.compile(r"(?:^|: )(/[^\s:]*)(?=: )")
_RANK = re.compile(r"\brank (\d+)\b")
_INSTRUCTION = re.compile(r'\binstruction "([^"]+)"')


class Error(Exception):
    """Base of every meshplan error; ``message`` is the located message."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class SpecError(Error, ValueError):
    """A spec (or its model) that does not plan.

    ``pointer`` is the JSON pointer of the offending item ("/mesh/axes/1/size"),
    or None when the message names no place in the document.
    """

    def __init__(self, message: str):
        super().__init__(message)
        match = _POINTER.search(message)
        self.pointer: str | None = match.group(1) if match else None


class PlanError(SpecError):
    """A plan file or document that is corrupt or invalid (``pointer`` as for
    SpecError: "/program/17/comm")."""


class TuneError(Error, ValueError):
    """tune() found no candidate, or was given a bad model or world size."""


class SessionError(Error, RuntimeError):
    """The runtime refused or failed; ``rank`` and ``instruction`` are the
    failing rank and the plan instruction it names (None when it names none)."""

    def __init__(self, message: str):
        super().__init__(message)
        rank = _RANK.search(message)
        instruction = _INSTRUCTION.search(message)
        self.rank: int | None = int(rank.group(1)) if rank else None
        self.instruction: str | None = instruction.group(1) if instruction else None


class StoreError(SessionError):
    """The rendezvous store is missing, malformed or unreachable."""


class StepError(SessionError):
    """A training step failed on this rank (a collective, a kernel, or a peer
    that failed or went away); the session cannot run more steps."""


class CheckpointError(SessionError):
    """A checkpoint could not be saved or loaded (nothing was changed)."""


class ClosedError(Error, RuntimeError):
    """A session, or a view of one, used after close() (or a compute call's
    view used after the call returned)."""


class ViewError(Error, ValueError):
    """A write into a view with the wrong shape or dtype, or a dtype numpy
    cannot show."""


class ModuleError(Error, ValueError):
    """meshplan.torch: a torch module the plan cannot train as it is (tied
    parameters, buffers that need syncing, a parameter no unit holds, a
    shape the plan does not have, an in-place change of a parameter outside
    the plan's update). ``name`` is the offending parameter or module."""

    def __init__(self, message: str, name: str | None = None):
        super().__init__(message)
        self.name = name
