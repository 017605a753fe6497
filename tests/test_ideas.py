"""The paper's seven proposed improvements as options (issue 33; docs/preregistrations.md, 2026-12-02),
each tested by value, and the `ideas` experiment at smoke scale."""
import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import distil_config, make_config

import config
import data
import errors
import grow
import model
import transitions

# ---- 1. transition-aware learning rate -------------------------------------------------------------

def test_asymmetric_transition_schedule_sets_the_lr_at_named_steps():
    """The toy's phases (250 steps, warmup 25, beta2 0.95): phase 0 as before; after the first append a
    warmup of 2 x 25 = 50 steps; after the second 0.5 x 25 = 12, raised to AdamW's horizon 1/(1 - 0.95) = 20."""
    c = make_config(phase_steps=250, warmup_frac=0.1, lr=3e-3, min_lr=3e-5, transition_schedule="asymmetric")
    plain = make_config(phase_steps=250, warmup_frac=0.1, lr=3e-3, min_lr=3e-5)
    lr = lambda step, phase: config.learning_rate(c, step, phase)
    assert [lr(s, 0) for s in (0, 24, 100)] == [config.learning_rate(plain, s, 0) for s in (0, 24, 100)]
    assert lr(24, 0) == pytest.approx(3e-3)
    assert lr(24, 1) == pytest.approx(3e-3 * 25 / 50) and lr(49, 1) == pytest.approx(3e-3)
    assert lr(9, 2) == pytest.approx(3e-3 * 10 / 20) and lr(19, 2) == pytest.approx(3e-3)
    # the cosine over the 230 steps after that warmup, toward min_lr
    assert lr(249, 2) == pytest.approx(3e-5 + 0.5 * (3e-3 - 3e-5) * (1 + math.cos(math.pi * 229 / 230)))


def test_explicit_transition_schedule_scales_warmup_and_peak_per_transition():
    c = make_config(phase_steps=100, warmup_frac=0.25, lr=1e-3, min_lr=1e-5, transition_schedule="1:0.5,3:2")
    assert config.learning_rate(c, 24, 1) == pytest.approx(0.5e-3)           # warmup 25, peak halved
    assert config.learning_rate(c, 74, 2) == pytest.approx(2e-3)             # warmup 75, peak doubled
    assert config.learning_rate(c, 36, 2) == pytest.approx(2e-3 * 37 / 75)
    for bad in ("fast", "2:1", "2:1,0:1", "2:1,x:1", "2:1:3,1:1"):
        with pytest.raises(errors.ConfigError, match="transition_schedule"):
            make_config(transition_schedule=bad)


# ---- the transition machinery (ideas 2, 3, 5, 7) ---------------------------------------------------

def events(run_dir):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("event")]


def stored_norm(run_dir, phase=2):
    return json.loads((run_dir / f"phase-{phase}" / "config.json").read_text())["normgrow_student"]["norm"]


def weights(run_dir, phase=2):
    return model.Student.load(run_dir / f"phase-{phase}").state_dict()


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- 7. --norm auto ----------------------------------------------------------------------------------

DOSE = dict(boundary="dose-boundary", boundary_scale=37.0)


def test_auto_under_joint_is_a_pre_norm_run(tiny_shards, tiny_teacher_dir, tmp_path):
    """Case 1: a joint run's auto is pre-norm, nothing read or changed: bit-identical to --norm pre."""
    auto = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", norm="auto")
    assert auto.student_norm == "pre" and not transitions.acts(auto)
    a = grow.train(auto, tmp_path / "auto")
    b = grow.train(replace(auto, norm="pre"), tmp_path / "pre")
    assert a["ce"] == b["ce"] and same_weights(weights(tmp_path / "auto", 0), weights(tmp_path / "pre", 0))


def test_auto_under_growth_keeps_pre_norm_where_nothing_fires(tiny_shards, tiny_teacher_dir, tmp_path):
    """Case 2: no outlier: both transitions read below every threshold, both appended blocks stay pre-norm,
    and the run is bit-identical to pre-grow (the reading's extra forward changes nothing)."""
    auto = distil_config(tiny_shards, tiny_teacher_dir, norm="auto")
    a = grow.train(auto, tmp_path / "auto")
    found = events(tmp_path / "auto")
    assert [e["block"] for e in found] == [1, 2] and all(e["fired"] == [] and e["keep"] == {"placement": "pre"}
                                                         for e in found)
    assert all(e["reading"]["boundary_over_others"] < auto.monitor_ratio_warn for e in found)
    b = grow.train(replace(auto, norm="pre"), tmp_path / "pre")
    assert a["ce"] == b["ce"] and stored_norm(tmp_path / "auto") == "pre"
    assert same_weights(weights(tmp_path / "auto"), weights(tmp_path / "pre"))


def test_auto_under_growth_appends_post_norm_where_the_planted_outlier_fires(tiny_shards, tiny_teacher_dir, tmp_path):
    """Case 3: the boundary token at 37x at every appended block's input: its ratio reads ~37 > sqrt(37),
    so each appended block is post-norm (pre,post,post), the same run as that schedule named outright."""
    auto = distil_config(tiny_shards, tiny_teacher_dir, norm="auto", **DOSE)
    a = grow.train(auto, tmp_path / "auto")
    found = events(tmp_path / "auto")
    assert [e["keep"] for e in found] == [{"placement": "post"}] * 2
    assert all("boundary_over_others" in e["fired"] and e["reading"]["boundary_over_others"] > 20 for e in found)
    assert stored_norm(tmp_path / "auto", 1) == "pre,post,pre" and stored_norm(tmp_path / "auto") == "pre,post,post"
    named = grow.train(replace(auto, norm="pre,post,post"), tmp_path / "named")
    assert a["ce"] == named["ce"] and same_weights(weights(tmp_path / "auto"), weights(tmp_path / "named"))


def test_a_named_placement_is_never_changed(tiny_shards, tiny_teacher_dir, tmp_path):
    """Case 4: --norm pre with the same outlier: no reading, no event, pre-norm throughout."""
    named = distil_config(tiny_shards, tiny_teacher_dir, norm="pre", **DOSE)
    assert not transitions.acts(named)
    grow.train(named, tmp_path / "pre")
    assert events(tmp_path / "pre") == [] and stored_norm(tmp_path / "pre") == "pre"


@pytest.mark.parametrize("stop", [6, 9])  # at the first transition itself, and inside phase 1
def test_auto_resumed_after_a_kill_reproduces_the_run(tiny_shards, tiny_teacher_dir, tmp_path, stop):
    """Killed at the transition's step or after it, the resumed run re-reads or re-applies the decision
    and ends bit-identical, with the event logged once per transition."""
    auto = distil_config(tiny_shards, tiny_teacher_dir, norm="auto", **DOSE)
    whole = grow.train(auto, tmp_path / "whole")
    grow.train(auto, tmp_path / "killed", stop_after_step=stop)
    again = grow.train(auto, tmp_path / "killed")
    assert again["ce"] == whole["ce"] and same_weights(weights(tmp_path / "killed"), weights(tmp_path / "whole"))
    assert [e["block"] for e in events(tmp_path / "killed")] == [1, 2]


# ---- 2. freeze-aware initialization of appended blocks ---------------------------------------------

def transition_setup(tiny_shards, tiny_teacher_dir, norm, **overrides):
    """A student from the tiny teacher, the config, phase 1 and a micro-batch of real documents."""
    c = distil_config(tiny_shards, tiny_teacher_dir, norm=norm, **overrides)
    teacher = model.load_qwen3(tiny_teacher_dir)
    net = model.Student.from_teacher(teacher, c.blocks, c.layers_per_block, c.student_norm, c.seed,
                                     boundary=c.boundary, boundary_scale=c.boundary_scale, features=c.student_features)
    return net, c, config.plan_phases(c)[1], next(data.eval_batches(tiny_shards[1], 8))


def mean_token_rms(h, mask):
    return float(h.float().pow(2).mean(-1).sqrt()[mask.bool()].mean())


def test_matched_init_starts_the_appended_block_at_the_prefix_boundary_scale(tiny_shards, tiny_teacher_dir):
    """A post-norm block appended to a pre-norm block 0 under freeze: its gains start at the mean per-token
    RMS r of the stream it reads, so its output's mean per-token RMS at the transition is r too (with gain 1
    it would be ~1; r is far from 1 here, so the test has teeth). Each token's output RMS is
    r * sqrt(ms / (ms + eps)): eps = 1e-6 against a mean square above 1e-2 at the norm's input, plus fp32
    rounding of a 32-wide mean (~1e-6), bounds the relative difference by 1e-4."""
    net, c, phase, micro = transition_setup(tiny_shards, tiny_teacher_dir, "pre,post,post", protocol="freeze",
                                            append_init="matched")
    with torch.no_grad():
        _, before = net(micro.input_ids, active_blocks=2, return_boundaries=True)
    event = transitions.at_transition(net, c, phase, micro, lambda v: v)
    with torch.no_grad():
        _, bounds = net(micro.input_ids, active_blocks=2, return_boundaries=True)
    r = mean_token_rms(bounds[1], micro.mask)
    # the reading sums in float64, this mean in float32: ~1e-7 apart over a few hundred tokens
    assert event["matched_gain"] == pytest.approx(r, rel=1e-6) and abs(r - 1) > 0.1
    assert mean_token_rms(bounds[2], micro.mask) == pytest.approx(r, rel=1e-4)
    assert mean_token_rms(before[2], micro.mask) == pytest.approx(1.0, rel=1e-4)  # the default init's scale
    assert torch.equal(bounds[1], before[1])  # the prefix untouched


def test_preserve_output_copies_the_previous_output_gain(tiny_shards, tiny_teacher_dir):
    """Post-norm growth: the appended block's output norm starts from block 0's trained gain, bit for bit;
    every other weight of the student is left as it was."""
    net, c, phase, micro = transition_setup(tiny_shards, tiny_teacher_dir, "post", append_init="preserve-output")
    with torch.no_grad():
        net.block_layers(0)[-1].mlp_norm.weight.copy_(torch.linspace(0.5, 2.0, 32))  # as if trained
    before = {k: v.clone() for k, v in net.state_dict().items()}
    transitions.at_transition(net, c, phase, micro, lambda v: v)
    after = net.state_dict()
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    assert changed == ["layers.1.mlp_norm.weight"]
    assert torch.equal(after["layers.1.mlp_norm.weight"], torch.linspace(0.5, 2.0, 32))
    with pytest.raises(ValueError, match="preserve-output"):  # a pre-norm block has no output norm to start
        transitions.at_transition(*transition_setup(tiny_shards, tiny_teacher_dir, "pre",
                                                    append_init="preserve-output")[:3], micro, lambda v: v)


def test_matched_freeze_run_logs_its_gain_at_each_transition(tiny_shards, tiny_teacher_dir, tmp_path):
    c = distil_config(tiny_shards, tiny_teacher_dir, norm="post", protocol="freeze", append_init="matched")
    grow.train(c, tmp_path / "run")
    found = events(tmp_path / "run")
    assert [e["block"] for e in found] == [1, 2]
    assert all(e["matched_gain"] == pytest.approx(e["reading"]["mean"]) for e in found)
    norms = weights(tmp_path / "run", 1)
    assert float(norms["layers.1.attn_norm.weight"][0]) != 1.0  # trained from the matched start, not from 1
