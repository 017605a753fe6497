"""FLOPs per token of a Qwen3-shaped model's forward pass, counted from its config: what the dry run
(tools/plan.py), the preflight, and the utilization rows charge for a step.

    layers, head = flops.forward_flops_per_token(config, layers=36, context=486.0)
    cost = flops.document_cost(config, layers=9, tokens=972)   # what placing a document by its cost weighs
"""
from plumbing.hf_qwen3 import ModelConfig


def forward_flops_per_token(c: ModelConfig, layers: int, context: float) -> tuple[float, float]:
    """(decoder layers, LM head) forward FLOPs per token: 2 per weight, plus causal attention (windowed: w keys)."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    weights = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    context = min(context, c.attention_window or context)  # over by w(w-1)/2n keys: 0.47 of w=16 at n=256
    attention = 4 * q * context  # QK^T and AV (2 FLOPs per multiply-add each) over an average causal context
    return layers * (2 * weights + attention), 2 * c.hidden_size * c.vocab_size


def document_cost(c: ModelConfig, layers: int, tokens: int) -> float:
    """A document's forward FLOPs through `layers` decoder layers (its average causal context half its length):
    what rank placement balances (data.token_micro_batches; the dry run's balance), linear in the tokens but for
    attention, quadratic in them."""
    return tokens * forward_flops_per_token(c, layers, tokens / 2)[0]
