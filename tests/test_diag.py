"""diag.py against answers worked out by hand: planted activations, identity and negating blocks,
a synthetic loss curve, and figures whose drawn data is read back."""
import json
import math
from dataclasses import MISSING, fields
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import config
import diag
import model
import paper
from experiments import figures
from plumbing import errors
from plumbing.hf_qwen3 import ModelConfig

# ----------------------------------------------------------------------------------------------
# A hand-built batch: two rows, the second right-padded

VOCAB = {0: "<|endoftext|>", 1: " ", 2: "\n", 3: ",", 4: "hello", 5: " world", 6: ".\n\n", 7: "$",
         8: "\u3002", 9: ""}   # 8: ideographic full stop (Po); 9: an empty decode (part of a character)
ROWS = [[0, 4, 1, 5, 3, 2, 4, 6, 7, 8, 9, 4],
        [0, 5, 3, 1, 4, 2, 4, 4, 0, 0, 0, 0]]   # row 1: 8 real positions, then <|endoftext|> padding
LENGTHS = [12, 8]
B_, D_, R_, P_ = diag.BOUNDARY, diag.DELIMITER, diag.REGULAR, diag.PADDING
EXPECTED_TYPES = [[B_, R_, D_, R_, D_, D_, R_, D_, R_, D_, R_, R_],
                  [B_, R_, D_, D_, R_, D_, R_, R_, P_, P_, P_, P_]]


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def planted_batch(boundary_rms=100.0, delimiter_rms=1.0, hidden=8):
    """Hidden states whose per-token RMS is exactly known: +-c in every coordinate has RMS |c|.
    Boundary tokens get boundary_rms, delimiters delimiter_rms, regular tokens 1, padding 1e6."""
    input_ids = torch.tensor(ROWS)
    mask = torch.arange(12)[None, :] < torch.tensor(LENGTHS)[:, None]
    types = torch.tensor(EXPECTED_TYPES)
    scale = torch.ones(2, 12, dtype=torch.float64)
    scale[types == B_], scale[types == D_], scale[types == P_] = boundary_rms, delimiter_rms, 1e6
    signs = torch.randint(0, 2, (2, 12, hidden), generator=torch.Generator().manual_seed(0)) * 2 - 1
    return input_ids, mask, signs * scale[..., None]


def test_token_types_by_position_and_text():
    input_ids, mask, _ = planted_batch()
    assert diag.token_types(input_ids, mask, decode).tolist() == EXPECTED_TYPES


def test_boundary_stats_with_a_planted_massive_activation():
    input_ids, mask, hidden = planted_batch(boundary_rms=100.0)
    stats = diag.boundary_stats([hidden, hidden * 2], mask)
    # 20 real tokens: m = 2 boundary tokens at a = 100, the rest at 1; p = m/n = 0.1. For a two-valued
    # distribution: mean = 1 + p(a-1), population std = sqrt(p(1-p)) (a-1), Pearson kurtosis
    # = ((1-p)^3 + p^3) / (p(1-p)) = 0.73 / 0.09 = 73/9. Padding (RMS 1e6) must not count.
    a, p = 100.0, 0.1
    first, second = stats
    assert first["boundary"] == 0 and first["label"] == "entry" and second["label"] == "after block 0"
    assert first["tokens"] == 20
    assert first["mean"] == pytest.approx(1 + p * (a - 1), rel=1e-12)
    assert first["std"] == pytest.approx(math.sqrt(p * (1 - p)) * (a - 1), rel=1e-12)
    assert first["max"] == pytest.approx(a, rel=1e-12)
    assert first["kurtosis"] == pytest.approx(73 / 9, rel=1e-12)
    # Scaling every token by 2 doubles mean, std and max and leaves the kurtosis alone.
    assert second["std"] == pytest.approx(2 * first["std"], rel=1e-12)
    assert second["kurtosis"] == pytest.approx(73 / 9, rel=1e-12)


def test_shape_independent_statistics_agree_on_one_row_and_its_copies():
    """Distinct-state kurtosis, per-type means and spreads, and boundary / regular are properties of
    the documents, not of how many rows the batch has: one row and five copies of it agree."""
    input_ids, mask, hidden = planted_batch(boundary_rms=100.0, delimiter_rms=4.0)
    one = (input_ids[:1], mask[:1], hidden[:1])
    copies = (input_ids[:1].repeat(5, 1), mask[:1].repeat(5, 1), hidden[:1].repeat(5, 1, 1))
    results = []
    for ids, m, h in (one, copies):
        (stats,) = diag.boundary_stats([h], m)
        (types,) = diag.token_type_rms([h], m, diag.token_types(ids, m, decode))
        results.append((stats, types))
    (s1, t1), (s5, t5) = results
    assert s5["tokens"] == 5 * s1["tokens"] and s5["distinct_tokens"] == s1["distinct_tokens"] == 12
    assert s5["kurtosis_distinct"] == pytest.approx(s1["kurtosis_distinct"], rel=1e-12)
    for key in ("boundary_rms", "delimiter_rms", "regular_rms", "regular_rms_std", "delimiter_rms_std",
                "boundary_over_regular"):
        assert t5[key] == pytest.approx(t1[key], rel=1e-12), key
    assert t1["boundary_over_regular"] == pytest.approx(100.0, rel=1e-12) and t1["regular_rms_std"] == 0.0


def test_kurtosis_cap_of_a_repeated_boundary_outlier():
    """The planted batch is the cap's two-point case (2 outliers among 20 tokens: 73/9); the paper's
    2 x 2048 diagnostic batch caps the plain kurtosis near 2046, below its reported > 2400."""
    assert diag.kurtosis_cap(2, 20) == pytest.approx(73 / 9, rel=1e-12)
    assert 2045 < diag.kurtosis_cap(2, 2 * 2048) < 2047 < paper.PAPER["final_kurtosis_pre_above"]


def test_kurtosis_of_constant_values_is_undefined():
    assert diag.summarize(torch.ones(5))["kurtosis"] is None
    assert diag.summarize(torch.ones(5))["std"] == 0.0


def test_token_type_rms_splits_boundary_delimiter_regular():
    input_ids, mask, hidden = planted_batch(boundary_rms=100.0, delimiter_rms=4.0)
    types = diag.token_types(input_ids, mask, decode)
    (row,) = diag.token_type_rms([hidden], mask, types)
    assert row["boundary_rms"] == pytest.approx(100.0, rel=1e-12)
    assert row["delimiter_rms"] == pytest.approx(4.0, rel=1e-12)
    assert row["regular_rms"] == pytest.approx(1.0, rel=1e-12)
    assert row["boundary_over_regular"] == pytest.approx(100.0, rel=1e-12)
    assert (row["boundary_tokens"], row["delimiter_tokens"], row["regular_tokens"]) == (2, 8, 10)


# ----------------------------------------------------------------------------------------------
# Block removal on a tiny student

TINY = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
                   initializer_range=0.2)


def tiny_student(norm, seed=1):
    teacher = model.Qwen3(TINY)
    teacher.init_weights(0)
    return model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm=norm, seed=seed).eval()


def tiny_batch():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, TINY.vocab_size, (2, 10), generator=g)
    input_ids[:, 0] = 0
    targets = torch.randint(0, TINY.vocab_size, (2, 10), generator=g)
    mask = torch.arange(10)[None, :] < torch.tensor([10, 6])[:, None]
    input_ids[1, 6:], targets[1, 6:] = 0, 0
    return SimpleNamespace(input_ids=input_ids, targets=targets, mask=mask)


def test_angular_distance_known_angles():
    h = torch.randn(5, 16, dtype=torch.float64)
    assert diag.angular_distance(h, h).tolist() == [0.0] * 5
    assert diag.angular_distance(h, -h).tolist() == [1.0] * 5
    assert diag.angular_distance(h, 3 * h).abs().max() < 1e-15               # scale does not matter
    e0, e1 = torch.eye(2, dtype=torch.float64)
    assert diag.angular_distance(e0, e1).item() == pytest.approx(0.5, abs=1e-15)
    sixty = torch.tensor([0.5, math.sqrt(3) / 2], dtype=torch.float64)
    assert diag.angular_distance(e0, sixty).item() == pytest.approx(1 / 3, abs=1e-15)


def test_identity_block_has_zero_removal_effect():
    student = tiny_student("pre")
    with torch.no_grad():
        for layer in student.block_layers(1):   # pre-norm: each layer adds o_proj(...) and down_proj(...)
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    removal = diag.block_removal(student, tiny_batch())
    assert [r["block"] for r in removal] == [0, 1, 2]
    assert removal[1]["delta_ce"] == 0.0
    assert removal[1]["angular_distance"] == 0.0
    assert removal[0]["delta_ce"] != 0.0 and removal[0]["angular_distance"] > 0.01


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_block_removal_matches_full_logit_reference(norm):
    """dCE and angular distance against plain F.cross_entropy on full logits and arccos of the cosine."""
    student, batch = tiny_student(norm), tiny_batch()
    removal = diag.block_removal(student, batch)
    m = batch.mask
    with torch.no_grad():
        def ce(skip=None):
            return F.cross_entropy(student(batch.input_ids, skip_block=skip)[m].double(), batch.targets[m]).item()
        _, boundaries = student(batch.input_ids, return_boundaries=True)
    for r in removal:
        block = r["block"]
        cos = F.cosine_similarity(boundaries[block][m].double(), boundaries[block + 1][m].double(), dim=-1)
        assert r["ce_full"] == pytest.approx(ce(), rel=1e-5)
        assert r["delta_ce"] == pytest.approx(ce(block) - ce(), rel=1e-4, abs=1e-5)
        assert r["angular_distance"] == pytest.approx((cos.clamp(-1, 1).arccos() / math.pi).mean().item(), abs=1e-6)


# ----------------------------------------------------------------------------------------------
# Checkpoint series and one-checkpoint diagnosis

def write_run(run_dir, protocol, student):
    required = [f for f in fields(config.RunConfig) if f.default is MISSING and f.default_factory is MISSING]
    settings = {f.name: 1 for f in required}
    settings.update(name="t", protocol=protocol, norm=student.norm_placement, blocks=3, layers_per_block=2,
                    phase_steps=5, betas=[0.9, 0.95])
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(settings))
    phases = 3 if protocol == "grow" else 1
    for p in reversed(range(phases)):
        student.save(run_dir / f"phase-{p}")
        (run_dir / f"phase-{p}" / "trainer_state.json").write_text(json.dumps({"step": 5 * (p + 1), "phase": p}))


def test_checkpoint_series_and_diagnose(tmp_path):
    student = tiny_student("post")
    write_run(tmp_path / "grow", "grow", student)
    write_run(tmp_path / "joint", "joint", student)
    (tmp_path / "grow" / "phase-3.tmp").mkdir()   # a checkpoint still being written is not a kept one
    (tmp_path / "grow" / "phase-3.tmp" / "trainer_state.json").write_text(json.dumps({"step": 20, "phase": 3}))
    series = diag.checkpoint_series(tmp_path / "grow")
    assert [(c["step"], c["phase"], c["active_blocks"]) for c in series] == [(5, 0, 1), (10, 1, 2), (15, 2, 3)]
    assert [c["active_blocks"] for c in diag.checkpoint_series(tmp_path / "joint")] == [3]

    batch = tiny_batch()
    result = diag.diagnose_checkpoint(model.Student.load(series[1]["path"]), batch, decode_tiny, active_blocks=2)
    assert len(result["boundary_stats"]) == len(result["token_type_rms"]) == len(result["token_rms"]) == 3
    assert all(len(rms) == int(batch.mask.sum()) for rms in result["token_rms"])
    # Post-norm: the entry norm (teacher's final norm, all ones here) makes every entry RMS ~1.
    assert result["boundary_stats"][0]["mean"] == pytest.approx(1.0, abs=1e-3)
    assert result["token_type_rms"][0]["boundary_tokens"] == 2


def decode_tiny(ids):
    return "".join("," if i % 5 == 0 else "w" for i in ids)


# ----------------------------------------------------------------------------------------------
# Transition response on a synthetic curve (phase_steps 500; the known-answer tests fix the windows
# at 10 / 2 / 10 / 50 steps, below the default floor, so every value can be worked out by hand)

S = 500
WINDOWS = dict(baseline_window=10, smooth=2, short_window=10, long_window=50)


def synthetic_rows(after_transition, total=2 * S):
    """Steps 1..490 at 3.0 (outside the baseline window), 491..500 alternating 2.125 / 1.875 (mean
    exactly 2.0), then after_transition(k) at step S+k; plus evaluation rows that must be ignored."""
    rows = []
    for step in range(1, total + 1):
        if step <= S - 10:
            loss = 3.0
        elif step <= S:
            loss = 2.125 if (step - (S - 9)) % 2 == 0 else 1.875
        else:
            loss = after_transition(step - S)
        rows.append({"step": step, "phase": (step - 1) // S, "loss": loss})
        if step % 100 == 0:
            rows.append({"step": step, "phase": (step - 1) // S, "eval": True, "ce": 9.0, "loss": 9.0})
    return rows


def test_transition_scaled_windows():
    assert [diag.paper_scaled(n, S) for n in (1000, 200, 1000, 5000)] == [10, diag.MIN_WINDOW, 10, 50]
    assert diag.paper_scaled(200, 4) == 4   # at least MIN_WINDOW steps, but never longer than the phase
    assert diag.paper_scaled(1000, 50_000) == 1000
    r = diag.transition_response(synthetic_rows(lambda k: 2.0), S, S)
    assert (r["baseline_window"], r["smooth"], r["short_window"], r["long_window"]) == (10, 5, 10, 50)


def test_planted_spike_is_read_at_its_height():
    """+0.5 for one step on a flat loss: the immediate jump reads 0.5; the smoothed one dilutes it."""
    r = diag.transition_response(synthetic_rows(lambda k: 2.5 if k == 1 else 2.0), S, S)
    assert r["baseline"] == 2.0 and r["immediate_jump"] == 0.5
    assert 0 < r["jump"] < 0.5 / 2
    assert r["rose"] and r["recovery_steps"] is not None


def test_a_loss_that_never_rose_has_no_recovery():
    r = diag.transition_response(synthetic_rows(lambda k: 1.9), S, S)
    assert not r["rose"] and r["jump"] <= 0 and r["recovery_steps"] is None
    assert r["immediate_jump"] == pytest.approx(-0.1)


def test_transition_response_known_jump_auc_recovery():
    # Loss 2.5 at k=1, falling by 0.125 per step to a floor of 1.75 (reached at k=7).
    r = diag.transition_response(synthetic_rows(lambda k: max(2.625 - 0.125 * k, 1.75)), S, S, **WINDOWS)
    assert r["baseline"] == 2.0
    # Smoothed (2-step trailing mean): k=1: (1.875 + 2.5)/2 = 2.1875; k=2: (2.5 + 2.375)/2 = 2.4375 (peak);
    # k>=2 until the floor: 2.6875 - 0.125k, so k=5: 2.0625 > 2 and k=6: 1.9375 <= 2.
    assert r["jump"] == 0.4375 and r["peak_step"] == 2
    assert r["immediate_jump"] == 0.5  # the raw loss at k=1 and 2: 2.5, 2.375
    assert r["recovery_steps"] == 6
    # Excess over k=1..10: .5 .375 .25 .125 0 -.125 -.25 -.25 -.25 -.25 (sum 0.125, abs sum 2.375);
    # over k=1..50: sum 1.25 - 0.125 - 44 * 0.25 = -9.875, abs sum 12.375.
    assert r["auc_1k"] == pytest.approx(0.125 / 10, abs=1e-15)
    assert r["abs_auc_1k"] == pytest.approx(2.375 / 10, abs=1e-15)
    assert r["auc_5k"] == pytest.approx(-9.875 / 50, abs=1e-15)
    assert r["abs_auc_5k"] == pytest.approx(12.375 / 50, abs=1e-15)
    assert r["searched_steps"] == S


def test_transition_response_never_recovers():
    r = diag.transition_response(synthetic_rows(lambda k: max(2.625 - 0.125 * k, 2.25)), S, S, **WINDOWS)
    assert r["jump"] == 0.4375 and r["rose"]
    assert r["recovery_steps"] is None


def test_recovery_counts_only_after_the_peak():
    # k=1 at 2.0: smoothed (1.875 + 2.0)/2 <= baseline before any rise; then 2.5 (peak 2.25 at k=2,
    # tied at k=3), 2.0, then 1.875: smoothed 1.9375 <= 2 first at k=4.
    curve = {1: 2.0, 2: 2.5, 3: 2.0}
    r = diag.transition_response(synthetic_rows(lambda k: curve.get(k, 1.875)), S, S, **WINDOWS)
    assert r["peak_step"] == 2 and r["jump"] == 0.25
    assert r["recovery_steps"] == 4


def test_transition_responses_and_short_logs():
    rows = synthetic_rows(lambda k: 2.0, total=3 * S)
    assert [r["transition_step"] for r in diag.transition_responses(rows, S, blocks=3)] == [S, 2 * S]
    with pytest.raises(errors.TrainingError, match="lacks training steps"):
        diag.transition_response(rows[:S + 20], S, S)   # the 50-step window runs past the log


# ----------------------------------------------------------------------------------------------
# Figures: a real PNG, and the Figure that was saved holds the numbers it was given

@pytest.fixture
def saved_figures(monkeypatch):
    saved = []
    original = figures.save_png

    def capture(fig, path, caption=""):
        saved.append(fig)
        return original(fig, path, caption)
    monkeypatch.setattr(figures, "save_png", capture)
    return saved


def plotted_values(fig):
    """Every y value drawn as a line point or a bar height, on any axes of the figure."""
    values = []
    for ax in fig.axes:
        for line in ax.get_lines():
            values += [float(y) for y in line.get_ydata()]
        for container in ax.containers:
            values += [patch.get_height() for patch in container]
    return values


def legend_texts(fig):
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return " | ".join(t.get_text() for legend in legends for t in legend.get_texts())


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 15_000


def assert_drawn(fig, expected_values):
    drawn = plotted_values(fig)
    for value in expected_values:
        assert any(abs(value - d) < 1e-9 for d in drawn), f"{value} not drawn"
    assert "paper" in legend_texts(fig) + " ".join(ax.get_title() for ax in fig.axes)


@pytest.fixture(scope="module")
def checkpoint_series_by_norm():
    """diagnose_checkpoint results of tiny students at three 'checkpoints' (active blocks 1, 2, 3)."""
    batch = tiny_batch()
    return {norm: [{"step": 5 * a, **diag.diagnose_checkpoint(tiny_student(norm, seed=a), batch, decode_tiny, a)}
                   for a in (1, 2, 3)] for norm in ("pre", "post")}


def test_fig3a_interaction(tmp_path, saved_figures):
    kit = {"pre": {"joint": 3.1, "grow": 3.2}, "post": {"joint": 3.1, "grow": 3.0}}
    assert_png(figures.fig3a_interaction(kit, tmp_path / "fig3a.png"))
    (fig,) = saved_figures
    # The effect on its own axis: Δ = post − pre per protocol, kit 0.0 / -0.2, paper 0.0004 / -0.0328.
    assert_drawn(fig, [0.0, 3.0 - 3.2, 2.7607 - 2.7603, 2.7330 - 2.7658])
    assert "kit -0.2000" in fig.axes[0].get_title()     # (3.0 - 3.2) - (3.1 - 3.1)
    assert "paper -0.0332" in fig.axes[0].get_title()


def test_fig3b_per_phase(tmp_path, saved_figures):
    kit = {"pre": [3.5, 3.3, 3.2], "post": [3.6, 3.2, 3.0]}
    starts = {"pre": [21.0, 3.6, 3.4], "post": [13.0, 3.5, 3.3]}
    assert_png(figures.fig3b_per_phase(kit, tmp_path / "fig3b.png", starts=starts))
    (fig,) = saved_figures
    kit_deltas = [b - a for a, b in zip(kit["pre"], kit["post"])]
    start_deltas = [b - a for a, b in zip(starts["pre"], starts["post"])]
    assert_drawn(fig, kit["pre"] + kit["post"] + kit_deltas + start_deltas + [2.9846 - 2.9802, 2.7330 - 2.7658])


def test_fig4_boundary_std(tmp_path, saved_figures, checkpoint_series_by_norm):
    assert_png(figures.fig4_boundary_std(checkpoint_series_by_norm, tmp_path / "fig4.png", transition_steps=[5, 10]))
    expected = [c["boundary_stats"][b]["std"] for s in checkpoint_series_by_norm.values() for c in s
                for b in range(1, len(c["boundary_stats"]))]
    assert_drawn(saved_figures[0], expected + [5.81, 19.98])
    kit, paper = saved_figures[0].axes
    assert kit.get_yscale() == paper.get_yscale() == "log"
    assert 19.98 not in [float(y) for line in kit.get_lines() for y in line.get_ydata()]  # the paper has its own panel
    assert [list(line.get_xdata()) for line in kit.get_lines() if list(line.get_xdata()) in ([5, 5], [10, 10])] == \
        [[5, 5], [10, 10]]  # the block appends are marked


def test_fig5a_token_types(tmp_path, saved_figures, checkpoint_series_by_norm):
    assert_png(figures.fig5a_token_types(checkpoint_series_by_norm, tmp_path / "fig5a.png"))
    expected = [c["token_type_rms"][1][f"{t}_rms"] for s in checkpoint_series_by_norm.values() for c in s
                for t in ("boundary", "delimiter", "regular")]
    assert_drawn(saved_figures[0], expected + [119.0, 425.0, 7.1, 11.5, 2.45, 2.40])


def test_fig5b_validation(tmp_path, saved_figures):
    def rows(offset):
        out = [{"step": s, "phase": (s - 1) // 10, "loss": 4 - s / 30, "ce": 4 - s / 30 + offset} for s in range(1, 31)]
        return out + [{"step": s, "phase": s // 10 - 1, "eval": True, "ce": 3.9 - s / 40 + offset} for s in (10, 20, 30)]
    runs = {"pre": rows(0.0), "post": rows(-0.1)}
    assert_png(figures.fig5b_validation(runs, tmp_path / "fig5b.png", transition_steps=[10, 20], smooth=3))
    (fig,) = saved_figures
    assert_drawn(fig, [3.9 - s / 40 + o for o in (0.0, -0.1) for s in (10, 20, 30)] + [2.7658, 2.7330])
    transition_lines = [line for line in fig.axes[0].get_lines() if list(line.get_xdata()) in ([10, 10], [20, 20])]
    assert len(transition_lines) == 2


def test_figA1_rms_histograms(tmp_path, saved_figures):
    pre = [1.0] * 18 + [100.0] * 2          # Pearson kurtosis 73/9 = 8.1 (see the boundary-stats test)
    post = [2.0, 2.5, 2.25, 2.4, 2.1] * 4
    assert_png(figures.figA1_rms_histograms({"pre": pre, "post": post}, tmp_path / "figA1.png"))
    (fig,) = saved_figures
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and len(ax.patches) == 2
    assert "pre-norm: 20 tokens, Pearson kurtosis 8.1" in legend_texts(fig)
    assert "paper" in legend_texts(fig)


def test_figA2_block_removal(tmp_path, saved_figures):
    batch = tiny_batch()
    results = {run: diag.block_removal(tiny_student(run.split("-")[0], seed=i), batch)
               for i, run in enumerate(["pre-grow", "post-grow", "pre-joint", "post-joint"])}
    assert_png(figures.figA2_block_removal(results, tmp_path / "figA2.png"))
    (fig,) = saved_figures
    kit_axes, paper_axes = fig.axes[:2], fig.axes[2:]
    assert sum(len(c) for ax in kit_axes for c in ax.containers) == 2 * 4 * 3   # 2 metrics x 4 runs x 3 blocks
    paper_bars = [p.get_height() for ax in paper_axes for c in ax.containers for p in c]
    assert 8.13 in paper_bars and not any(8.13 == p.get_height() for ax in kit_axes for c in ax.containers for p in c)
    assert_drawn(fig, [r[m] for rs in results.values() for r in rs for m in ("delta_ce", "angular_distance")]
                 + [8.13, 0.031, 4.00])


def test_figures_carry_their_caption_and_a_pdf(tmp_path, saved_figures):
    path = figures.fig3a_interaction({"pre": {"joint": 3.1, "grow": 3.2}, "post": {"joint": 3.1, "grow": 3.0}},
                                            tmp_path / "fig3a.png", caption="normgrow, toy scale, seed 42 (fig3)")
    assert [t.get_text() for t in saved_figures[0].texts] == ["normgrow, toy scale, seed 42 (fig3)"]
    assert path.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"


# ----------------------------------------------------------------------------------------------
# The layer-by-layer scan: a planted massive activation and a forced sink head are found

def scan_batch(rows=2, length=32, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (rows, length), generator=g)
    input_ids[:, 0] = 0
    mask = torch.arange(length)[None, :] < torch.tensor([length, length - 7])[:, None]
    input_ids[~mask] = 0
    return SimpleNamespace(input_ids=input_ids, mask=mask)


def scan_decode(ids):
    return "".join("<|endoftext|>" if i == 0 else f"t{i}" for i in ids)


def test_layer_scan_finds_a_planted_massive_activation_with_its_channel_and_token():
    """Layer 2's output gets 1,000 added at row 1, position 5, channel 7: the scan's top activation at
    layer 2 is that one, with its token, and its ratio is that value over the median |activation|;
    layers 0 and 1, before the plant, have nothing near it."""
    config = ModelConfig(**{**TINY.__dict__, "num_hidden_layers": 4})
    teacher = model.Qwen3(config)
    teacher.init_weights(0)
    batch = scan_batch()

    def plant(module, args, output):
        output = output.clone()
        output[1, 5, 7] += 1000.0
        return output
    handle = teacher.layers[2].register_forward_hook(plant)
    try:
        rows = diag.layer_scan(teacher, batch, scan_decode, sink_attention=0.3)
    finally:
        handle.remove()
    assert [r["layer"] for r in rows] == [0, 1, 2, 3]
    top = rows[2]["top"][0]
    assert (top["channel"], top["row"], top["position"]) == (7, 1, 5)
    assert top["token"] == scan_decode([int(batch.input_ids[1, 5])])
    assert top["ratio"] == pytest.approx(top["abs"] / rows[2]["median_abs"]) and rows[2]["massive_ratio"] > 100
    assert all(r["massive_ratio"] < 0.1 * rows[2]["massive_ratio"] for r in rows[:2])
    # the residual stream carries it on: layer 3's output still has it at the same place
    assert (rows[3]["top"][0]["channel"], rows[3]["top"][0]["position"]) == (7, 5)


def test_layer_scan_counts_a_head_forced_to_attend_to_position_0_as_a_sink():
    """Layer 1's head 0 gets a query and a position-0 key along RoPE's slowest pair (a rotation below
    0.02 rad over 32 positions), so its score on position 0 is ~c^2 / sqrt(hd) and its attention there
    ~1: that layer's sink share rises by one head of four, the other layers' shares do not move."""
    config = ModelConfig(**{**TINY.__dict__, "num_hidden_layers": 3})
    teacher = model.Qwen3(config)
    teacher.init_weights(0)
    batch = scan_batch()
    before = diag.layer_scan(teacher, batch, scan_decode, sink_attention=0.3)
    attention = teacher.layers[1].self_attn
    project, dim, c = attention.project, config.head_dim // 2 - 1, 30.0

    def forced(x):
        q, k, v = project(x)
        q, k = q.clone(), k.clone()
        q[:, 0] = 0.0
        q[:, 0, :, dim] = c           # head 0 (of kv head 0's group): only the slow dimension
        q[:, 1, :, dim] = 0.0         # head 1 shares kv head 0: keep the planted key out of its scores
        k[:, 0, 0, dim] = c           # kv head 0's key at position 0
        return q, k, v
    attention.project = forced
    after = diag.layer_scan(teacher, batch, scan_decode, sink_attention=0.3)
    assert before[1]["sink_heads"] == 0.0 and after[1]["sink_heads"] == 0.25
    assert after[1]["first_token_attention"][0] > 0.99 and after[1]["max_head"] == after[1]["first_token_attention"][0]
    assert after[0]["sink_heads"] == before[0]["sink_heads"]


def test_layer_scan_of_a_student_reads_every_layer_of_its_active_blocks():
    """Two layers a block, two of three blocks active: four layer rows, each the output of that layer
    (the scan's hook), so the last row's output is the second block's boundary."""
    student = tiny_student("pre")
    batch = scan_batch()
    rows = diag.layer_scan(student, batch, scan_decode, sink_attention=0.3, active_blocks=2)
    assert [r["layer"] for r in rows] == [0, 1, 2, 3]
    _, boundaries = student(batch.input_ids, active_blocks=2, return_boundaries=True)
    real = boundaries[2][batch.mask].double().abs()
    assert rows[3]["median_abs"] == pytest.approx(real.median().item(), rel=1e-12)
