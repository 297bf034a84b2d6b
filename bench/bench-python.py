#!/usr/bin/env python3
"""The Python package's overhead over the C++ API, measured side by side in
one process (issue 30's targets; docs/python.md, "Overhead"):

  plan: meshplan.plan(spec, rank) of one rank of the llama3-405b 4-D example
        against pipeline::planSpec + instantiate called from C++ in the same
        process: the ratio must be <= 1.1.
  step: Session.step() of a one-rank plan whose Python callbacks do nothing
        against runtime::Session::step() of the same session, called from
        C++ with C++ callbacks that do nothing: the ratio must be <= 1.05.

Rounds alternate Python and C++ (and which goes first) so that machine
noise and the allocator's state hit both alike; the ratio is of medians. Prints PASS/FAIL per target and exits 1 on a FAIL.

  .venv/bin/python bench/bench-python.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import meshplan
from meshplan import _meshplan

ROOT = pathlib.Path(__file__).resolve().parents[1]


def bench_plan(rounds: int) -> float:
    spec = meshplan.spec(ROOT / "examples" / "specs" / "llama3-405b-4d.json")
    rank = spec.world_size // 3
    python, cpp = [], []
    meshplan.plan(spec, rank)  # warm-up (first MLIR context, caches)
    for round in range(rounds):
        # Which side goes first alternates: the second one of a round finds
        # the memory the first one freed (measured: 5 to 10% either way).
        if round % 2:
            cpp.extend(_meshplan._bench_plan_cpp(spec, rank, 1))
        start = time.perf_counter()
        meshplan.plan(spec, rank)
        python.append(time.perf_counter() - start)
        if not round % 2:
            cpp.extend(_meshplan._bench_plan_cpp(spec, rank, 1))
    p, c = statistics.median(python), statistics.median(cpp)
    ratio = p / c
    print(f"plan   llama3-405b 4-D rank {rank}: python {p * 1e3:8.2f} ms, "
          f"C++ {c * 1e3:8.2f} ms, ratio {ratio:.3f} (target <= 1.10) "
          f"{'PASS' if ratio <= 1.10 else 'FAIL'}")
    return ratio <= 1.10


def bench_step(rounds: int, steps: int) -> bool:
    # The model of meshplan-train's benchmark (13.1M parameters) on one
    # rank: the optimizer and the plan's local work, callbacks that do
    # nothing.
    spec = meshplan.spec({
        "model": str(ROOT / "examples" / "models" / "wide.json"),
        "mesh": {"axes": [{"name": "dp", "size": 1}]},
        "data_parallel": {"shard_axes": ["dp"]},
    })
    plan = meshplan.plan(spec, 0)
    calls = sum(1 for i in plan.program if i["op"] == "compute")
    python, cpp = [], []
    # One session; its steps alternate between Python callbacks and C++ ones
    # that do nothing (_bench_steps_cpp: the step called from C++), so that
    # both sides run on the same buffers.
    with meshplan.Session(plan) as session:
        session.on_compute(lambda call: None)
        session.step()  # warm-up: the first step allocates the buffers
        # Step by step, so that drift of the machine's speed hits both.
        for _ in range(rounds * steps):
            session.on_compute(lambda call: None)
            start = time.perf_counter()
            session.step()
            python.append(time.perf_counter() - start)
            cpp.extend(_meshplan._bench_steps_cpp(session, 1))
    p, c = statistics.median(python), statistics.median(cpp)
    ratio = p / c
    print(f"step   wide (13.1M parameters), 1 rank, {calls} callbacks: python "
          f"{p * 1e3:8.3f} ms, C++ {c * 1e3:8.3f} ms, ratio {ratio:.3f} "
          f"(target <= 1.05) {'PASS' if ratio <= 1.05 else 'FAIL'}")
    return ratio <= 1.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    ok = bench_plan(args.rounds)
    ok = bench_step(args.rounds, args.steps) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
