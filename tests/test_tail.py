"""The causal test by construction (experiments/tail.py): the tail in the student's own embedding row, what each
placement's blocks see of it at step 0, its contrasts and its power, by value."""
import json
import math
import shutil

import numpy as np
import pytest
import torch

import model
from experiments import power, presets, report, studies, tail
from experiments.suite import run_folder
from interventions.boundary import TAIL_CHANNEL, with_tail
from nets import hidden_only
from plumbing import errors
from tests.conftest import ROOT

TOY_TEACHER = ROOT / "teachers" / "toy" / "phase-0"
EOT = 4096  # the toy's <|endoftext|>: ranks 0..4095, then the boundary token (data.py)


@pytest.fixture(scope="module")
def toy_teacher():
    return model.load_qwen3(TOY_TEACHER)


def dosed_student(teacher, norm: str, value: float) -> model.Student:
    student = model.Student.from_teacher(teacher, 3, 1, norm, seed=42)
    with torch.no_grad():
        student.embed_tokens.weight.copy_(with_tail(student.embed_tokens.weight, EOT, value))
    return student


def block0_rms(student, ids) -> torch.Tensor:
    """Per-token RMS (B, T) of the stream after block 0 (the first block boundary)."""
    with torch.no_grad():
        _, bounds = student(ids, active_blocks=1, output_fn=hidden_only, return_boundaries=True)
    return bounds[1].float().pow(2).mean(-1).sqrt()


def ids_with_boundary(seed=0, rows=4, length=64):
    ids = torch.randint(0, EOT, (rows, length), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = EOT
    return ids


def test_the_dosed_row_is_the_declared_dose_and_the_teacher_is_untouched(toy_teacher):
    before = {k: v.clone() for k, v in toy_teacher.state_dict().items()}
    value = tail.tail_value("toy", tail.PAPER_RATIO, 128)
    student = dosed_student(toy_teacher, "pre", value)
    row, teacher_row = student.embed_tokens.weight[EOT], toy_teacher.embed_tokens.weight[EOT]
    assert row[TAIL_CHANNEL].item() == value  # 3380.5: exact in fp32 (a half is a power of two)
    others = torch.arange(128) != TAIL_CHANNEL
    assert torch.equal(row[others], teacher_row[others])
    assert torch.equal(student.embed_tokens.weight[:EOT], toy_teacher.embed_tokens.weight[:EOT])
    assert all(torch.equal(v, toy_teacher.state_dict()[k]) for k, v in before.items())
    # the value is 37 x the measured regular RMS x sqrt(H): a one-channel row's RMS is value / sqrt(H)
    assert value / math.sqrt(128) == pytest.approx(37 * tail.REGULAR_RMS["toy"], rel=1e-4)


def test_pre_norm_carries_the_tail_past_block_0_and_post_norm_sees_its_norm_gain(toy_teacher):
    ids, value = ids_with_boundary(), tail.tail_value("toy", tail.PAPER_RATIO, 128)
    pre = block0_rms(dosed_student(toy_teacher, "pre", value), ids)
    ratio = (pre[:, 0].mean() / pre[:, 1:].mean()).item()
    assert ratio > tail.CHECK_RATIO
    # block 0's branches add O(10) to a stream whose position 0 is value / sqrt(H) = 298.8: it stays near that
    assert pre[:, 0].mean().item() == pytest.approx(value / math.sqrt(128), rel=0.1)
    # Post-norm: block 0 ends in an RMSNorm (gain g, ones at init): y = g * v / rms(v). Position 0 reads the entry
    # norm's output, along the tail's channel, and block 0 adds to it terms the size of the regular tokens', so
    # v is no longer one channel: its RMS after the norm is sqrt(mean(g^2 v^2) / mean(v^2)), computed here by hand.
    student = dosed_student(toy_teacher, "post", value)
    with torch.no_grad():
        _, bounds = student(ids, active_blocks=1, output_fn=hidden_only, return_boundaries=True)
    layer = student.block_layers(0)[-1]
    gain = layer.mlp_norm.weight.float()
    out = bounds[1].float()
    v = out / gain                                  # the norm's input direction, up to its positive scale
    by_hand = (gain.pow(2) * v.pow(2)).mean(-1).div(v.pow(2).mean(-1)).sqrt()
    assert torch.allclose(out.pow(2).mean(-1).sqrt(), by_hand, rtol=1e-5)  # fp32: one rounding per op
    assert torch.allclose(gain, torch.ones_like(gain))  # the paper's init: so every token's RMS is 1 (eps aside)
    post = block0_rms(student, ids)
    assert (post[:, 0].mean() / post[:, 1:].mean()).item() == pytest.approx(1.0, abs=1e-3)
    # what its first sublayer reads at position 0: the entry norm's gain on the channel times sqrt(H), ~0 elsewhere
    entry = student.entry_module()(student.embed_tokens(ids[:1, :1]))[0, 0]
    g = student.entry_module().weight
    assert entry[TAIL_CHANNEL].item() == pytest.approx(g[TAIL_CHANNEL].item() * math.sqrt(128), rel=1e-4)
    assert entry[1:].abs().max().item() < 1e-3 * abs(entry[TAIL_CHANNEL].item())


def test_d_on_planted_numbers_equals_a_hand_computation():
    seeds = 3
    ce = {"pre-grow": [3.50, 3.52, 3.49], "pre-joint": [4.00, 4.02, 3.98],
          "pre-grow + tail 37x": [3.60, 3.61, 3.58], "pre-joint + tail 37x": [4.05, 4.04, 4.03],
          "post-grow": [3.48, 3.50, 3.47], "post-joint": [3.79, 3.80, 3.78],
          "post-grow + tail 37x": [3.49, 3.51, 3.47], "post-joint + tail 37x": [3.80, 3.80, 3.79],
          "pre-grow + tail 6x": [3.51] * seeds, "pre-joint + tail 6x": [4.00] * seeds}
    for n in ("pre", "post"):
        for p in ("grow", "joint"):
            ce[f"{n}-{p} + channel 1000x"] = ce[f"{n}-{p}"]
    # seed 0: (3.60 - 3.50) - (4.05 - 4.00) = 0.05; seed 1: 0.09 - 0.02 = 0.07; seed 2: 0.09 - 0.05 = 0.04
    assert tail.contrast(ce, "tail 37x", "pre") == pytest.approx([0.05, 0.07, 0.04])
    rows = tail.family(ce)
    assert rows[0]["primary"] and rows[0]["d"]["mean"] == pytest.approx(0.16 / 3)
    half = report.t_quantile(2, 0.975) * rows[0]["d"]["std"] / math.sqrt(3)
    assert rows[0]["d"]["ci95"] == pytest.approx([0.16 / 3 - half, 0.16 / 3 + half])
    assert rows[0]["reading"] == "above 0"
    # post: (0.01 - 0.01, 0.01 - 0.00, 0.00 - 0.01) = (0, 0.01, -0.01); three-way: (0.05, 0.06, 0.05)
    assert rows[1]["d"]["values"] == pytest.approx([0.0, 0.01, -0.01], abs=1e-12)
    assert rows[2]["d"]["values"] == pytest.approx([0.05, 0.06, 0.05])
    assert rows[4]["d"]["values"] == pytest.approx([0.0] * 3, abs=1e-12)  # the channel dose changed nothing here
    raw = [report.p_two_sided(r["d"]) for r in rows[1:]]
    finite = [p for p in raw if not math.isnan(p)]
    assert max(r["p"] for r in rows[1:] if not math.isnan(r["p"])) <= 1 and len(finite) >= 2


def test_power_matches_the_normal_approximation_where_it_holds():
    # with many seeds the t-test is the z-test: power = Phi(effect sqrt(n) / sd - z_0.975)
    n, effect, sd = 40, 0.01, 0.02
    z = effect * math.sqrt(n) / sd - report.t_quantile(n - 1, 0.975)
    expected = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    assert power.power(effect, sd, n, draws=400_000) == pytest.approx(expected, abs=0.01)
    assert power.power(0.0, sd, 8) == pytest.approx(0.025, abs=0.003)  # one tail of a 5% two-sided test


def test_the_regular_rms_is_what_the_committed_records_measure():
    from experiments import studies
    measured = tail.measure_regular_rms(studies.RECORDS_DIR / "toy")
    assert sum(measured) / len(measured) == pytest.approx(tail.REGULAR_RMS["toy"], abs=5e-5)
    assert tail.CHECK_RATIO == presets.MECHANISM["boundary_over_regular"] == 10.0


def test_a_scale_without_a_measured_rms_is_refused():
    with pytest.raises(errors.OptionError, match="--scale: mini: .* choose toy or smoke, or measure it"):
        tail.tail_value("mini", 37.0, 128)
    assert tail.check_scale("toy") is None and tail.check_scale("smoke") is None


def one_seed_reader(label: str):
    """A finished run of every label on seed 42, its CE set by its label: done.json, a monitor row, a machine."""
    ce = 3.0 + sum(map(ord, label)) % 97 / 1000
    rows = [{"step": 8, "phase": 0, "monitor": True, "boundaries": [{"boundary": 1, "boundary_over_others": 12.0}],
             "first_attention": [[0.1, 0.2]]}]
    return {"ce": ce}, rows, studies.machine_row(label, {"cpu": "x", "precision": "float32"}, 1.0)


def test_one_seed_writes_a_report_that_reads_nothing():
    """Issue 59 §6: smoke's default single seed trained and recorded every run, then the report died in the power
    calculation (math domain error) and the correlation of D over seeds; now its report says "no reading: one seed"
    (a seed recorded now joins later seeds' records), and the power line says there is none."""
    folders = [run_folder(v.run.name, 42, v.folder) for v in tail.variants("smoke", 32)]  # as studies.Job.label
    out = tail.outcome("smoke", 32, [42], {folder: one_seed_reader(folder) for folder in folders})
    assert out["recorded"] == out["runs"] == 14 and math.isnan(out["doses"]["d_correlation"])
    assert out["family"][0]["reading"] == "no reading: one seed" and out["position_state"] is None
    text = "\n".join(tail.markdown(out))
    assert "Power for the paper's size (0.033): none: no reading: one seed" in text
    assert "| **D, pre-norm, tail 37x (primary)** |" in text and "no reading: one seed |" in text
    assert "none: no reading: one seed" in tail.headline_claim(out)[0]
    assert tail.correlation([0.1, 0.1], [0.2, 0.3]) != tail.correlation([0.1, 0.1], [0.2, 0.3])  # constant: NaN
    assert tail.correlation([0.1, 0.2], [0.2, 0.4]) == pytest.approx(1.0)


def test_the_dry_run_and_the_page_refuse_the_same_record_in_the_same_words(tmp_path):
    """Issue 59 §5: a 37x record edited to boundary_tail 0.0 with its identity and sha256 recomputed was read by the
    page as the 37x dose while `tail --dry-run` called it stale. Both now ask studies.survey, the one check: the dry
    run lists it stale, the page refuses it in one line, each naming the setting; the study's restore, the same."""
    from bad_records import sealed
    from click.testing import CliRunner

    import repro
    shutil.copytree(studies.RECORDS_DIR / "toy", tmp_path / "records" / "toy")
    path = tmp_path / "records" / "toy" / "beyond" / "tail-37" / "s42" / "pre-grow.json"
    record = json.loads(path.read_text())
    record["config"]["boundary_tail"] = 0.0
    path.write_text(json.dumps(sealed(record)))
    why = "the run's settings changed (boundary_tail 0.0 in the record, 3380.5 in the run trained there)"
    with pytest.raises(errors.TrainingError) as refused:
        tail.recorded_outcome("toy", tmp_path / "records")
    assert str(refused.value).startswith(f"{path}: stale, {why}; a page reads only the runs its study trains")
    result = CliRunner().invoke(repro.cli, ["tail", "--scale", "toy", "--dry-run", "--runs-dir", str(tmp_path / "runs"),
                                            "--records-dir", str(tmp_path / "records")])
    assert result.exit_code == 0 and f"stale: {path} ({why})" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "runs").exists()


def test_tie_power_matches_the_normal_approximation_where_it_holds():
    # with many seeds the 90% t-interval is the z-interval: P(|mean| + z_0.95 se < m) for mean ~ N(0, se^2)
    n, sd, margin = 60, 0.02, 0.01
    se = sd / math.sqrt(n)
    room = (margin - report.t_quantile(n - 1, 0.95) * se) / se
    expected = math.erf(room / math.sqrt(2))  # P(|Z| < room)
    assert power.tie_power(0.0, sd, n, margin, draws=400_000) == pytest.approx(expected, abs=0.01)
    assert power.tie_power(0.05, sd, 8, margin) == 0.0  # an effect five margins away is never a tie


# ----------------------------------------------------------------------------------------------
# What the tie tests (issue 57): position 0's state, the two doses, the attention on position 0, by value

def test_position_0s_state_is_the_same_for_every_document_and_position_1s_is_not(toy_teacher):
    """Causal attention: position 0 attends to itself alone (a softmax over one key is exactly 1), RoPE at position 0
    is the identity and every other operation is per row, so the same token gives the same bits in every row of the
    batch, at every block boundary and in either placement; position 1 holds each document's own token."""
    ids = tail.documents(EOT, 6, 64, seed=3)
    assert len(set(ids[:, 1].tolist())) > 1 and (ids[:, 0] == EOT).all()
    for norm in ("pre", "post"):
        student = dosed_student(toy_teacher, norm, tail.tail_value("toy", tail.PAPER_RATIO, 128))
        assert tail.position_spread(student, ids, 0) == [0.0] * 4  # input of block 0, then each of its 3 blocks' outputs
        assert min(tail.position_spread(student, ids, 1)) > 0.1
    # by hand at the last boundary: max over channels of (max - min over documents)
    with torch.no_grad():
        _, bounds = student(ids, output_fn=hidden_only, return_boundaries=True)
    h = bounds[-1][:, 1]
    assert tail.position_spread(student, ids, 1)[-1] == (h.max(0).values - h.min(0).values).max().item()


def test_the_pages_position_state_is_built_from_the_shipped_teacher_with_the_37x_dose():
    state = tail.position_state("toy")
    assert state["teacher"] == "teachers/toy" and state["documents"] == tail.DOCUMENTS and state["length"] == 128
    assert presets.PRESETS["toy"].data["vocab_size"] == EOT  # the boundary token the built student doses
    for norm in ("pre", "post"):
        assert state[norm][0] == [0.0] * 4 and min(state[norm][1]) > 0.1


def monitor(step, attention):
    return {"step": step, "phase": 0, "monitor": True, "boundaries": [], "first_attention": attention}


def test_the_attention_on_position_0_is_the_last_monitor_rows_mean_over_heads_seeds_and_runs():
    rows_a = [monitor(1, [[0.9, 0.9], [0.9, 0.9]]), {"step": 2, "eval": True}, monitor(3, [[0.1, 0.3], [0.2, 0.2]])]
    rows_b = [monitor(3, [[0.5, 0.1], [0.0, 0.4]])]
    rows_c = [monitor(3, [[0.2, 0.2], None])]                # a layer that did not run is left out
    assert tail.last_attention(rows_a) == [[0.1, 0.3], [0.2, 0.2]] and tail.last_attention(rows_c) == [[0.2, 0.2]]
    got = tail.attention_summary({"x": [tail.last_attention(rows_a), tail.last_attention(rows_b)],
                                  "y": [tail.last_attention(rows_c)]})
    # layer 0: (0.1 + 0.3 + 0.5 + 0.1 + 0.2 + 0.2) / 6; layer 1: (0.2 + 0.2 + 0.0 + 0.4) / 4
    assert got["layers"] == pytest.approx([1.4 / 6, 0.2]) and got["highest"] == 0.5


def test_the_committed_records_attention_is_their_last_monitor_rows():
    out = tail.recorded_outcome("toy")
    record = studies.read_record(studies.RECORDS_DIR / "toy" / "beyond" / "tail-37" / "s42" / "pre-grow.json")
    last = [r for r in record["metrics"] if r.get("monitor")][-1]["first_attention"]
    assert tail.last_attention(record["metrics"]) == last and len(last) == 3
    assert max(h for layer in last for h in layer) <= out["attention"]["37x"]["highest"] < presets.SINK["attention"]


def planted_ce(grow_37x_minus_6x: float) -> dict:
    ce = {"pre-grow": [3.50, 3.52, 3.49], "pre-joint": [4.00, 4.02, 3.98], "post-grow": [3.48, 3.50, 3.47],
          "post-joint": [3.79, 3.80, 3.78], "pre-grow + tail 37x": [3.60, 3.61, 3.58],
          "pre-joint + tail 37x": [4.05, 4.04, 4.03], "pre-joint + tail 6x": [4.05, 4.04, 4.03]}
    ce["pre-grow + tail 6x"] = [v - grow_37x_minus_6x + d for v, d in zip(ce["pre-grow + tail 37x"], (0, 1e-3, -1e-3))]
    for n in ("pre", "post"):
        for p in ("grow", "joint"):
            ce[f"{n}-{p} + tail 37x"] = ce.get(f"{n}-{p} + tail 37x", ce[f"{n}-{p}"])
    ce |= {"pre-grow + channel 1000x": [3.50, 3.52, 3.49], "pre-joint + channel 1000x": [4.01, 4.03, 3.99],
           "post-grow + channel 1000x": [3.48, 3.50, 3.47], "post-joint + channel 1000x": [3.89, 3.92, 3.86]}
    return ce


def test_the_two_doses_agreement_and_the_channels_parts_by_value():
    ce = planted_ce(0.0)
    doses = tail.dose_agreement(ce)
    assert doses["ce_difference"]["grow"]["values"] == pytest.approx([0.0, -1e-3, 1e-3])
    assert doses["ce_difference"]["joint"]["values"] == [0.0] * 3
    assert doses["ce_difference"]["grow"]["reading"] == "a tie within ±0.01"
    d37, d6 = tail.contrast(ce, "tail 37x", "pre"), tail.contrast(ce, "tail 6x", "pre")
    assert doses["d_correlation"] == pytest.approx(np.corrcoef(d37, d6)[0, 1])
    assert tail.dose_agreement(planted_ce(0.05))["ce_difference"]["grow"]["reading"] == "above 0"
    # channel: D pre = (0 - 0.01) per seed = -0.01; D post = 0 - (0.10, 0.12, 0.08)
    pre, post = tail.channel_parts(ce)
    assert pre["d"]["values"] == pytest.approx([-0.01] * 3) and post["d"]["values"] == pytest.approx([-0.10, -0.12, -0.08])
    assert post["reading"] == "below 0"
    assert tail.family(ce)[4]["name"] == "three-way: D pre - D post, channel 1000x"
    three_way = {"name": "three-way: D pre - D post, channel 1000x", "reading": "above 0"}  # Holm's, as the records
    words = tail.channel_words({"family": [three_way], "channel_parts": [pre, post]})
    assert "Its \"above 0\" is post-norm's" in words and "the opposite sign to the account's" in words
    pre_above = {**pre, "reading": "above 0"}
    words = tail.channel_words({"family": [three_way], "channel_parts": [pre_above, post]})
    assert "post-norm's:" not in words and "as the account predicts" in words


@pytest.mark.parametrize("facts, words", [
    ({"same_state": True, "sizes_tie": True, "no_sink": True, "d": "a tie within ±0.01"},
     ["one constant vector", "D's tie within ±0.01 refutes, at this scale,", "it does not test the drift",
      "119 → 425", "7.1 → 11.5"]),
    ({"same_state": True, "sizes_tie": True, "no_sink": True, "d": "inconclusive"}, ["neither refutes nor supports"]),
    ({"same_state": True, "sizes_tie": True, "no_sink": True, "d": "above 0"}, ["it supports the literal reading"]),
    ({"same_state": False, "sizes_tie": False, "no_sink": True, "d": "a tie within ±0.01"},
     ["more than a constant vector", "position 0's state differs across documents; the two doses' CE is not a tie"]),
])
def test_what_the_tie_tests_is_worded_by_rule(facts, words):
    text = tail.scope_conclusion(facts)
    assert all(w in text for w in words), text
    if not (facts["same_state"] and facts["sizes_tie"]):
        assert "does not test the drift" not in text


def test_a_run_without_monitor_rows_gives_no_attention_and_no_sink_claim():
    assert tail.last_attention([{"step": 1, "loss": 3.0}]) == []
    got = tail.attention_summary({"x": [[], []]})
    assert got["layers"] == [] and math.isnan(got["highest"]) and not got["highest"] < presets.SINK["attention"]
