"""Train the torch Llama of llama.py under a meshplan plan, one process per
rank:

    build/bin/meshplan run -n 8 -- .venv/bin/python examples/torch/train.py \\
        --spec examples/specs/fsdp-fp8-3d.json --model tiny --steps 30

The spec's parallelism (its mesh, FSDP/HSDP, extra axes, accumulation,
float8 all-gather, mixed precision, optimizer) applies to this torch module:
``meshplan.torch.Trainer`` replaces the model the spec names with the
module's own description. The data is meshplan-train's (examples/torch/
data.py: the repository's docs as bytes), so the two trainers see the same
batches. Rank 0 prints one line per step, as meshplan-train does: the loss
of its own batch, tokens per second over every rank, and where the step's
time went (the runtime's profile: compute callbacks, collectives, what of
them was exposed, the runtime's own overhead).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import TextData  # noqa: E402
from llama import CONFIGS, Llama  # noqa: E402

import meshplan  # noqa: E402
import meshplan.torch as mpt  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="a meshplan spec (its model is replaced by the torch module)")
    ap.add_argument("--model", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=4, help="sequences per microbatch per data-parallel rank")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    ap.add_argument("--data", default="docs", help="a text file or a directory of .md/.txt files")
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--save-checkpoint", help="save a checkpoint after the last step")
    ap.add_argument("--metrics", help="write one JSON line per step here (rank 0; '{rank}' for every rank; "
                    "python -m meshplan.plot draws it)")
    ap.add_argument("--trace", help="record what steps 2..6 did per instruction into this directory "
                    "(meshplan trace --merge / --summary)")
    args = ap.parse_args()
    if args.steps < 1 or args.batch < 1 or args.seq_len < 1:
        ap.error("--steps, --batch and --seq-len must be >= 1")
    # One rank per process: torch's intra-op threads would only contend.
    torch.set_num_threads(int(os.environ.get("MESHPLAN_TORCH_THREADS", "1")))
    rank = int(os.environ.get("RANK", "0"))
    data = TextData(args.data)
    if len(data.text) <= args.seq_len:
        ap.error(f"--data {args.data} holds {len(data.text)} bytes, not more than --seq-len")
    model = Llama(CONFIGS[args.model])
    model.init_weights(args.seed)
    try:
        trace_steps = (min(2, args.steps), min(6, args.steps)) if args.trace else None
        trainer = mpt.Trainer(model, args.spec, example_input=torch.zeros(1, 1, dtype=torch.long),
                              total_steps=args.steps, metrics=args.metrics, trace=args.trace,
                              trace_steps=trace_steps)
    except (meshplan.errors.SpecError, mpt.ModuleError) as e:
        print(f"train.py: {e}", file=sys.stderr)
        return 2
    dp, dps = trainer.data_parallel_rank, trainer.data_parallel_size
    tokens = args.batch * args.seq_len * trainer.microbatches * dps
    c = model.config
    if rank == 0:
        print(
            f"torch Llama {args.model} (dim {c.dim}, {c.n_layers} layers, {c.n_heads} heads, "
            f"{c.n_kv_heads} kv heads, ffn {c.ffn_dim}, vocab {c.vocab_size}) under "
            f"{args.spec} on {trainer.spec.world_size} ranks ({trainer.spec.mesh}); "
            f"{dps} data-parallel x {trainer.microbatches} microbatches x {args.batch} sequences "
            f"of {args.seq_len} tokens = {tokens} tokens per step; "
            f"activation checkpointing {'on' if trainer.activation_checkpointing else 'off'}",
            flush=True,
        )
    losses, times = [], []
    with trainer:
        for step in range(1, args.steps + 1):
            x, y = data.rank_batch(args.seed, step, trainer.microbatches, dp, args.batch, args.seq_len)
            start = time.perf_counter()
            loss = trainer.step(x, y)
            took = time.perf_counter() - start
            losses.append(loss)
            times.append(took)
            p = trainer.session.profile
            if rank == 0 and (step % args.log_every == 0 or step == args.steps):
                norm = f" grad_norm {p['grad_norm']:.4f}" if p.get("grad_norm") is not None else ""
                print(
                    f"step {step}/{args.steps} loss {loss:.4f} (this rank){norm} tok/s {tokens / took:.0f} | "
                    f"step {took * 1e3:.1f} ms: compute {p['callbacks'] * 1e3:.1f} "
                    f"comm {p['collectives'] * 1e3:.1f} exposed {p['exposed_collectives'] * 1e3:.1f} "
                    f"runtime {p['overhead'] * 1e3:.2f} ms",
                    flush=True,
                )
        if args.save_checkpoint:
            trainer.save_checkpoint(args.save_checkpoint)
    if rank == 0:
        k = min(10, len(losses))
        median = statistics.median(times[1:] or times)
        print(
            f"summary: {args.steps} steps; loss {statistics.mean(losses[:k]):.4f} -> "
            f"{statistics.mean(losses[-k:]):.4f} (this rank, mean of the first and last {k} steps); "
            f"median step {median * 1e3:.1f} ms, {tokens / median:.0f} tok/s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
