"""What the scan and the dry run read of attention (the mechanism scale's tests that outlived it, docs/records/
2026-12-04-mechanism-search-closed.md): a windowed attention is causal attention cut to a band, attention without
q/k norms scores the raw projections, the scan reads a planted sink and massive activation as computed by hand,
the dry run prices a window and the kit's own teacher's pretraining, and even attention's share of position 0."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import diag
import model
from experiments import suite
from interventions.monitor import attention_to_first
from plumbing.flops import forward_flops_per_token
from plumbing.hf_qwen3 import ModelConfig
from tools import preflight

WINDOWED = ModelConfig(vocab_size=65, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, rope_theta=10_000.0, tie_word_embeddings=False)


def test_windowed_attention_is_causal_attention_cut_to_its_band():
    """With window 4, query t attends to keys t-3..t: its output is a softmax over those by hand; the first 4
    queries agree with full causal attention (same weights), the later ones do not."""
    torch.manual_seed(0)
    full, windowed = model.Attention(WINDOWED), model.Attention(ModelConfig(**{**WINDOWED.__dict__, "attention_window": 4}))
    windowed.load_state_dict(full.state_dict())
    x = torch.randn(2, 10, 32)
    cos, sin = model.rope_cos_sin(WINDOWED, 10, x.device)
    q, k, v = windowed.project(x)
    q, k = model.apply_rope(q, cos, sin), model.apply_rope(k, cos, sin)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    t, j = torch.arange(10)[:, None], torch.arange(10)[None, :]
    by_hand = scores.masked_fill((j > t) | (t - j >= 4), float("-inf")).softmax(-1) @ v
    by_hand = windowed.o_proj(by_hand.transpose(1, 2).reshape(2, 10, 32))
    out, causal = windowed(x, cos, sin), full(x, cos, sin)
    assert torch.allclose(out, by_hand, atol=1e-6)  # fp32 sums of 4-10 terms in another order: ~1e-7
    assert torch.allclose(out[:, :4], causal[:, :4], atol=1e-6) and (out[:, 4:] - causal[:, 4:]).abs().amax(-1).min() > 1e-4



def test_without_qk_norms_attention_scores_the_raw_projections():
    """qk_norm=False: no q/k gains to learn, and the scores are the projections' own (after RoPE), by hand; the
    same weights with Qwen3's norms give other outputs."""
    torch.manual_seed(0)
    plain = model.Attention(ModelConfig(**{**WINDOWED.__dict__, "qk_norm": False}))
    normed = model.Attention(WINDOWED)
    normed.load_state_dict(plain.state_dict(), strict=False)
    assert not any("q_norm" in k or "k_norm" in k for k in plain.state_dict())
    x = torch.randn(2, 10, 32)
    cos, sin = model.rope_cos_sin(WINDOWED, 10, x.device)
    q = model.apply_rope(plain.q_proj(x).view(2, 10, 4, 8).transpose(1, 2), cos, sin)
    k = model.apply_rope(plain.k_proj(x).view(2, 10, 2, 8).transpose(1, 2), cos, sin).repeat_interleave(2, dim=1)
    v = plain.v_proj(x).view(2, 10, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf"))
    by_hand = plain.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 10, 32))
    out = plain(x, cos, sin)
    assert torch.allclose(out, by_hand, atol=1e-6)  # fp32 sums of up to 10 terms in another order: ~1e-7
    assert (out - normed(x, cos, sin)).abs().max() > 1e-3

def decode(ids) -> str:
    """Ids 0..63 as s<id>, 64 as <bos>: symbols, none a delimiter (diag.token_types)."""
    return " ".join("<bos>" if i == 64 else f"s{i}" for i in ids)


def planted_batch():
    """Two rows of <bos> (64) and then seeded ids 0..63, the second 9 positions shorter."""
    ids = torch.from_numpy(np.random.default_rng(42).integers(0, 64, size=(2, 31)))
    input_ids = torch.cat([torch.full((2, 1), 64), ids], 1)
    mask = torch.arange(32)[None, :] < torch.tensor([32, 23])[:, None]
    return SimpleNamespace(input_ids=input_ids, mask=mask)


@pytest.mark.parametrize("window", [0, 4])
def test_the_scan_reads_a_planted_sink_and_massive_activation(window):
    """Layer 1's output is planted: every real state all ones, <bos>'s channel 3 at 500. So its max/median is
    500, boundary/regular RMS sqrt((500^2 + 31) / 32), per hand. Layer 2's queries are zeroed, so every head
    spreads query t evenly over the keys it sees: 1/(t+1) on <bos> (none past the window), averaged over the
    real queries after position 0."""
    net = model.Qwen3(ModelConfig(**{**WINDOWED.__dict__, "attention_window": window}))
    net.init_weights(0)
    batch = planted_batch()

    def plant(module, args, output):
        output = torch.ones_like(output)
        output[:, 0, 3] = 500.0
        return output
    handle = net.layers[1].register_forward_hook(plant)
    project = net.layers[2].self_attn.project
    net.layers[2].self_attn.project = lambda x: (torch.zeros_like(project(x)[0]), *project(x)[1:])
    try:
        rows = diag.layer_scan(net, batch, decode, sink_attention=0.3)
    finally:
        handle.remove()
    assert rows[1]["massive_ratio"] == pytest.approx(500.0, rel=1e-12)
    assert (rows[1]["top"][0]["channel"], rows[1]["top"][0]["position"], rows[1]["top"][0]["token"]) == (3, 0, "<bos>")
    assert rows[1]["boundary_over_regular"] == pytest.approx(math.sqrt((500**2 + 31) / 32), rel=1e-6)  # fp32 states
    seen = [1 / (t + 1) if not window or t < window else 0.0 for t in range(1, 32)]
    expected = (sum(seen) + sum(seen[:22])) / (31 + 22)   # row 0: queries 1..31; row 1: queries 1..22
    assert rows[2]["first_token_attention"] == pytest.approx([expected] * 4, rel=1e-5)  # fp32 softmax
    assert rows[2]["sink_heads"] == 0.0 and rows[2]["max_head"] == pytest.approx(expected, rel=1e-5)
    q = torch.zeros(1, 1, 6, 8)
    assert attention_to_first(q, torch.randn(1, 1, 6, 8), window=window)[0, 0, 5].item() == \
        pytest.approx(0.0 if window else 1 / 6, abs=1e-7)


def test_the_dry_run_prices_a_window_not_full_causal_attention():
    """A teacher of 12 layers, queries 128 wide, window 16, at an average causal context of 128 keys: its layers'
    attention FLOPs are 4 * 128 * 16 a token a layer (QK^T and AV over 16 keys), full attention's 4 * 128 * 128;
    the weights' FLOPs are the same. Pricing full attention for both would make the difference 0."""
    full = ModelConfig(vocab_size=65, hidden_size=128, intermediate_size=512, num_hidden_layers=12,
                       num_attention_heads=1, num_key_value_heads=1, head_dim=128, qk_norm=False)
    windowed = ModelConfig(**{**full.__dict__, "attention_window": 16})
    (control, head), (causal, same_head) = (forward_flops_per_token(c, 12, 128.0) for c in (windowed, full))
    assert head == same_head and causal - control == 12 * 4 * 128 * (128 - 16)
    assert forward_flops_per_token(windowed, 12, 8.0) == forward_flops_per_token(full, 12, 8.0)


def test_a_dry_run_prices_the_kits_own_teacher_where_it_must_be_pretrained_first(tmp_path):
    """The smoke scale ships no teacher: its dry run adds the pretraining, 20 steps of 4 documents of 30 tokens,
    3x the forward (2 layers: 2 x 9,216 weights + 4 x 32 x 15 attention at 15 keys; the head 2 x 32 x 513) a
    token, counted by hand; none once the runs folder has one, or where a teacher ships."""
    ws = suite.workspace("smoke", tmp_path, dry_run=True)
    flops, line = preflight.teacher_pretraining(ws)
    per_token = 2 * (2 * (32 * (2 * 32 + 2 * 16) + 3 * 32 * 64) + 4 * 32 * 15) + 2 * 32 * 513
    assert flops == 3 * 20 * 4 * 30 * per_token and "20 steps of 4 documents (0.0M tokens" in line
    (ws.teacher_dir / "done.json").parent.mkdir(parents=True)
    (ws.teacher_dir / "done.json").write_text("{}")
    assert preflight.teacher_pretraining(ws) == (0.0, "")
    assert preflight.teacher_pretraining(suite.workspace("toy", tmp_path, dry_run=True)) == (0.0, "")


def test_even_attention_on_the_first_token_is_the_mean_of_one_over_the_keys_seen():
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    assert diag.even_first_token_attention(mask) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4 + 1 / 2 + 1 / 3) / 5)
    assert diag.even_first_token_attention(mask, window=2) == pytest.approx((1 / 2 + 1 / 2) / 5)
