"""The boundary monitor: with `capture_boundaries` set on a model.Qwen3 or model.Student, its next forward keeps
the residual stream at every block boundary and, from every layer's attention, how much each query attends to
the document's boundary token (position 0); read by a run's monitor rows, the diagnostics and the causal test.

    net.capture_boundaries = True; net(input_ids)
    net.captured["boundaries"], net.captured["first_attention"]   # [(B, T, H)], [(B, n_heads, T) or None]
"""

import math

import torch
import torch.nn as nn


def visible_keys(queries: torch.Tensor, T: int, window: int = 0) -> torch.Tensor:
    """(len(queries), T) bool: key j is visible from query t when j <= t and, with a window w > 0, t - j < w."""
    keys = torch.arange(T, device=queries.device)[None, :]
    return (keys <= queries[:, None]) & ((queries[:, None] - keys < window) if window else True)


@torch.no_grad()
def attention_to_first(q: torch.Tensor, k: torch.Tensor, max_elements: int = 2**26, window: int = 0) -> torch.Tensor:
    """(B, n_heads, T) float32: the causal softmax weight each query puts on key 0, from q and k after RoPE, over
    blocks of query rows so that a long sequence never holds all its scores."""
    B, n_heads, T, hd = q.shape
    q = q.float().view(B, k.shape[1], n_heads // k.shape[1], T, hd)           # (B, nkv, g, T, hd)
    k = k.float()
    rows = max(1, max_elements // max(1, B * n_heads * T))
    out = []
    for start in range(0, T, rows):
        scores = torch.einsum("bkgtd,bksd->bkgts", q[:, :, :, start:start + rows], k) / math.sqrt(hd)
        t = torch.arange(start, min(start + rows, T), device=q.device)
        scores = scores.masked_fill(~visible_keys(t, T, window), float("-inf"))
        out.append((scores[..., 0] - scores.logsumexp(-1)).exp())             # (B, nkv, g, rows)
    return torch.cat(out, dim=-1).reshape(B, n_heads, T)


def record_attention(net: nn.Module, on: bool):
    """Have every layer's attention record its first-token attention in the next forward (or stop)."""
    for layer in net.layers:
        layer.self_attn.record_first_attention, layer.self_attn.first_attention = on, None


def captured(boundaries: list[torch.Tensor], net: nn.Module) -> dict:
    """What capture_boundaries keeps of a forward, detached; recording then stops."""
    attention = [layer.self_attn.first_attention for layer in net.layers]
    record_attention(net, False)
    return {"boundaries": [x.detach() for x in boundaries], "first_attention": attention}
