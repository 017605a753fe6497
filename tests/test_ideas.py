"""The paper's seven proposed improvements as options (issue 33; docs/preregistrations.md, 2026-12-02),
each tested by value, and the `ideas` experiment at smoke scale."""
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import distil_config, make_config, two_ranks_and_one_process

import config
import data
import grow
import model
import transitions
from interventions import boundary
from plumbing import errors

ROOT = Path(__file__).resolve().parents[1]

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
    return net, c, config.plan_phases(c)[1], next(data.eval_batches(tiny_shards[1], 8, packed=c.packs))


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
        _, before = net(micro.input_ids, active_blocks=2, return_boundaries=True, doc_lengths=micro.doc_lengths)
    event = transitions.at_transition(net, c, phase, [micro], lambda v: v)
    with torch.no_grad():
        _, bounds = net(micro.input_ids, active_blocks=2, return_boundaries=True, doc_lengths=micro.doc_lengths)
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
    transitions.at_transition(net, c, phase, [micro], lambda v: v)
    after = net.state_dict()
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    assert changed == ["layers.1.mlp_norm.weight"]
    assert torch.equal(after["layers.1.mlp_norm.weight"], torch.linspace(0.5, 2.0, 32))
    with pytest.raises(ValueError, match="preserve-output"):  # a pre-norm block has no output norm to start
        transitions.at_transition(*transition_setup(tiny_shards, tiny_teacher_dir, "pre",
                                                    append_init="preserve-output")[:3], [micro], lambda v: v)


def test_matched_freeze_run_logs_its_gain_at_each_transition(tiny_shards, tiny_teacher_dir, tmp_path):
    c = distil_config(tiny_shards, tiny_teacher_dir, norm="post", protocol="freeze", append_init="matched")
    grow.train(c, tmp_path / "run")
    found = events(tmp_path / "run")
    assert [e["block"] for e in found] == [1, 2]
    assert all(e["matched_gain"] == pytest.approx(e["reading"]["mean"]) for e in found)
    norms = weights(tmp_path / "run", 1)
    assert float(norms["layers.1.attn_norm.weight"][0]) != 1.0  # trained from the matched start, not from 1


# ---- 5. boundary monitoring with correction ----------------------------------------------------------

def test_correction_fires_above_its_threshold_and_not_at_it(tiny_shards, tiny_teacher_dir):
    """On the planted outlier (the boundary token at 37x): with monitor_ratio_warn at exactly the ratio
    read, nothing fires (the rule is "passes"); one float below it, the correction norm is switched on at
    block 1's input with its gain at the other tokens' mean RMS, so block 1 now reads a normalized stream."""
    net, c, phase, micro = transition_setup(tiny_shards, tiny_teacher_dir, "pre", boundary_correction="norm", **DOSE)
    with torch.no_grad():
        _, bounds = net(micro.input_ids, active_blocks=1, return_boundaries=True, doc_lengths=micro.doc_lengths)
        stats = transitions.reading([(net.enter_block(1, bounds[1], None), micro.mask, micro.first_positions())],
                                    lambda v: v)
    ratio = stats["boundary_over_others"]
    assert ratio > 20 and stats["mean"] < c.monitor_rms_warn and stats["kurtosis"] < c.monitor_kurtosis_warn
    at = transitions.at_transition(net, replace(c, monitor_ratio_warn=ratio), phase, [micro], lambda v: v)
    assert at["fired"] == [] and at["keep"] == {} and net.corrected == set()
    below = math.nextafter(ratio, 0.0)
    event = transitions.at_transition(net, replace(c, monitor_ratio_warn=below), phase, [micro], lambda v: v)
    assert event["fired"] == ["boundary_over_others"] and event["keep"] == {"corrected": True} and net.corrected == {1}
    assert torch.equal(net.correction_norms[0].weight, torch.full((32,), stats["others_mean"], dtype=torch.float32))
    with torch.no_grad():
        read = net.enter_block(1, bounds[1], None)
    rms = read.float().pow(2).mean(-1).sqrt()
    # every token at the gain: eps 1e-6 against the dosed stream's mean square, fp32 rounding ~1e-6
    assert torch.allclose(rms[micro.mask.bool()], torch.tensor(stats["others_mean"], dtype=torch.float32), rtol=1e-4)


def test_correction_run_logs_the_event_keeps_it_in_checkpoints_and_resumes(tiny_shards, tiny_teacher_dir, tmp_path):
    c = distil_config(tiny_shards, tiny_teacher_dir, norm="pre", boundary_correction="norm", **DOSE)
    whole = grow.train(c, tmp_path / "whole")
    found = events(tmp_path / "whole")
    assert [(e["block"], e["keep"]) for e in found] == [(1, {"corrected": True}), (2, {"corrected": True})]
    stored = json.loads((tmp_path / "whole" / "phase-2" / "config.json").read_text())["normgrow_student"]
    assert stored["corrected"] == [1, 2] and stored["features"] == ["correction"]
    loaded = model.Student.load(tmp_path / "whole" / "phase-2")
    assert loaded.corrected == {1, 2}
    grow.train(c, tmp_path / "killed", stop_after_step=9)  # after the first event, from a mid-phase checkpoint
    again = grow.train(c, tmp_path / "killed")
    assert again["ce"] == whole["ce"] and same_weights(weights(tmp_path / "killed"), weights(tmp_path / "whole"))
    plain = grow.train(replace(c, boundary_correction="none"), tmp_path / "plain")
    assert plain["ce"] != whole["ce"]


# ---- 6. structural-token-aware normalization -----------------------------------------------------------

def test_structural_norm_changes_only_the_boundary_token():
    """Position 0 comes out at scale x the median RMS of the row's other positions, its direction kept;
    every other position is bit-identical; the learned scale receives a gradient."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, 16, generator=g)
    h[:, 0] *= 37.0
    scale = torch.tensor(1.5, requires_grad=True)
    out = boundary.structural_norm(h, scale)
    assert torch.equal(out[:, 1:], h[:, 1:])
    rms = lambda x: x.pow(2).mean(-1).sqrt()
    expected = 1.5 * rms(h[:, 1:]).median(dim=1).values
    assert torch.allclose(rms(out[:, 0]), expected, rtol=1e-6)  # fp32: a few roundings of a 16-wide mean
    assert torch.allclose(torch.nn.functional.cosine_similarity(out[:, 0], h[:, 0], dim=-1), torch.ones(3), atol=1e-6)
    out[:, 0].sum().backward()
    assert scale.grad is not None and scale.grad != 0


def test_structural_student_applies_it_at_appended_blocks_only_and_round_trips(tiny_shards, tiny_teacher_dir, tmp_path):
    net, c, _, micro = transition_setup(tiny_shards, tiny_teacher_dir, "pre", structural_norm=True)
    assert c.student_features == ("structural",) and len(net.structural_scales) == 2
    h = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.equal(net.enter_block(0, h, None), h)
        entered = net.enter_block(2, h, None)
    assert torch.equal(entered[:, 1:], h[:, 1:]) and not torch.equal(entered[:, 0], h[:, 0])
    assert any(m is net.structural_scales[1] for m in net.block_modules(2))  # trains with block 2
    net.save(tmp_path / "s")
    loaded = model.Student.load(tmp_path / "s")
    with torch.no_grad():
        layout = {"doc_lengths": micro.doc_lengths}
        assert torch.equal(loaded(micro.input_ids, **layout), net(micro.input_ids, **layout))


# ---- 3. block-importance remedy ------------------------------------------------------------------------

def test_a_near_identity_block_is_redrawn_and_an_important_one_kept(tiny_shards, tiny_teacher_dir):
    """At the second transition, block 1 made an exact identity (its branches' output projections zeroed:
    pre-norm adds nothing) costs exactly 0 nats to remove, so it is re-drawn, bit for bit as the init draws
    a block from the remedy's own seed; block 0, whose removal costs more than the threshold, is kept."""
    net, c, _, micro = transition_setup(tiny_shards, tiny_teacher_dir, "pre", importance_remedy="reinit")
    phase = config.plan_phases(c)[2]
    with torch.no_grad():
        for layer in net.block_layers(1):
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    costs = transitions.removal_costs(net, [micro], 2, c.loss_chunk, lambda v: v)
    # an untrained block 0 matters little (~1e-3 nats): the threshold is put between the two costs
    assert costs[1] == 0.0 and costs[0] > 0
    c = replace(c, identity_threshold=costs[0] / 2)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    event = transitions.at_transition(net, c, phase, [micro], lambda v: v)
    assert event["reinitialized"] == [1] and event["removal_costs"]["1"] == 0.0
    expected = model.Student.from_teacher(model.load_qwen3(tiny_teacher_dir), 3, 1, "pre", seed=0)
    expected.reinit_block(1, torch.Generator().manual_seed(transitions.remedy_seed(c.seed, 2, 1)))
    after = net.state_dict()
    for k in after:
        if k.startswith("layers.1."):
            assert torch.equal(after[k], expected.state_dict()[k]) and not torch.equal(after[k], before[k]) or \
                k.endswith("norm.weight")  # norms are redrawn at 1, as they were
        else:
            assert torch.equal(after[k], before[k])
    with pytest.raises(errors.ConfigError, match="importance_remedy"):
        distil_config(tiny_shards, tiny_teacher_dir, protocol="freeze", importance_remedy="reinit")


# ---- 4. the placement search, and the experiment's reading -----------------------------------------------

def test_the_search_covers_every_schedule_under_the_suite_names():
    from experiments import ideas
    found = ideas.schedules(3)
    assert len(found) == 8 == len(set(found)) and found[0] == "pre" and found[-1] == "post"
    assert "pre,post,post" in found and all(model.block_norms(s, 3) for s in found)


def test_the_family_is_seven_primaries_adjusted_by_holm_with_an_untestable_one_at_p_1():
    """Seven primaries over 3 seeds, one with no spread (untestable): the other six's adjusted p-values
    are Holm's over all seven p-values with that one at 1; the readings follow the adjusted p."""
    from experiments import ideas, report
    values = [[-0.05, -0.06, -0.055], [0.01, -0.02, 0.005], [0.2, 0.21, 0.19], [0.0, 0.0, 0.0],
              [-0.001, 0.002, 0.0], [-0.3, -0.1, -0.2], [0.05, -0.04, 0.01]]
    rows = [{"idea": i + 1, "primary": True, "variant": f"v{i}", "delta": report.across_seeds(v)}
            for i, v in enumerate(values)]
    rows.append({"idea": 1, "primary": False, "variant": "s", "delta": report.across_seeds([0.1, 0.2, 0.3])})
    ideas.read_family(rows)
    raw = [report.p_two_sided(r["delta"]) for r in rows[:7]]
    assert math.isnan(raw[3])
    expected = report.holm([1.0 if math.isnan(p) else p for p in raw])
    for row, p in zip(rows[:7], expected):
        assert math.isnan(row["p_holm"]) if row["idea"] == 4 else row["p_holm"] == p
    assert rows[0]["reading"] == ("below 0" if expected[0] < 0.05 else "inconclusive")
    assert rows[2]["reading"] == ("above 0" if expected[2] < 0.05 else "inconclusive")
    assert rows[4]["reading"] == "a tie within ±0.01"  # |mean| + 1.69 SD below 0.01, and not significant
    assert rows[7]["reading"] == "secondary: interval only" and "p_holm" not in rows[7]


@pytest.fixture(scope="module")
def ideas_smoke(tmp_path_factory):
    base = tmp_path_factory.mktemp("ideas")
    done = subprocess.run([sys.executable, str(ROOT / "repro.py"), "ideas", "--scale", "smoke", "--runs-dir",
                           str(base / "runs"), "--results-dir", str(base / "results")], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return base


@pytest.mark.slow
def test_ideas_experiment_at_smoke_reads_what_its_runs_wrote(ideas_smoke):
    """One primary per idea; every Δ is its two runs' done.json CEs' difference; the search ran all 8
    schedules on seed 41 and chose the lowest; the planted outlier fired auto's and the correction's
    transitions; one seed gives no reading."""
    from experiments import ideas
    out = json.loads((ideas_smoke / "results" / "smoke" / "ideas.json").read_text())
    assert sorted(r["idea"] for r in out["rows"] if r["primary"]) == [1, 2, 3, 4, 5, 6, 7]
    runs = ideas_smoke / "runs" / "smoke"
    search = out["search"]
    assert search["seed"] == 41 and len(search["ce"]) == 8
    assert search["chosen"] == min(search["ce"], key=search["ce"].get)
    for name, value in search["ce"].items():
        assert value == json.loads((runs / "s41" / name / "done.json").read_text())["ce"]
    folders = {c.variant.label: c.variant for c in ideas.fixed_contrasts()}
    folders.update({c.baseline.label: c.baseline for c in ideas.fixed_contrasts()})
    for row in out["rows"]:
        if row["idea"] == 4:
            continue
        ce = [json.loads(((runs / "beyond" / folders[k].folder) if folders[k].folder else runs).joinpath(
            "s42", folders[k].run.name, "done.json").read_text())["ce"] for k in (row["variant"], row["baseline"])]
        assert row["delta"]["mean"] == pytest.approx(ce[0] - ce[1], abs=1e-12)
        assert row["reading"] in ("no reading: one seed", "secondary: interval only")
    text = {r["variant"]: r["transitions"] for r in out["rows"]}
    assert text["auto-grow + boundary 37x"].startswith("block 1: fired 1/1, kept {'placement': 'post'}")
    assert "kept {'corrected': True}" in text["pre-grow + boundary 37x + correction"]
    removal = [r["last_block_removal"] for r in out["rows"] if r["idea"] == 3]
    assert len(removal) == 2 and all(math.isfinite(r[k]["mean"]) for r in removal for k in ("option", "baseline"))
    # auto where nothing fires is pre-grow bit for bit: its CE and its transition jumps
    auto = next(r for r in out["rows"] if r["variant"] == "auto-grow")
    assert auto["delta"]["mean"] == 0.0 and auto["jump_delta"]["mean"] == 0.0
    assert out["diverged_runs"] == [] and "| 7 |" in (ideas_smoke / "results" / "smoke" / "ideas.md").read_text()


@pytest.mark.slow
def test_transition_options_under_fsdp2_two_ranks_match_one_process(tiny_shards, tiny_teacher_dir, tmp_path):
    """--norm auto, the boundary correction, the structural-token norm and matched init on the planted
    outlier: two torchrun ranks (FSDP2, gloo), each reading one of the process's two micro-batches at a
    transition, end bit-identical to one process (the reading sums the same tokens over ranks; its float64
    sums may differ in the last bits, far below the float32 gains they set)."""
    # the structural norm brings the planted token back to its row's scale before the reading, so the ratio
    # threshold is set low enough (0.5) that every transition fires and every option acts
    c = distil_config(tiny_shards, tiny_teacher_dir, norm="auto", boundary_correction="norm", structural_norm=True,
                      append_init="matched", monitor_ratio_warn=0.5, **DOSE)
    two_ranks_and_one_process(c, tmp_path)
    assert [e["keep"] for e in events(tmp_path / "fsdp")] == [e["keep"] for e in events(tmp_path / "single")] == \
        [{"placement": "post", "corrected": True}] * 2
    assert stored_norm(tmp_path / "fsdp") == stored_norm(tmp_path / "single") == "pre,post,post"
    assert same_weights(weights(tmp_path / "fsdp"), weights(tmp_path / "single"))
