"""The mechanism scale (issue 39): the Bigram-Backcopy corpus is its seed, its shards start every document
with the fixed first token, the control differs from it only in the attention window, the window is causal
attention cut to a band, and the scan reads a planted sink and massive activation on its ids as computed by
hand."""
import math
from dataclasses import fields
from itertools import islice
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import diag
import model
import prepare_shards
from experiments import presets, scan, suite
from flops import forward_flops_per_token
from interventions.monitor import attention_to_first
from plumbing import corpora
from plumbing.hf_qwen3 import ModelConfig
from tools import first_token, preflight

MECHANISM, CONTROL = presets.PRESETS["mechanism"], presets.PRESETS["mechanism-control"]


def backcopy_ids(seed: int, n: int = 3, **options) -> np.ndarray:
    documents = corpora.corpus("backcopy", 0, seed, **options).ordered_documents()
    return np.array([[int(word) for word in text.split()] for text in islice(documents, n)])


def test_the_backcopy_corpus_is_its_seed_and_copies_after_every_trigger():
    """The same seed gives the same ids, another seed others; after a trigger comes the symbol before it,
    and the triggers are the chain's 3 most probable symbols in the long run."""
    first, again, other = backcopy_ids(42), backcopy_ids(42), backcopy_ids(43)
    assert first.shape == (3, 256) and np.array_equal(first, again)
    assert (first != other).mean() > 0.9  # 64 symbols: two independent streams agree ~1/64 of the time
    # every document its own, across the generator's blocks of 256 too (a repeated block would be memorised)
    many = backcopy_ids(42, 3 * corpora.BACKCOPY_BLOCK, document_tokens=8)
    assert len({tuple(row) for row in many}) == len(many)
    chain, triggers = corpora.backcopy_chain(64, 3, 42)
    assert np.allclose(chain.sum(1), 1.0) and len(triggers) == 3
    stationary = np.linalg.matrix_power(chain, 4096)[0]
    assert set(triggers) == set(np.argsort(-stationary)[:3])
    after_trigger = np.isin(first[:, 1:-1], triggers)
    assert after_trigger.any() and not np.isin(first[:, 0], triggers).any()
    assert np.array_equal(first[:, 2:][after_trigger], first[:, :-2][after_trigger])


def test_a_backcopy_shard_starts_every_document_with_the_fixed_first_token(tmp_path):
    """prepare_shards.prepare writes <bos> (id = the number of symbols) and then the generator's ids, cut at max_len."""
    enc = corpora.vocabulary({"source": "backcopy", "symbols": 8})
    options = dict(symbols=8, triggers=2, document_tokens=16)
    train, val = prepare_shards.prepare("backcopy", tmp_path, enc, max_len=16, n_train_docs=4, n_val_docs=2, seed=7,
                                        progress=False, workers=1, **options)
    expected = backcopy_ids(7, 6, **options)
    shard_documents = [val.document(i) for i in range(2)] + [train.document(i) for i in range(4)]
    assert enc.eot == 8 and enc.n_vocab == 9 and train.eot == 8
    assert all(list(d) == [8, *expected[i]] for i, d in enumerate(shard_documents))
    assert enc.encode(enc.decode([3, 8])) == [3, 8] and enc.decode([8, 3]) == "<bos> s3"


def test_the_control_differs_from_the_mechanism_scale_only_in_the_attention_window():
    """Field by field, by value: the same data (so the same shards), students, teacher run and diagnostics;
    the teacher model (whose config every student's layers take) differs in attention_window alone."""
    differing = {f.name for f in fields(presets.Preset) if getattr(MECHANISM, f.name) != getattr(CONTROL, f.name)}
    assert differing == {"name", "about", "teacher_model"}
    changed = {k for k in {**MECHANISM.teacher_model, **CONTROL.teacher_model}
               if MECHANISM.teacher_model.get(k) != CONTROL.teacher_model.get(k)}
    assert changed == {"attention_window"} and CONTROL.teacher_model["attention_window"] == 16
    assert presets.teacher_shape(MECHANISM).attention_window == 0  # Qwen3's own causal attention
    options = {k: v for k, v in MECHANISM.data.items() if k in corpora.CORPUS_OPTIONS["backcopy"]}
    assert np.array_equal(backcopy_ids(42, 2, **options), backcopy_ids(42, 2, **options))


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

def planted_batch():
    """Two rows of the mechanism corpus's ids after <bos> (64), the second 9 positions shorter."""
    ids = torch.from_numpy(backcopy_ids(42, 2)[:, :31])
    input_ids = torch.cat([torch.full((2, 1), 64), ids], 1)
    mask = torch.arange(32)[None, :] < torch.tensor([32, 23])[:, None]
    return SimpleNamespace(input_ids=input_ids, mask=mask)


@pytest.mark.parametrize("window", [0, 4])
def test_the_scan_reads_a_planted_sink_and_massive_activation_on_mechanism_ids(window):
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
        rows = diag.layer_scan(net, batch, corpora.vocabulary(MECHANISM.data).decode, sink_attention=0.3)
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


def test_the_dry_run_prices_the_controls_window_not_full_causal_attention():
    """The control's teacher shape (queries 128 wide, window 16) at an average causal context of 128 keys: its
    layers' attention FLOPs are 4 * 128 * 16 a token a layer (QK^T and AV over 16 keys), the mechanism's
    4 * 128 * 128; the weights' FLOPs are the same. Full attention for both would make the difference 0."""
    windowed, full = presets.teacher_shape(CONTROL), presets.teacher_shape(MECHANISM)
    (control, head), (mechanism, same_head) = (forward_flops_per_token(c, 12, 128.0) for c in (windowed, full))
    assert head == same_head and mechanism - control == 12 * 4 * 128 * (128 - 16)
    assert forward_flops_per_token(windowed, 12, 8.0) == forward_flops_per_token(full, 12, 8.0)


def test_a_dry_run_prices_the_kits_own_teacher_where_it_must_be_pretrained_first(tmp_path):
    """The mechanism scale ships no teacher: its dry run adds the pretraining, 2,000 steps of 64 documents of
    256 tokens, 3x the forward (3 layers: 2 x 262,144 weights + 4 x 128 x 128 attention at 128 keys; the
    head 2 x 128 x 65) a token, counted by hand; none once the runs folder has one, or where a teacher ships."""
    ws = suite.workspace("mechanism", tmp_path, dry_run=True)
    flops, line = preflight.teacher_pretraining(ws)
    per_token = 3 * (2 * (128 * (2 * 128 + 2 * 128) + 3 * 128 * 512) + 4 * 128 * 128) + 2 * 128 * 65
    assert flops == 3 * 2000 * 64 * 256 * per_token and "2,000 steps of 64 documents (32.8M tokens" in line
    (ws.teacher_dir / "done.json").parent.mkdir(parents=True)
    (ws.teacher_dir / "done.json").write_text("{}")
    assert preflight.teacher_pretraining(ws) == (0.0, "")
    assert preflight.teacher_pretraining(suite.workspace("toy", tmp_path, dry_run=True)) == (0.0, "")


def test_the_scan_splits_a_backcopy_task_into_its_copies_and_its_chain_draws(tmp_path):
    """On a backcopy validation shard: an oracle (the chain's own log-probabilities for a draw, the copied
    symbol at +60 for a copy) has the chain's CE on the draws exactly and a copy CE of log(1 + 7 e^-60);
    a uniform model has log 9 on both. Counted by hand: a copy is a target after a trigger, a draw any other
    symbol after a symbol (<bos>'s first symbol and the closing <bos> are neither)."""
    enc = corpora.vocabulary({"source": "backcopy", "symbols": 8})
    options = dict(symbols=8, triggers=2, document_tokens=16)
    _, val = prepare_shards.prepare("backcopy", tmp_path, enc, max_len=16, n_train_docs=1, n_val_docs=5, seed=7,
                                    progress=False, workers=1, **options)
    chain, triggers = corpora.backcopy_chain(8, 2, 7)
    docs = backcopy_ids(7, 5, **options)                       # the val shard's symbols, <bos> before them
    copies = int(np.isin(docs[:, :-1], triggers).sum())       # targets 2..15 of each document's symbols
    draws = docs[:, 1:].size - copies

    def oracle(ids):
        logits = torch.full((*ids.shape, 9), -math.inf, dtype=torch.float64)
        for b, t in np.ndindex(*ids.shape):
            s = int(ids[b, t])
            if s < 8 and s in triggers:
                logits[b, t, :8], logits[b, t, int(ids[b, t - 1])] = 0.0, 60.0
            elif s < 8:
                logits[b, t, :8] = torch.from_numpy(np.log(chain[s]))
        return logits
    found = scan.backcopy_parts(val, oracle)
    expected_chain = -np.mean([np.log(chain[a, b]) for row in docs for a, b in zip(row[:-1], row[1:])
                               if a not in triggers])
    assert (found["copies"], found["draws"]) == (copies, draws) and copies > 0
    assert found["chain_ce"] == pytest.approx(expected_chain, rel=1e-12) == found["draw_ce"]
    assert found["copy_ce"] == pytest.approx(math.log1p(7 * math.exp(-60)), abs=1e-15) and found["copy_accuracy"] == 1.0
    uniform = scan.backcopy_parts(val, lambda ids: torch.zeros(*ids.shape, 9))
    assert uniform["copy_ce"] == pytest.approx(math.log(9), rel=1e-12) == uniform["draw_ce"]


def test_attention_on_the_previous_position_and_on_itself_by_hand():
    """One head of dimension 1, every query 1, keys 0, log 2, log 5: query 1 weighs keys 0, 1 as 1 : 2 (1/3 on
    the previous, 2/3 on itself), query 2 weighs them 1 : 2 : 5 (2/8, 5/8); with a window of 2, query 2 sees
    keys 1, 2 (2/7, 5/7)."""
    q = torch.ones(1, 1, 3, 1)
    k = torch.tensor([0.0, math.log(2), math.log(5)]).view(1, 1, 3, 1)
    # rel 1e-6: float32 softmax over three terms
    for window, last in ((0, [1 / 8, 2 / 8, 5 / 8]), (2, [0, 2 / 7, 5 / 7])):
        weights = first_token.attention_weights(q, k, window)
        assert weights[0, 0, 2].tolist() == pytest.approx(last, rel=1e-6)
        assert first_token.at_offset(weights, 1)[0, 0].tolist() == pytest.approx([0, 1 / 3, last[1]], rel=1e-6)
        assert first_token.at_offset(weights, 0)[0, 0].tolist() == pytest.approx([1, 2 / 3, last[2]], rel=1e-6)


def test_even_attention_on_the_first_token_is_the_mean_of_one_over_the_keys_seen():
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    assert diag.even_first_token_attention(mask) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4 + 1 / 2 + 1 / 3) / 5)
    assert diag.even_first_token_attention(mask, window=2) == pytest.approx((1 / 2 + 1 / 2) / 5)


def test_guo_measures_of_a_first_token_sink_equal_their_hand_computed_values():
    """tools/first_token.py on one layer whose queries are zero (every query spreads evenly: 1/(t+1) on position
    0 and on t - 1), whose values and output are the identity and whose MLP is off: the attention on position 0
    over the real queries and over the non-trigger ones, the non-trigger ones' on the previous position and
    on themselves, position 0's value (its normalised embedding) and residual (the embedding plus the running mean of the
    values) over the medians of the other real positions', by hand.
    Row 1 has a padded last position, which no mean or median may read."""
    config = ModelConfig(vocab_size=8, hidden_size=4, intermediate_size=4, num_hidden_layers=1, num_attention_heads=1,
                         num_key_value_heads=1, head_dim=4, qk_norm=False, rope_theta=10_000.0)
    net = model.Qwen3(config)
    net.init_weights(0)
    layer = net.layers[0]
    with torch.no_grad():
        layer.self_attn.q_proj.weight.zero_()
        layer.self_attn.v_proj.weight.copy_(torch.eye(4))
        layer.self_attn.o_proj.weight.copy_(torch.eye(4))
        layer.mlp.down_proj.weight.zero_()
        layer.attn_norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, 1.5]))
    ids, lengths = torch.tensor([[7, 1, 2, 3, 4], [7, 5, 6, 1, 0]]), torch.tensor([5, 4])
    dormant = ~torch.isin(ids, torch.tensor([1, 3]))  # tokens 1 and 3 are the triggers
    (row,) = first_token.measures(net, ids, lengths, dormant)
    # rel 1e-5: float32 rounding of softmaxes and norms over a handful of terms (~1e-7 each), nothing more
    real = [[t for t in range(n)] for n in lengths.tolist()]
    assert row["attention"][0] == pytest.approx(sum(1 / (t + 1) for r in real for t in r) / 9, rel=1e-5)
    quiet = [1 / (t + 1) for b, r in enumerate(real) for t in r if ids[b, t].item() not in (1, 3)]
    assert row["dormant_attention"][0] == pytest.approx(sum(quiet) / len(quiet), rel=1e-5)
    # Even attention puts 1/(t + 1) on position t - 1 too; position 0 has no previous one and is not read.
    after_first = [1 / (t + 1) for b, r in enumerate(real) for t in r if t > 0 and ids[b, t].item() not in (1, 3)]
    assert row["dormant_previous"][0] == pytest.approx(sum(after_first) / len(after_first), rel=1e-5)
    assert row["dormant_self"][0] == pytest.approx(sum(after_first) / len(after_first), rel=1e-5)
    emb, gain = net.embed_tokens.weight.detach(), layer.attn_norm.weight.detach()
    lower_median = lambda xs: sorted(xs)[(len(xs) - 1) // 2]  # torch.median's, for an even count
    values, residuals = [], []
    for b, r in enumerate(real):
        v = [gain * emb[ids[b, t]] / torch.sqrt(emb[ids[b, t]].pow(2).mean() + config.rms_norm_eps) for t in r]
        h = [emb[ids[b, t]] + sum(v[: t + 1]) / (t + 1) for t in r]
        values.append(v[0].norm().item() / lower_median([x.norm().item() for x in v[1:]]))
        residuals.append(h[0].norm().item() / lower_median([x.norm().item() for x in h[1:]]))
    assert row["value_ratio"][0] == pytest.approx(sum(values) / 2, rel=1e-5)
    assert row["residual_ratio"] == pytest.approx(sum(residuals) / 2, rel=1e-5)
