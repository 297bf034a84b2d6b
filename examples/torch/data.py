"""meshplan-train's byte-level text data, in Python (examples/trainer/Data.h):
bytes are tokens (vocabulary 256), the text is the .md and .txt files of a
directory (recursively, sorted by path, each followed by a newline), and
sequence i of (step, microbatch) is the window whose start is a hash of
(seed, step, microbatch, i). A rank reading its sequences sees exactly the
data meshplan-train's rank of the same data-parallel index reads, so the
torch driver and the C++ trainer can be compared on the same batches.
"""

from __future__ import annotations

import os

import torch

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class TextData:
    def __init__(self, path: str):
        if os.path.isdir(path):
            paths = sorted(
                os.path.join(root, f)
                for root, _, files in os.walk(path)
                for f in files
                if f.endswith((".md", ".txt"))
            )
            if not paths:
                raise ValueError(f"{path}: no .md or .txt files in this directory")
        elif os.path.isfile(path):
            paths = [path]
        else:
            raise ValueError(f"{path}: no such file or directory")
        chunks = []
        for p in paths:
            with open(p, "rb") as f:
                chunks.append(f.read() + b"\n")
        self.paths = paths
        self.text = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)

    def batch(self, seed: int, step: int, microbatch: int, first: int, rows: int, seq_len: int):
        """Sequences [first, first + rows) of (step, microbatch): tokens and
        next-token targets, int64 [rows, seq_len] each."""
        windows = len(self.text) - seq_len
        starts = []
        for b in range(rows):
            key = _mix(_mix(_mix(seed) ^ step) ^ (microbatch << 32)) ^ (first + b)
            starts.append(_mix(key) % windows)
        idx = torch.tensor(starts).unsqueeze(1) + torch.arange(seq_len + 1)
        window = self.text[idx].long()
        return window[:, :-1], window[:, 1:]

    def rank_batch(self, seed, step, microbatches, dp_rank, rows, seq_len):
        """A data-parallel rank's batch of a step: ``rows`` sequences per
        microbatch, microbatches stacked along dim 0 (Trainer.step splits
        them again)."""
        parts = [self.batch(seed, step, m, dp_rank * rows, rows, seq_len) for m in range(microbatches)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
