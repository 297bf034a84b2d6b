"""A Llama 3 in plain torch: torchtitan's architecture (no torchtitan import).

RMSNorm, grouped-query attention with RoPE (complex rotation, Llama 3's
theta 500000) and a causal softmax, a SwiGLU feed-forward, untied embedding
and output. Module and parameter names are torchtitan's
(``layers.3.attention.wq.weight``), so meshplan's specs, TP patterns and
checkpoints name the same tensors as for torchtitan and ``meshplan-train``.

The configurations match meshplan's model files: ``tiny``
(examples/models/tiny.json) and ``wide`` (examples/models/wide.json).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 128
    vocab_size: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 2048


CONFIGS = {
    "tiny": LlamaConfig(),
    "wide": LlamaConfig(dim=512, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=1536),
}


def precompute_freqs_cis(head_dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    t = torch.arange(end, dtype=torch.float32)
    return torch.polar(torch.ones(end, head_dim // 2), torch.outer(t, freqs))


def apply_rotary_emb(xq, xk, freqs_cis):
    seqlen = xq.shape[1]
    f = freqs_cis[:seqlen].view(1, seqlen, 1, -1)
    q = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    k = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    return (
        torch.view_as_real(q * f).flatten(3).type_as(xq),
        torch.view_as_real(k * f).flatten(3).type_as(xk),
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # In float32, as torchtitan's (torch.nn.RMSNorm) does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).type_as(x)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = c.n_heads, c.n_kv_heads
        self.head_dim = c.dim // c.n_heads
        self.wq = nn.Linear(c.dim, c.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * self.head_dim, c.dim, bias=False)

    def forward(self, x, freqs_cis):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary_emb(q, k, freqs_cis)
        rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w2 = nn.Linear(c.ffn_dim, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, c: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.feed_forward = FeedForward(c)
        # torchtitan's depth-scaled init of the residual projections.
        self.init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, c) for i in range(c.n_layers)}
        )
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        # A constant, not state: non-persistent, so it needs no syncing.
        self.register_buffer(
            "freqs_cis",
            precompute_freqs_cis(c.dim // c.n_heads, c.max_seq_len, c.rope_theta),
            persistent=False,
        )

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """torchtitan's init (truncated normals), from one seed on every rank."""
        g = torch.Generator().manual_seed(seed)

        def normal(p, std):
            p.copy_(torch.randn(p.shape, generator=g).clamp_(-2, 2) * std)

        normal(self.tok_embeddings.weight, 1.0)
        for block in self.layers.values():
            for lin in (block.attention.wq, block.attention.wk, block.attention.wv, block.feed_forward.w1):
                normal(lin.weight, 0.02)
            for lin in (block.attention.wo, block.feed_forward.w2, block.feed_forward.w3):
                normal(lin.weight, block.init_std)
        normal(self.output.weight, self.config.dim**-0.5)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h, self.freqs_cis)
        return self.output(self.norm(h))
