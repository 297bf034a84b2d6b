"""Loss and step-time curves of one or several runs' metrics files.

    python -m meshplan.plot run-a.jsonl run-b.jsonl -o compare.png

draws, for each file (a curve each, labelled by file name or ``--label``):
the loss, the step time and its exposed communication, and tokens per
second, against the step. Lines a file could not use are reported on stderr
as ``FILE:LINE: reason`` and shown as breaks in its curves; a file with no
step at all is an error (exit 2, nothing written). docs/observability.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from .metrics import MetricsError, read_metrics


def plot(paths: list[str], output: str, labels: list[str] | None = None, title: str | None = None) -> list[str]:
    """Writes the figure to ``output`` (its suffix picks the format: .png,
    .svg, .pdf); returns the warnings about skipped lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if labels is not None and len(labels) != len(paths):
        raise MetricsError(f"--label: {len(labels)} labels for {len(paths)} files")
    runs = [read_metrics(p) for p in paths]
    warnings = [f"{r.path}:{n}: {why} (shown as a gap)" for r in runs for n, why in r.gaps]
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for i, run in enumerate(runs):
        label = labels[i] if labels else os.path.basename(run.path)
        s, loss = run.series("loss")
        scope = run.records[0].get("loss_scope")
        axes[0].plot(s, loss, label=label + (" (rank 0's own loss)" if scope == "rank" else ""))
        s, wall = run.series("step_seconds")
        line = axes[1].plot(s, [w * 1e3 for w in wall], label=f"{label}: step")[0]
        s, exposed = run.series("exposed_seconds")
        axes[1].plot(s, [e * 1e3 for e in exposed], "--", color=line.get_color(), label=f"{label}: exposed comm")
        s, tps = run.series("tokens_per_second")
        axes[2].plot(s, tps, label=label)
    axes[0].set_ylabel("loss")
    # Log scale: a first step that creates the communicators can be 100x
    # the others and would flatten every later one.
    axes[1].set_yscale("log")
    axes[1].set_ylabel("ms per step (log)")
    axes[2].set_ylabel("tokens / s")
    axes[2].set_xlabel("step")
    for a in axes:
        a.grid(True, alpha=0.3)
        a.legend(fontsize="small")
    fig.suptitle(title or "meshplan runs")
    fig.tight_layout()
    tmp = output + ".tmp" + os.path.splitext(output)[1]
    try:
        fig.savefig(tmp)
        os.replace(tmp, output)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise MetricsError(f"-o: cannot write {output}: {e.strerror}") from None
    finally:
        plt.close(fig)
    return warnings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m meshplan.plot",
        description="Loss and step-time curves of meshplan metrics files "
        "(meshplan-train --metrics, meshplan.torch.Trainer(metrics=)).",
    )
    parser.add_argument("files", nargs="+", help="metrics files (one JSON line per step)")
    parser.add_argument("-o", "--output", required=True, help="the figure (.png, .svg or .pdf)")
    parser.add_argument("--label", action="append", help="a curve's label, once per file, in order")
    parser.add_argument("--title", help="the figure's title")
    args = parser.parse_args(argv)
    try:
        warnings = plot(args.files, args.output, args.label, args.title)
    except MetricsError as e:
        print(f"meshplan.plot: error: {e}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"meshplan.plot: warning: {w}", file=sys.stderr)
    print(f"wrote {args.output}: {len(args.files)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
