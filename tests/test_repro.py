"""repro.py: presets, the smoke suite end to end (killed and resumed), shared prefixes, the CLI."""
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import repro_cli
from safetensors.torch import load_file

import config
import data
import diag
import grow
import model
import repro
import rundir
from experiments import presets, report, suite, tables
from plumbing import devices, errors, tokenizer
from tools import checkpoints, plan

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, check=True):
    """The CLI as a user starts it, in its own process (where sys.argv and the environment matter)."""
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), *map(str, args)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


# ---- presets -----------------------------------------------------------------------------------

def test_full_preset_is_the_paper():
    full = presets.PRESETS["full"]
    table_a1 = dict(seed=42, blocks=3, layers_per_block=3, phase_steps=50_000, global_batch=64, lr=1e-4, min_lr=1e-6,
                    warmup_frac=0.015, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, grad_clip=0.5, alpha=0.7,
                    gamma=0.3, tau=1.0, eval_interval=2000, precision="bf16", activation_checkpointing=True)
    assert {k: full.run[k] for k in table_a1} == table_a1
    assert round(full.run["warmup_frac"] * full.run["phase_steps"]) == 750
    assert full.data == dict(source="fineweb-edu", vocab_size=None, max_len=8192, val_docs=4833)
    assert full.teacher == "Qwen/Qwen3-8B-Base" and full.long_phases == (2, 3)
    assert full.diag == dict(docs=2, max_inputs=2048, seed=42)
    ws = suite.Workspace(full, Path("/nonexistent/full"), Path("/nonexistent"), devices.Dist())
    assert ws.replay_docs == 3_200_000 and ws.train_docs == 9_600_000
    for name in tables.RUNS:  # every run of the full suite is a valid RunConfig with the paper's settings
        settings = suite.run_config(ws, name, 42)
        assert not settings.freeze_trains_head and not settings.reset_data_each_phase
    assert len(config.plan_phases(suite.run_config(ws, suite.RunName("post", "joint-longer"), 42))) == 3


def test_dry_run_reproduces_table_a2():
    ws = suite.Workspace(presets.PRESETS["full"], Path("/nonexistent/full"), Path("/nonexistent"), devices.Dist())
    runs = plan.planned_runs(ws, list(tables.RUNS), 42)
    result = plan.print_plan(ws, runs, [42], "h100", 8, suite.console)
    rows = {r[0]: r for r in result["rows"]}
    # columns: run, phases, steps, active layers, tokens, unique, active-layer tokens, PFLOPs, GPU-hours
    assert rows["post-joint"][1:7] == ["1", "50,000", "9", "3.11B", "3.11B", "28.01B"]
    assert rows["post-grow"][1:7] == ["3", "150,000", "3 / 6 / 9", "9.34B", "3.11B", "56.02B"]
    assert rows["post-joint-long"][4:7] == ["6.22B", "6.22B", "56.02B"]  # active-layer tokens match grow's
    assert rows["post-joint-longer"][4:6] == ["9.34B", "9.34B"]
    assert float(rows["post-grow"][8].replace(",", "")) > float(rows["post-joint"][8].replace(",", ""))


def test_dry_run_counts_teacher_passes_both_ways():
    """Separately every run pays its own steps, per norm: joint 50k, grow 150k, freeze 100k (after the
    shared phase 0), the long controls 50k each after their prefixes, the same-shard control 100k after
    joint's phase: 1,000k. In lockstep the six replay runs and the two same-shard controls share 150k
    teacher steps, and the four fresh-data long controls still pay 200k: 350k."""
    ws = suite.Workspace(presets.PRESETS["full"], Path("/nonexistent/full"), Path("/nonexistent"), devices.Dist())
    runs = plan.planned_runs(ws, list(tables.RUNS), 42)
    assert plan.teacher_passes(runs, lockstep=False) == 2 * (50_000 + 150_000 + 100_000 + 50_000 + 50_000 + 100_000)
    assert plan.teacher_passes(runs, lockstep=True) == 150_000 + 4 * 50_000
    assert plan.most_resident(runs) == 6  # joint ends where freeze joins; the same-shard controls run throughout
    result = plan.print_plan(ws, runs, [42], "h100", 8, suite.console)
    saved = result["separate"]["flops"] - result["lockstep"]["flops"]
    teacher = plan.model_shapes(ws.preset)[0]
    layers, _ = model.forward_flops_per_token(teacher, 36, 972.5 / 2)
    assert saved == pytest.approx((1_000_000 - 350_000) * 64 * 972.5 * layers)
    assert result["lockstep"]["memory_gib"] > result["separate"]["memory_gib"]
    assert result["lockstep_default"] == (result["lockstep"]["memory_gib"] <= 0.9 * 80)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_full_without_cuda_says_how_to_launch(tmp_path):
    out = cli("table1", "--scale", "full", "--runs-dir", tmp_path, check=False)  # its message quotes sys.argv
    assert out.returncode != 0 and "torchrun --nproc_per_node=8 repro.py table1 --scale full" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    small = cli("train", "--scale", "small", "--norm", "post", "--protocol", "grow", "--runs-dir", tmp_path, check=False)
    assert "torchrun --nproc_per_node=1 repro.py train --scale small --norm post --protocol grow" in small.stderr


@pytest.mark.parametrize("args, message", [
    (["tablex"], "unknown experiment 'tablex'"),
    (["--scale", "huge"], "'huge' is not one of"),
    (["--seeds", "42,x"], "not a comma-separated list of integers"),
    (["--seeds", "42,42"], "distinct seeds"),
    (["--seeds", "42,-1"], "seeds must be in 0 .. 2^63 - 1"),
    (["train", "--norm", "post", "--protocol", "grow", "--seed", "-1"], "--seed"),
    (["--results-dir", "/proc/no/such"], "is not a writable folder"),
])
def test_bad_cli_values_give_one_line(args, message):
    out = repro_cli(*args, check=False)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in out.stderr, out.stderr


# ---- the smoke suite, killed once and resumed ----------------------------------------------------

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Runs `repro.py --scale smoke` (every experiment), kills it with SIGKILL after the first runs are
    done, and reruns it to the end. Returns (runs dir, results dir, done-file mtimes before the rerun)."""
    base = tmp_path_factory.mktemp("smoke")
    runs, results = base / "runs", base / "results"
    args = [sys.executable, str(ROOT / "repro.py"), "--scale", "smoke", "--seeds", "42,43", "--runs-dir", str(runs),
            "--results-dir", str(results)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first_done = runs / "smoke" / "s42" / "post-joint" / "done.json"
    deadline = time.time() + 300
    while not first_done.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {p: p.stat().st_mtime_ns for p in runs.glob("smoke/s*/*/done.json")}
    assert not (results / "smoke" / "table1.json").exists()
    rerun = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    return runs / "smoke", results / "smoke", done_before, rerun.stdout


def test_killed_suite_resumes_without_redoing_finished_runs(smoke):
    runs, _, done_before, stdout = smoke
    assert done_before  # the kill came after at least one finished run
    for path, mtime in done_before.items():
        assert path.stat().st_mtime_ns == mtime, f"{path.parent.name} was trained again"
    assert "done, reusing" in stdout or all(p.exists() for p in done_before)
    assert len(list(runs.glob("s*/*/done.json"))) == 2 * len(tables.RUNS)


def finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def test_every_experiment_writes_finite_numbers_and_figures(smoke):
    _, results, _, _ = smoke
    for name, exp in tables.EXPERIMENTS.items():
        report = json.loads((results / f"{name}.json").read_text())
        md = (results / f"{name}.md").read_text()
        assert report["seeds"] == [42, 43] and name in md
        for row in report.get("rows", []):
            if "recovery" not in row["key"]:  # "not recovered" is NaN by definition
                assert finite(row["mean"]) and all(finite(v) for v in row["values"]), (name, row)
            assert row["n"] == 2 and len(row["values"]) == 2
            assert row["label"] in md
        for figure in report.get("figures", {}).values():
            png = Path(figure).read_bytes()
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 15_000, figure
            width, height = struct.unpack(">II", png[16:24])
            assert width > 300 and height > 200
            assert Path(figure).with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
        assert exp.rows or report.get("figures")


def test_every_figure_report_lists_the_plotted_numbers_and_the_papers(smoke):
    _, results, _, _ = smoke
    md = {name: (results / f"{name}.md").read_text() for name in ("fig3", "fig4", "fig5", "figA1", "figA2")}
    data = {name: json.loads((results / f"{name}.json").read_text())["data"] for name in md}
    # What each figure draws, read from its JSON, appears in its Markdown
    for norm in ("pre", "post"):
        for p, ce in enumerate(data["fig3"]["per_phase_ce"][norm]):
            assert f"{ce:.4f}" in md["fig3"], (norm, p)
        std = data["fig4"]["boundary_std"][norm]
        assert f"{std[0]['std'][1]:.4g} → {std[-1]['std'][1]:.4g}" in md["fig4"]
        types = data["fig5"]["token_type_rms_after_block0"][norm]
        assert f"{types[0]['boundary_rms']:.4g} → {types[-1]['boundary_rms']:.4g}" in md["fig5"]
        assert f"{data['figA1']['pearson_kurtosis'][norm]:.5g}" in md["figA1"]
    for run, blocks in data["figA2"]["block_removal"].items():
        assert all(f"{b['delta_ce']:.5g}" in md["figA2"] for b in blocks), run
    # ... beside the paper's
    for name, cited in {"fig3": ["-0.0332", "2.733", "2.9846"], "fig4": ["5.81 → 19.98", "0.07–0.19"],
                        "fig5": ["119 → 425", "7.1 → 11.5", "37.0 (at 150k)"], "figA1": ["> 2400", "2046"],
                        "figA2": ["8.13", "0.499", "4"]}.items():
        for text in cited:
            assert text in md[name], (name, text)


def test_below_full_scale_tables_compare_directions_not_values(smoke):
    _, results, _, _ = smoke
    md = (results / "table1.md").read_text()
    assert "direction vs the paper" in md and "kit − paper" not in md
    row = next(line for line in md.splitlines() if line.startswith("| interaction"))
    assert row.rstrip(" |").endswith(("excludes 0", "includes 0")) and "sign" in row
    report = json.loads((results / "table1.json").read_text())
    assert report["claims"] and all(isinstance(c["agrees"], bool) for c in report["claims"])
    assert ("- agrees: " in md) or ("- DISAGREES: " in md)


def test_compare_passes_an_honest_rerun_and_flags_a_perturbed_one(smoke, tmp_path):
    """references/smoke.json ships the smoke suite's seeds 42 and 43 (repro.py reference): this rerun
    of them is within the band, and a run whose validation loss was raised is not."""
    runs, results, _, _ = smoke
    for target in (runs, results, runs / "s43" / "pre-grow"):
        out = repro_cli("compare", target, "--scale", "smoke")
        assert "numbers within the band" in out.stdout and "NO" not in out.stdout, out.stdout[-2000:]
    perturbed = tmp_path / "post-grow"
    perturbed.mkdir()
    rows = rundir.read_metrics(runs / "s42" / "post-grow")
    (perturbed / "metrics.jsonl").write_text("".join(
        json.dumps({**r, "ce": r["ce"] + 3.0} if r.get("eval") and r["step"] == 16 else r) + "\n" for r in rows))
    out = repro_cli("compare", perturbed, "--scale", "smoke", check=False)
    assert out.returncode == 1 and "post-grow/ce at 16" in out.stdout
    assert len(out.stderr.strip().splitlines()) == 1 and "outside the shipped seeds' band" in out.stderr


def test_numbers_that_are_not_applicable_or_never_reached_on_some_seed():
    """A recovery that never came (inf) or never applied (NaN) on one seed: no spread, every seed shown."""
    s = report.across_seeds([11.0, math.inf, 5.0])
    assert s["mean"] == math.inf and s["ci95"] is None
    assert report.kit_cell(s, 0) == "inf (per seed: 11, inf, 5)"
    assert report.kit_cell(report.across_seeds([math.nan, 3.0]), 0) == "n/a (per seed: n/a, 3)"


def test_comparison_with_the_paper_by_scale():
    stats = lambda mean, lo, hi: {"mean": mean, "std": 0.1, "ci95": [lo, hi], "n": 3}
    delta = report.Row("delta grow", "delta_grow", -0.0328, sign=True)
    assert report.comparison(delta, stats(-0.05, -0.08, -0.02), full=True) == "-0.0172"
    assert report.comparison(delta, stats(-0.05, -0.08, -0.02), full=False) == "same sign, interval excludes 0"
    assert report.comparison(delta, stats(0.01, -0.02, 0.04), full=False) == "OPPOSITE sign, interval includes 0"
    tokens = report.Row("tokens", "t", 3.11e9, report.TOKENS, compare=False)
    assert report.comparison(tokens, stats(1e6, 1e6, 1e6), full=True) == ""  # other units: no difference
    level = report.Row("pre-norm, grow", "pre_grow", 2.7658)
    assert report.comparison(level, stats(3.2, 3.1, 3.3), full=False) == ""  # an absolute value below full


def test_multi_seed_table1_has_intervals(smoke):
    _, results, _, _ = smoke
    rows = {r["key"]: r for r in json.loads((results / "table1.json").read_text())["rows"]}
    inter = rows["interaction"]
    lo, hi = inter["ci95"]
    assert lo < inter["mean"] < hi and inter["std"] > 0
    # The interval is the t interval of the two per-seed values.
    assert hi - inter["mean"] == pytest.approx(12.7062 * inter["std"] / math.sqrt(2), rel=1e-5)
    # Each seed's interaction follows from its own four CEs.
    for i in range(2):
        ce = {k: rows[k]["values"][i] for k in ("pre_joint", "pre_grow", "post_joint", "post_grow")}
        assert inter["values"][i] == pytest.approx((ce["post_grow"] - ce["pre_grow"]) - (ce["post_joint"] - ce["pre_joint"]))
    assert "± " in (results / "table1.md").read_text()
    # Which code and which settings made the numbers.
    report = json.loads((results / "table1.json").read_text())
    runs = results.parent.parent / "runs" / "smoke"
    import hashlib
    expected = hashlib.sha256(b"".join((runs / f"s{seed}" / name / "config.json").read_bytes()
                                       for seed in (42, 43) for name in tables.MAIN_RUNS)).hexdigest()
    assert report["runs_config_sha256"] == expected and len(report["git_commit"].split("+")[0]) == 40


def test_table_a2_counts_tokens_from_batches(smoke):
    _, results, _, _ = smoke
    rows = {r["key"]: r["mean"] for r in json.loads((results / "tableA2.json").read_text())["rows"]}
    assert rows["grow_over_joint_total"] == pytest.approx(3.0)  # grow replays the one-phase shard 3 times
    assert rows["post-grow_unique"] == rows["post-joint_unique"] == rows["post-joint_total"]
    assert rows["post-joint-longer_unique"] == rows["post-joint-longer_total"]  # fresh data never repeats


def test_shared_prefix_is_bit_identical_to_running_it_again(smoke, tmp_path):
    runs, _, _, _ = smoke
    for name in ("post-freeze", "post-joint-long"):
        shared = runs / "s42" / name
        settings = config.read(shared)
        assert settings.start_from
        alone = grow.train(replace(settings, start_from=""), tmp_path / name)  # computes its first phase itself
        assert alone == json.loads((shared / "done.json").read_text())
        last = f"phase-{len(config.plan_phases(settings)) - 1}"
        a, b = load_file(shared / last / "model.safetensors"), load_file(tmp_path / name / last / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_train_command_writes_a_run_directory(smoke):
    runs, _, _, _ = smoke
    out = repro_cli("train", "--scale", "smoke", "--norm", "post", "--protocol", "grow", "--runs-dir", runs.parent)
    run = runs / "s42" / "post-grow"
    assert "validation CE" in out.stdout
    for item in ("config.json", "metrics.jsonl", "provenance.json", "done.json", "phase-0", "phase-1", "phase-2"):
        assert (run / item).exists(), item
    assert json.loads((run / "done.json").read_text())["step"] == 3 * presets.PRESETS["smoke"].run["phase_steps"]


def test_eval_and_data_commands(smoke):
    runs, _, _, _ = smoke
    out = repro_cli("eval", runs / "s42" / "post-grow" / "phase-2", "--scale", "smoke", "--runs-dir", runs.parent, "--json")
    result = json.loads(out.stdout)
    done = json.loads((runs / "s42" / "post-grow" / "done.json").read_text())
    assert result["ce"] == pytest.approx(done["ce"], rel=1e-6) and result["ppl"] == pytest.approx(math.exp(result["ce"]))
    teacher = json.loads(repro_cli("eval", runs / "teacher" / "phase-0", "--scale", "smoke", "--runs-dir", runs.parent,
                             "--json").stdout)
    assert teacher["ce"] == pytest.approx(json.loads((runs / "teacher" / "done.json").read_text())["ce"], rel=1e-6)
    # Without --scale, the scale comes from the checkpoint's vocabulary.
    inferred = json.loads(repro_cli("eval", runs / "s42" / "post-grow" / "phase-2", "--runs-dir", runs.parent,
                                    "--json").stdout)
    assert inferred["ce"] == result["ce"] and inferred["data"].endswith("smoke/data/val")
    summary = repro_cli("data", "--scale", "smoke", "--runs-dir", runs.parent).stdout
    assert "boundary_tokens" in summary and "validation" in summary


def test_edited_preset_is_refused_then_forced_without_redoing_what_matches(tmp_path):
    preset = presets.PRESETS["smoke"]
    original = suite.Workspace(preset, tmp_path / "smoke", tmp_path / "results", devices.Dist())
    post_joint = suite.RunName("post", "joint")
    suite.ensure_runs(original, [post_joint], [42])
    edited = replace(preset, run={**preset.run, "lr": preset.run["lr"] / 2})
    ws = suite.Workspace(edited, tmp_path / "smoke", tmp_path / "results", devices.Dist())
    tokens = ws.data_dir / "train" / "tokens.u32"
    teacher_done = ws.teacher_dir / "done.json"
    stamps = (tokens.stat().st_mtime_ns, teacher_done.stat().st_mtime_ns)
    with pytest.raises(errors.TrainingError, match="another config .*differs in lr.*--force"):
        suite.ensure_runs(ws, [post_joint], [42])
    suite.ensure_runs(ws, [post_joint], [42], force=True)
    config = json.loads((ws.run_dir(post_joint, 42) / "config.json").read_text())
    assert config["lr"] == preset.run["lr"] / 2 and (ws.run_dir(post_joint, 42) / "done.json").is_file()
    # The shards and the teacher matched the edited preset: reused, not redone.
    assert (tokens.stat().st_mtime_ns, teacher_done.stat().st_mtime_ns) == stamps


# ---- the toy as a faithful miniature (the regime map, step-0 evaluations, the ratios) -----------

@pytest.mark.parametrize("scale", ["toy", "mini"])
def test_miniature_presets_keep_the_papers_ratios(scale):
    rows = {k: (paper, toy) for k, paper, toy in presets.regime_ratios(presets.PRESETS[scale])}
    assert rows["teacher's head tied to its embedding"] == (False, False)
    assert rows["init std x sqrt(width)"][1] == pytest.approx(rows["init std x sqrt(width)"][0])
    assert rows["S / T"][1] <= 1 / 3 and rows["S / T"][0] == 0.25
    assert rows["warmup / AdamW horizon 1/(1 - beta2)"][1] >= 1          # warmup >= 1/(1 - beta2) steps
    for same in ("alpha (KD weight)", "gamma (CE weight)", "tau", "gradient clip", "AdamW beta2", "min LR / peak LR"):
        assert rows[same][0] == pytest.approx(rows[same][1]), same
    toy = presets.PRESETS[scale].run
    assert rows["LR x steps per phase"][1] == pytest.approx(toy["lr"] * toy["phase_steps"])
    assert rows["warmup steps"][1] == round(toy["warmup_frac"] * toy["phase_steps"])
    # The README's table is the command's output, so every value it shows is the preset's.
    readme = (ROOT / "README.md").read_text()
    assert "\n".join(presets.ratios_markdown(presets.PRESETS[scale])) in readme


def test_mini_is_the_last_rung_the_search_ran_and_shares_the_toys_teacher():
    """As pre-registered: no rung met the criterion, so mini is the toy with the overrides of the rungs run
    (0-2); its teacher's settings are the toy's, so the shipped teacher serves both."""
    toy = presets.PRESETS["toy"]
    mini, _ = presets.apply_overrides(toy, presets.parse_overrides(toy, [o for rung in presets.LADDERS["toy"][:3]
                                                                         for o in rung.overrides]))
    assert presets.PRESETS["mini"].run == mini.run and presets.PRESETS["mini"].data == mini.data
    toy_teacher = {**presets.PRESETS["toy"].run, **presets.PRESETS["toy"].teacher_run}
    mini_teacher = {**presets.PRESETS["mini"].run, **presets.PRESETS["mini"].teacher_run}
    assert toy_teacher == mini_teacher and presets.PRESETS["mini"].shipped_teacher == "teachers/toy"


def test_the_shipped_teacher_is_installed_checked_and_a_damaged_one_refused(tmp_path, monkeypatch):
    """A first toy run installs the shipped teacher (its config is the one the toy would train, so it is
    reused as done, checksums verified); a flipped byte in it is a one-line error naming the file."""
    ws = suite.Workspace(presets.PRESETS["toy"], tmp_path / "runs" / "toy", tmp_path / "results", devices.Dist())
    suite.prepare_data(ws)  # the teacher's config records its shard (and its size)
    shipped = ROOT / "teachers" / "toy"
    assert suite.install_shipped_teacher(ws)
    assert rundir.final_eval(ws.teacher_dir)["ce"] == pytest.approx(3.0496, abs=1e-4)
    installed = ws.teacher_dir
    weights = "phase-0/model.safetensors"
    assert (installed / weights).read_bytes() == (shipped / weights).read_bytes()
    assert not suite.install_shipped_teacher(ws)  # there already: left as it is
    copy = tmp_path / "repo"
    shutil.copytree(shipped, copy / "teachers" / "toy")
    weights = copy / "teachers" / "toy" / "phase-0" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-16] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(suite, "SHIPPED_ROOT", copy)
    shutil.rmtree(installed)
    with pytest.raises(errors.CheckpointError, match="shipped teacher is damaged .*model.safetensors does not match"):
        suite.install_shipped_teacher(ws)
    assert not installed.exists()


def test_step0_evaluations_equal_an_independent_evaluation(smoke):
    """Every phase of a smoke grow run logs the CE of its starting weights before its first update;
    recomputed here from full logits over the validation documents, one at a time."""
    import data
    import model
    runs, _, _, _ = smoke
    run = runs / "s42" / "post-grow"
    settings = config.read(run)
    starts = {r["phase"]: r for r in rundir.read_metrics(run) if r.get("phase_start")}
    assert sorted(starts) == [0, 1, 2] and [starts[p]["step"] for p in range(3)] == [0, 8, 16]
    val = data.Shard(settings.val_data)
    teacher = model.load_qwen3(settings.teacher)

    def ce_of(student, active_blocks):
        total, count = 0.0, 0
        for i in range(len(val)):
            doc = torch.from_numpy(val.document(i).astype("int64"))
            with torch.no_grad():
                logits = student(doc[None, :-1], active_blocks=active_blocks)[0].double()
            total += torch.nn.functional.cross_entropy(logits, doc[1:], reduction="sum").item()
            count += len(doc) - 1
        return total / count

    fresh = model.Student.from_teacher(teacher, settings.blocks, settings.layers_per_block, "post", settings.seed)
    assert starts[0]["ce"] == pytest.approx(ce_of(fresh, 1), rel=1e-5)
    for p in (1, 2):  # phase p starts from phase p-1's end, with block p as built
        previous = model.Student.load(run / f"phase-{p - 1}")
        assert starts[p]["ce"] == pytest.approx(ce_of(previous, p + 1), rel=1e-5)
        assert starts[p]["ce"] != pytest.approx(starts[p - 1]["ce"])
    table2 = {r["key"]: r for r in json.loads((smoke[1] / "table2.json").read_text())["rows"]}
    assert table2["post_ce_step0"]["values"][0] == starts[0]["ce"]


def test_search_climbs_the_ladder_on_pre_norm_grow_and_reports_the_criterion(smoke):
    """The smoke ladder: rung 0 reuses the suite's pre-grow, rung 1 (more steps than the scale's shard
    holds) gets its own data and teacher; every rung's numbers are diag's on its last checkpoint, and
    no post-norm run is made."""
    from experiments import regime
    runs, _, _, _ = smoke
    results = runs.parent.parent / "search-results"
    repro_cli("search", "--scale", "smoke", "--runs-dir", runs.parent, "--results-dir", results)
    report = json.loads((results / "smoke" / "search.json").read_text())
    assert [r["name"] for r in report["rungs"]] == ["smoke", "tokens-x2"]
    assert report["rungs"][1]["overrides"] == ["run.phase_steps=16"] and report["rungs"][1]["new_teacher"]
    assert report["decision"] == "the ladder ran out without meeting the criterion"
    rung1 = runs.parent / "smoke+run.phase_steps=16"
    assert report["rungs"][0]["folder"] == str(runs / "s42" / "pre-grow")
    assert report["rungs"][1]["folder"] == str(rung1 / "s42" / "pre-grow") and (rung1 / "teacher" / "done.json").is_file()
    assert not [p for p in rung1.glob("s42/*") if p.name != "pre-grow"]
    batch = data.diagnostic_batch(data.Shard(rung1 / "data" / "val"), 4, 16, 42)
    found = diag.diagnose_checkpoint(model.Student.load(rung1 / "s42" / "pre-grow" / "phase-2"), batch,
                                     tokenizer.qwen3_tokenizer(512).decode)
    criterion = regime.mechanism(found)
    got = report["rungs"][1]["criterion"]
    assert got["passes"] == criterion["passes"] and not got["present"] and not criterion["present"]
    for key in presets.MECHANISM:  # the same batch and weights in another process
        assert got[key] == pytest.approx(criterion[key], rel=1e-9)
    assert criterion["massive_ratio"] == found["boundary_stats"][1]["massive_ratio"] > 1
    assert "| 1 tokens-x2 |" in (results / "smoke" / "search.md").read_text()


def test_regime_map_reports_the_runs_own_results(smoke):
    runs, _, _, _ = smoke
    results = runs.parent.parent / "regime-results"
    repro_cli("regime", "--scale", "smoke", "--seeds", "42", "--grid", "budget=0.5,1;gain=ones,teacher",
        "--runs-dir", runs.parent, "--results-dir", results)
    report = json.loads((results / "smoke" / "regime.json").read_text())
    points = {p["point"]: p for p in report["points"]}
    assert set(points) == {"budget0.5-lr1-gain-ones", "budget1-lr1-gain-ones", "budget1-lr1-gain-teacher"}
    assert (results / "smoke" / "regime.png").is_file() and "| budget0.5-lr1-gain-ones | 4 |" in \
        (results / "smoke" / "regime.md").read_text()
    for name, point in points.items():
        folder = runs / "s42" if name == "budget1-lr1-gain-ones" else runs / "regime" / name / "s42"
        # The gain option touches only the post-norm runs: the pre-norm ones are the preset's own.
        pre_folder = folder if "budget0.5" in name else runs / "s42"
        ce = {run: json.loads(((pre_folder if run.startswith("pre") else folder) / run / "done.json").read_text())["ce"]
              for run in tables.MAIN_RUNS}
        assert point["delta_joint"]["values"] == [ce["post-joint"] - ce["pre-joint"]]
        assert point["delta_grow"]["values"] == [ce["post-grow"] - ce["pre-grow"]]
        assert point["interaction"]["mean"] == pytest.approx(
            (ce["post-grow"] - ce["pre-grow"]) - (ce["post-joint"] - ce["pre-joint"]))
        config = json.loads((folder / "post-grow" / "config.json").read_text())
        assert config["phase_steps"] == (4 if "budget0.5" in name else 8)
        assert config["post_output_gain"] == ("teacher" if "teacher" in name else "ones")
        # the boundary after block 0 at the end of each grow run: its last monitor row, read back here
        for run, run_folder in (("pre-grow", pre_folder), ("post-grow", folder)):
            last = [r for r in rundir.read_metrics(run_folder / run) if r.get("monitor")][-1]["boundaries"][1]
            assert point[f"{run.replace('-', '_')}_kurtosis"]["values"] == [last["kurtosis"]]
    assert not (runs / "regime" / "budget1-lr1-gain-teacher" / "s42" / "pre-grow").exists()
    # ten distinct runs: the preset's four, budget 0.5's four, the teacher-gain point's two post-norm ones
    assert report["diverged_runs"] == [] and "Diverged: none of 10 runs." in (results / "smoke" / "regime.md").read_text()


@pytest.mark.parametrize("grid, message", [("depth=1,2", "AXIS one of budget, lr, gain"),
                                           ("budget=x", "must be numbers"), ("gain=twos", "gain 'twos' is unknown"),
                                           ("lr=0", "in (0, 100]")])
def test_bad_regime_grid_gives_one_line(grid, message, tmp_path):
    out = repro_cli("regime", "--scale", "smoke", "--grid", grid, "--runs-dir", tmp_path, check=False)
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "smoke").exists()


def test_t_quantile_is_exact_for_any_number_of_seeds():
    # Published two-sided 95% critical values of Student's t.
    known = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 9: 2.2622, 31: 2.0395, 45: 2.0141, 120: 1.9799}
    for df, value in known.items():
        assert report.t975(df) == pytest.approx(value, abs=1e-4), df
    s = report.across_seeds([1.0, 2.0, 4.0])
    half = 4.30265 * statistics.stdev([1.0, 2.0, 4.0]) / math.sqrt(3)
    assert s["ci95"] == pytest.approx([7 / 3 - half, 7 / 3 + half], abs=1e-4)
    # One-sided 95% critical values (a 90% two-sided interval, for TOST), and the CDF back.
    for df, value in {1: 6.3138, 2: 2.9200, 4: 2.1318, 10: 1.8125}.items():
        t = report.t_quantile(df, 0.95)
        assert t == pytest.approx(value, abs=1e-4), df
        assert report.t_cdf(df, t) == pytest.approx(0.95, abs=1e-6) and report.t_cdf(df, -t) == pytest.approx(0.05, abs=1e-6)


def test_readings_by_the_pre_declared_rule_and_holms_correction():
    """Below 0 by a 95% interval; a tie when the 90% interval lies inside +-0.01 (TOST); else inconclusive;
    a diverged seed or a single seed is no reading. Holm's adjustment by hand."""
    read = lambda values: report.reading(report.across_seeds(values), 0.01)
    assert read([-0.030, -0.031, -0.029]) == "below 0"
    assert read([0.030, 0.031, 0.029]) == "above 0"
    # mean 0, sd 0.005, n 3: 95% half-width 0.0124 (includes 0), 90% half-width 2.92 x 0.005 / sqrt(3) = 0.0084
    assert read([-0.005, 0.0, 0.005]) == "a tie within ±0.01"
    assert read([-0.02, 0.0, 0.02]) == "inconclusive"  # 90% half-width 0.034
    assert read([-0.02, report.DIVERGED, 0.01]).startswith("no reading: 1 of 3 diverged")
    assert read([0.001]) == "no reading: one seed"
    assert report.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert report.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    # The one-sample t-test: mean 1, sd 1, n 4 -> t = 2, df 3 -> two-sided p = 0.1393
    assert report.p_two_sided(report.across_seeds([0.0, 1.0, 1.0, 2.0]) | {"std": 1.0}) == pytest.approx(0.1393, abs=1e-4)
    # In a family the sign needs the adjusted p: an interval that excludes 0 alone is not enough
    clear = report.across_seeds([-0.030, -0.031, -0.029])
    assert report.adjusted_reading(clear, 0.049, 0.01) == "below 0"
    assert report.adjusted_reading(clear, 0.06, 0.01) == "inconclusive"  # 90% interval [-0.032, -0.028]: no tie
    small = report.across_seeds([-0.004, -0.005, -0.006])  # excludes 0 by its interval, and inside +-0.01
    assert report.reading(small, 0.01) == "below 0" and report.adjusted_reading(small, 0.2, 0.01) == "a tie within ±0.01"
    assert report.adjusted_reading(report.across_seeds([-0.02, report.DIVERGED, 0.01]), 0.01, 0.01).startswith("no reading")


# ---- overrides ---------------------------------------------------------------------------------

def test_overrides_are_recorded_and_never_reuse_a_run_with_other_settings(smoke):
    runs, _, _, _ = smoke
    own = runs / "s42" / "post-joint"
    stamp = (own / "done.json").stat().st_mtime_ns
    out = repro_cli("train", "--scale", "smoke", "--norm", "post", "--protocol", "joint", "--set", "run.lr=0.006",
              "--set", "run.post_output_gain=teacher", "--runs-dir", runs.parent)
    changed = runs / "set" / "run.lr=0.006,run.post_output_gain=teacher" / "s42" / "post-joint"
    assert str(changed) in out.stdout.replace("\n", "")
    config = json.loads((changed / "config.json").read_text())
    assert config["lr"] == 0.006 and config["post_output_gain"] == "teacher"
    assert json.loads((changed / "done.json").read_text())["ce"] != json.loads((own / "done.json").read_text())["ce"]
    assert (own / "done.json").stat().st_mtime_ns == stamp  # the preset's run is neither reused nor touched
    # The data and the teacher are the scale's own: only the students moved.
    assert not (runs / "set" / "run.lr=0.006,run.post_output_gain=teacher" / "teacher").exists()


def test_override_values_are_typed():
    preset = presets.PRESETS["smoke"]
    overrides = presets.parse_overrides(preset, ["run.lr=3e-4", "data.max_len=16", "run.betas=0.9,0.99",
                                                 "teacher_model.tie_word_embeddings=false", "run.seed=7", "run.seed=8"])
    assert overrides[0] == presets.Override("run", "lr", 3e-4) and presets.set_value(overrides, "run", "seed") == 8
    new, changes = presets.apply_overrides(preset, overrides[:4], compile_flag=True)
    assert new.run["lr"] == 3e-4 and new.data["max_len"] == 16 and new.run["betas"] == (0.9, 0.99)
    assert new.teacher_model["tie_word_embeddings"] is False and new.run["compile"] is True
    assert preset.run["lr"] == 3e-3  # the preset itself is unchanged
    assert presets.override_name(changes) == ("data.max_len=16,run.betas=(0.9,0.99),run.compile=True,run.lr=0.0003,"
                                            "teacher_model.tie_word_embeddings=False")


@pytest.mark.parametrize("item, message", [
    ("run.lr=abc", "--set: run.lr=abc: expected a number"), ("run.phase_steps=2.5", "expected an integer"),
    ("run.nope=1", "run.nope: unknown key"), ("lr=1", "write SECTION.KEY=VALUE"), ("run.lr", "write SECTION.KEY"),
    ("run.lr=-1", "expected a finite number >= 0"), ("run.compile=maybe", "expected true or false"),
])
def test_bad_overrides_give_one_line_before_any_folder(item, message, tmp_path):
    out = repro_cli("train", "--scale", "smoke", "--norm", "post", "--protocol", "joint", "--set", item,
              "--runs-dir", tmp_path / "runs", check=False)
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_missing_device_is_one_line_before_any_folder(tmp_path):
    out = repro_cli("train", "--scale", "smoke", "--norm", "post", "--protocol", "joint", "--device", "cuda",
              "--runs-dir", tmp_path / "runs", check=False)
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1 and "--device cuda" in lines[0], out.stderr
    assert not (tmp_path / "runs").exists()


def test_checkpoint_and_shard_vocabularies_must_match():
    from types import SimpleNamespace

    shard = lambda eot: SimpleNamespace(eot=eot, path=Path("val"))
    checkpoints.check_vocabulary(shard(512), 513, Path("ck"))          # smoke on smoke
    checkpoints.check_vocabulary(shard(151643), 151936, Path("ck"))    # Qwen3's own vocabulary
    for eot, vocab in ((4096, 513), (512, 4097), (151643, 4097)):  # smoke on toy, toy on smoke, toy on FineWeb
        with pytest.raises(errors.DataError, match="ck: its vocabulary .* is not the one val was tokenized with"):
            checkpoints.check_vocabulary(shard(eot), vocab, Path("ck"))


def test_a_moved_runs_tree_is_reused_not_retrained(smoke, tmp_path, monkeypatch):
    """Configs store paths relative to their run folder: a finished tree copied elsewhere and used from
    another working directory reuses every run (nothing retrained, every done.json untouched) and its
    tables come out the same; `python grow.py RUN/config.json` resumes a partial run in place."""
    runs, results, _, _ = smoke
    config = json.loads((runs / "s42" / "post-grow" / "config.json").read_text())
    assert config["relative_to_run"] and config["train_data"] == "../../data/train"
    assert config["teacher"] == "../../teacher/phase-0"
    moved = tmp_path / "elsewhere" / "b"
    shutil.copytree(runs.parent, moved / "runs", symlinks=True)
    done = {p: p.stat().st_mtime_ns for p in moved.glob("runs/smoke/s42/*/done.json")}
    monkeypatch.chdir(moved.parent)
    again = repro_cli("table1", "--scale", "smoke", "--runs-dir", "b/runs", "--results-dir", "b/results")
    assert "done, reusing" in again.stdout and "phase 0 starts" not in again.stdout
    assert done == {p: p.stat().st_mtime_ns for p in moved.glob("runs/smoke/s42/*/done.json")}
    rows = [json.loads((r / "table1.json").read_text())["rows"] for r in (results, moved / "results" / "smoke")]
    assert [r["values"][0] for r in rows[0]] == [r["values"][0] for r in rows[1]]  # seed 42 of the two
    run = moved / "runs" / "smoke" / "s42" / "pre-grow"
    (run / "done.json").unlink()
    resumed = subprocess.run([sys.executable, str(ROOT / "grow.py"), str(run / "config.json")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run / "done.json").read_text())["ce"] == rows[0][1]["values"][0]  # pre_grow, seed 42


@pytest.mark.slow
def test_two_different_runs_sharing_one_preparation_end_as_sequential_runs(smoke, tmp_path):
    """pre-grow and post-joint started together on an empty runs folder: one prepares the data and trains
    the teacher while the other waits for each (locks.held); both end with the results of the smoke
    suite's (lockstep, which equals runs made one after the other), the teacher trained once."""
    def train(runs, norm, protocol):
        return subprocess.Popen([sys.executable, str(ROOT / "repro.py"), "train", "--scale", "smoke", "--norm", norm,
                                 "--protocol", protocol, "--runs-dir", str(runs)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    jobs = (("pre", "grow"), ("post", "joint"))
    together = [train(tmp_path / "together", norm, protocol) for norm, protocol in jobs]
    outputs = [p.communicate()[0] for p in together]
    assert [p.returncode for p in together] == [0, 0], outputs
    assert sum("waiting for it to finish" in out for out in outputs) >= 1, outputs  # one did wait
    for name in ("teacher", "s42/pre-grow", "s42/post-joint"):
        a, b = smoke[0] / name, tmp_path / "together" / "smoke" / name
        assert json.loads((a / "done.json").read_text()) == json.loads((b / "done.json").read_text()), name
        final = "phase-0" if name != "s42/pre-grow" else "phase-2"
        wa, wb = load_file(a / final / "model.safetensors"), load_file(b / final / "model.safetensors")
        assert all(torch.equal(wa[k], wb[k]) for k in wa), name
    teacher_rows = [r for r in rundir.read_metrics(tmp_path / "together" / "smoke" / "teacher") if "loss" in r]
    assert [r["step"] for r in teacher_rows] == list(range(1, len(teacher_rows) + 1))  # trained once, complete


def test_long_override_names_are_cut_and_end_in_a_hash_of_the_whole():
    changes = {"run": {"phase_lrs": tuple([3e-3] * 40)}, "data": {"path": "/a" * 200}}
    name = presets.override_name(changes)
    other = presets.override_name({**changes, "data": {"path": "/b" * 200}})
    assert len(name.encode()) == presets.OVERRIDE_NAME_BYTES and name != other and "~" in name
    assert presets.override_name({"run": {"lr": 0.0003}}) == "run.lr=0.0003"  # short ones unchanged


@pytest.mark.slow
def test_sigterm_ends_a_run_as_ctrl_c_does_and_the_rerun_resumes(smoke, tmp_path):
    """A scheduler's SIGTERM mid-run: one line saying a rerun resumes, exit 130; the rerun finishes the run."""
    for shared in ("data", "teacher"):  # the smoke suite's: only the student trains here
        shutil.copytree(smoke[0] / shared, tmp_path / "runs" / "smoke" / shared)
    args = [sys.executable, str(ROOT / "repro.py"), "train", "--scale", "smoke", "--norm", "post", "--protocol", "grow",
            "--runs-dir", str(tmp_path / "runs")]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "runs" / "smoke" / "s42" / "post-grow"
    deadline = time.time() + 300
    while not any(r.get("step", 0) >= 2 and "loss" in r for r in rundir.read_metrics(run_dir)):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("Error: interrupted; rerun the same command to resume"), err[-2000:]
    assert not (run_dir / "done.json").exists()
    again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and (run_dir / "done.json").is_file(), again.stderr[-2000:]


def test_the_regime_maps_reversal_needs_no_diverged_run():
    """A point whose post-joint diverged on one seed (its delta joint a large penalty on the others) is no
    reversal; the same numbers with no diverged run are."""
    from experiments import regime
    def row(joint):
        s = lambda values: report.across_seeds(values)
        boundary = {f"{p}_grow_{k}": s([math.nan, math.nan]) for p in ("pre", "post") for k in regime.BOUNDARY_NUMBERS}
        return {"point": "p", "phase_steps": 250, "lr": 3e-3, "lr_x_steps": 0.75, "gain": "ones",
                "delta_joint": s(joint), "delta_grow": s([-0.03, -0.02]), "interaction": s([-2.0, -0.05]), **boundary}
    cited = {"delta_joint": 0.0004, "delta_grow": -0.0328, "interaction": -0.0332}
    failed = regime.markdown([row([2.2, report.DIVERGED])], cited, "toy", [42, 43], "Diverged: 1 of 8 runs")
    clean = regime.markdown([row([2.2, 0.01])], cited, "toy", [42, 43], "Diverged: none of 8 runs.")
    first_row = lambda lines: next(line for line in lines if line.startswith("| p | 250 |"))
    assert first_row(failed).endswith("| no: runs diverged |") and first_row(clean).endswith("| yes |")
    assert "Diverged: 1 of 8 runs" in failed and "| p | n/a | n/a | n/a | n/a | n/a | n/a |" in clean


def test_the_regime_maps_boundary_is_the_last_monitor_row_after_block_0(tmp_path):
    """end_boundary reads block 0's output (boundary 1) in the last monitor row; a run without the
    monitor gives n/a (NaN) and a diverged one DIVERGED, never its numbers."""
    import types

    from experiments import regime
    def plant(name, done, rows):
        run = tmp_path / name
        run.mkdir()
        (run / "done.json").write_text(json.dumps(done))
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    after = lambda k: {"mean": 1.0, "kurtosis": k, "boundary_over_others": k / 10, "massive_ratio": k * 2}
    rows = [{"step": 25, "monitor": True, "boundaries": [after(0.0)]},
            {"step": 275, "monitor": True, "boundaries": [after(0.0), after(7.0)]},
            {"step": 300, "eval": True, "ce": 3.0},
            {"step": 500, "monitor": True, "boundaries": [after(0.0), after(9.0), after(1.0)]}]
    done = {"ce": 3.2, "ppl": 24.5, "kd": 3.3, "step": 750}
    rows.append({**done, "eval": True})  # done.json repeats the run's last evaluation (rundir.final_eval checks)
    watched, unwatched, failed = (suite.RunName(norm, "grow") for norm in ("watched", "unwatched", "failed"))
    plant(watched.name, done, rows)
    plant(unwatched.name, done, [{"step": 300, "eval": True, "ce": 3.0}, {**done, "eval": True}])
    plant(failed.name, {**{k: None for k in done}, "step": 500, "diverged": {"step": 500, "why": "non-finite"}}, rows)
    ws = types.SimpleNamespace(run_dir=lambda run, seed: tmp_path / run.name)
    assert regime.end_boundary(ws, watched, 42) == {"kurtosis": 9.0, "boundary_over_others": 0.9, "massive_ratio": 18.0}
    assert all(math.isnan(v) for v in regime.end_boundary(ws, unwatched, 42).values())
    assert all(isinstance(v, report.Diverged) for v in regime.end_boundary(ws, failed, 42).values())


def test_the_same_shard_joint_control_reads_grows_batches_for_grows_steps(smoke):
    """joint-replay: all K blocks from step 0, one phase per block with grow's LR restarts, and at every
    step exactly the documents grow reads (the same shard, the same order); joint-long reads fresh ones."""
    ws = suite.Workspace(presets.PRESETS["smoke"], smoke[0], Path("results"), devices.Dist())
    shard = data.Shard(ws.data_dir / "train", verify=False)
    runs = {"pre-grow": tables.PRE_GROW, "pre-joint-replay": suite.RunName("pre", "joint-replay"),
            "post-joint-long": suite.RunName("post", "joint-long")}
    configs = {name: suite.run_config(ws, run, 42) for name, run in runs.items()}
    replay, grow_ = configs["pre-joint-replay"], configs["pre-grow"]
    assert replay.protocol == "joint-long" and replay.joint_phases == 3 and replay.data_mode == "replay"
    assert [p.active_blocks for p in config.plan_phases(replay)] == [3, 3, 3]
    assert [(p.first_step, p.steps) for p in config.plan_phases(replay)] == \
        [(p.first_step, p.steps) for p in config.plan_phases(grow_)]
    batchers = {n: data.Batcher(shard, c.global_batch, c.seed, c.data_mode, c.replay_docs) for n, c in configs.items()}
    steps = range(3 * grow_.phase_steps)
    ids = {n: [b.global_doc_ids(s).tolist() for s in steps] for n, b in batchers.items()}
    assert ids["pre-joint-replay"] == ids["pre-grow"]
    assert ids["post-joint-long"][grow_.phase_steps:] != ids["pre-grow"][grow_.phase_steps:]  # fresh data
    assert suite.prefix_run(runs["pre-joint-replay"], ws) == (suite.RunName("pre", "joint"), 0)


def test_references_hold_the_numbers_of_every_experiment_beyond_the_paper_too():
    """A placements-, intervention- or regime-shaped report gives every quantity over seeds a name, so
    `reference` ships it and `compare` checks it, as it does a paper table's rows."""
    from experiments import reference
    stats = lambda *v: report.across_seeds(list(v))
    content = {"rows": [{"placement": "peri", "joint": stats(3.39, 3.38), "delta_grow": stats(0.007, 0.006),
                         "settings": {"boundary": "none"}},
                        {"variant": "pre-grow + boundary-norm", "ce": stats(3.25, 3.26)},
                        {"label": "pre-norm, joint", "key": "pre_joint", "values": [3.46, 3.47]}],
               "points": [{"point": "budget=2", "interaction": stats(-0.1, -0.2), "lr": 3e-3}]}
    assert reference.report_numbers(content) == {
        "peri: joint": [3.39, 3.38], "peri: delta_grow": [0.007, 0.006], "pre-grow + boundary-norm: ce": [3.25, 3.26],
        "pre_joint": [3.46, 3.47], "budget=2: interaction": [-0.1, -0.2]}


def test_a_run_is_named_by_its_fields_and_its_folder_is_the_name_the_kit_always_gave_it():
    """A placement may hold a '-' (hybrid-star) or be a schedule (post,pre,pre): the run keeps its fields,
    and its folder (and report key) is <norm>-<protocol>; the runs whose phases it shares come first; the
    CLI's protocols and experiments are the lists that define them."""
    for norm, protocol, name in (("hybrid-star", "grow", "hybrid-star-grow"), ("pre", "joint-longer", "pre-joint-longer"),
                                 ("post,pre,pre", "freeze", "post,pre,pre-freeze"),
                                 ("hybrid-first", "joint-replay", "hybrid-first-joint-replay")):
        assert suite.RunName(norm, protocol).name == name
    star = lambda protocol: suite.RunName("hybrid-star", protocol)
    assert suite.with_prefixes([star("joint-longer"), star("freeze"), star("joint-replay")]) == \
        [star("joint"), star("joint-long"), star("joint-longer"), star("grow"), star("freeze"), star("joint-replay")]
    assert [r.name for r in tables.RUNS] == [
        "pre-joint", "post-joint", "pre-grow", "post-grow", "pre-freeze", "post-freeze", "pre-joint-long",
        "pre-joint-longer", "post-joint-long", "post-joint-longer", "pre-joint-replay", "post-joint-replay"]
    with pytest.raises(ValueError, match="not one of joint, grow"):
        suite.RunName("pre", "scratch")
    protocols = next(p for p in repro.cli.commands["train"].params if p.name == "protocol").type.choices
    assert tuple(protocols) == suite.RUN_PROTOCOLS
    assert f"Experiments: {' '.join(tables.EXPERIMENTS)}, or all" in repro_cli("--help").stdout


def test_boundary_numbers_read_block0_at_the_first_and_last_snapshot(monkeypatch):
    """The figures' mechanism over seeds: block 0's boundary (index 1; index 0 is the embedding) at the
    first and the last grow snapshot, planted values that differ everywhere else."""
    def snapshot(std, kurtosis, ratio):
        stats = lambda v: {"std": v, "kurtosis": v + 100, "kurtosis_distinct": v + 200}
        return {"boundary_stats": [stats(-1.0), {"std": std, "kurtosis": kurtosis, "kurtosis_distinct": kurtosis / 2},
                                   stats(-2.0)],
                "token_type_rms": [{"boundary_over_regular": -3.0}, {"boundary_over_regular": ratio}]}
    planted = {"pre": [snapshot(2.0, 9.0, 1.5), snapshot(3.0, 7.0, 1.2), snapshot(5.0, 60.0, 37.0)],
               "post": [snapshot(0.1, 3.0, 1.0), snapshot(0.2, 1.8, 0.98)]}
    monkeypatch.setattr(tables, "boundary_series", lambda ws, seed: planted)
    assert tables.boundary_numbers(None, 42) == {
        "pre_std_first": 2.0, "pre_std_end": 5.0, "pre_boundary_over_regular": 37.0, "pre_kurtosis": 60.0,
        "pre_kurtosis_distinct": 30.0, "post_std_first": 0.1, "post_std_end": 0.2, "post_boundary_over_regular": 0.98,
        "post_kurtosis": 1.8, "post_kurtosis_distinct": 0.9}
    keys = {row.key for kind in ("std", "ratio", "kurtosis") for row in tables.boundary_rows(kind)}
    assert keys == set(tables.boundary_numbers(None, 42))


def test_table3_numbers_put_both_placements_controls_into_the_interaction(monkeypatch):
    """grow − joint-longer per placement, and the interaction against each control, written out from the
    ten runs' CEs (arbitrary, distinct values; a diverged one stays diverged through the arithmetic)."""
    ce = {run.name: 3.0 + 0.01 * i * i for i, run in enumerate(tables.TABLE3_RUNS)}
    monkeypatch.setattr(report, "final_ce", lambda ws, run, seed: ce[run.name])
    out = tables.table3_numbers(None, 42)
    assert out["pre_grow_minus_longer"] == ce["pre-grow"] - ce["pre-joint-longer"]
    assert out["interaction"] == pytest.approx((ce["post-grow"] - ce["pre-grow"]) - (ce["post-joint"] - ce["pre-joint"]))
    for control in ("longer", "replay"):
        want = (ce["post-grow"] - ce["pre-grow"]) - (ce[f"post-joint-{control}"] - ce[f"pre-joint-{control}"])
        assert out[f"interaction_{control}"] == pytest.approx(want, abs=1e-12)
    ce["pre-joint-replay"] = report.DIVERGED
    out = tables.table3_numbers(None, 42)
    assert isinstance(out["interaction_replay"], report.Diverged) and not isinstance(out["interaction_longer"],
                                                                                     report.Diverged)


def test_a_reference_leaves_out_a_run_not_yet_finished_for_every_seed(tmp_path):
    """An experiment still training has finished some seeds' runs: the reference keeps only runs done
    for every seed, so no band is made from fewer seeds than it names."""
    from experiments import reference
    for seed, names in ((42, ("pre-grow", "peri-joint")), (43, ("pre-grow",))):
        for name in names:
            run = tmp_path / "runs" / f"s{seed}" / name
            run.mkdir(parents=True)
            done = {"ce": 3.0 + seed / 100, "ppl": math.exp(3.0 + seed / 100), "kd": 0.0, "step": 9}
            (run / "metrics.jsonl").write_text(json.dumps({**done, "eval": True}) + "\n")
            (run / "done.json").write_text(json.dumps(done))
    (tmp_path / "results").mkdir()
    # reports over the reference's seeds, or two or more of them, ship, each with its seeds; one over a
    # single seed of several (no spread for a band) or over another seed does not
    for name, seeds in (("table1", [42, 43, 44]), ("regime", [42, 43]), ("scratch", [42]), ("placements", [42, 45])):
        rows = [{"placement": "peri", "delta_grow": report.across_seeds([0.01 * s for s in seeds])}]
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps({"seeds": seeds, "rows": rows}))
    (tmp_path / "runs" / "s44").mkdir()
    ref = reference.collect(tmp_path / "runs", tmp_path / "results", [42, 43, 44])
    assert ref["final_ce"] == {} and ref["curves"] == {}  # seed 44 has no runs: nothing finished for every seed
    assert ref["table_seeds"] == {"regime": [42, 43], "table1": [42, 43, 44]}
    assert ref["tables"]["regime"] == {"peri: delta_grow": [0.42, 0.43]}
    ref = reference.collect(tmp_path / "runs", tmp_path / "results", [42, 43])
    assert ref["final_ce"] == {"pre-grow": [3.42, 3.43]} and set(ref["curves"]) == {"pre-grow"}
    assert ref["table_seeds"] == {"regime": [42, 43]}  # table1's seed 44 is not among these


def test_references_ship_and_compare_the_per_seed_values_of_every_report_shape(tmp_path):
    """scratch's named `numbers`, planted's interactions and Δgrow, and a table's rows all ship as
    per-seed values, and `compare` checks a results folder's per-seed values against them: the shipped
    seeds' own values lie in their bands, a perturbed one does not."""
    from experiments import reference
    stats = lambda *v: report.across_seeds(list(v))
    scratch = {"seeds": [42, 43, 44], "numbers": {"pre_joint": stats(4.60, 4.61, 4.62),
                                                  "interaction": stats(0.281, 0.283, 0.285)}}
    planted = {"seeds": [42, 43, 44], "rows": [{"variant": "pre-grow (suite)", "ce": stats(3.50, 3.51, 3.52)}],
               "interactions": [{"dose": "the boundary token at 37x", "interaction": stats(0.01, 0.02, 0.03)}],
               "delta_grow": {"none": stats(-0.02, -0.03, -0.04)}}
    assert reference.report_numbers(scratch) == {"pre_joint": [4.60, 4.61, 4.62], "interaction": [0.281, 0.283, 0.285]}
    assert reference.report_numbers(planted) == {"pre-grow (suite): ce": [3.50, 3.51, 3.52],
                                                 "the boundary token at 37x: interaction": [0.01, 0.02, 0.03],
                                                 "delta_grow: none": [-0.02, -0.03, -0.04]}
    results = tmp_path / "results"
    results.mkdir()
    for name, content in (("scratch", scratch), ("planted", planted)):
        (results / f"{name}.json").write_text(json.dumps(content))
    for seed in (42, 43, 44):
        (tmp_path / "runs" / f"s{seed}").mkdir(parents=True)
    ref = reference.collect(tmp_path / "runs", results, [42, 43, 44])
    assert ref["tables"]["scratch"]["interaction"] == [0.281, 0.283, 0.285]
    rows = {r["name"]: r for r in reference.compare(results, ref)}
    assert rows["scratch/interaction/2"]["value"] == 0.285 and all(r["within"] for r in rows.values())
    assert len(rows) == 2 * 3 + 3 * 3  # every per-seed value of both reports was checked
    scratch["numbers"]["interaction"] = stats(0.281, 0.283, 0.385)  # seed 44's interaction off by 0.1
    (results / "scratch.json").write_text(json.dumps(scratch))
    rows = {r["name"]: r for r in reference.compare(results, ref)}
    assert not rows["scratch/interaction/2"]["within"] and rows["scratch/interaction/1"]["within"]


def test_a_reference_records_the_commit_that_trained_each_run(tmp_path):
    """Correction 12: each run's provenance commit (the suite's, beyond/'s and the teacher's) ships in the
    reference, so when a run ran relative to the rule that governs it can be checked."""
    from experiments import reference
    runs = tmp_path / "runs"
    for folder, commit in (("s42/pre-grow", "a" * 40), ("beyond/scratch/s42/pre-joint", "b" * 40),
                           ("teacher", "c" * 40), ("s45/pre-grow", "d" * 40)):
        (runs / folder).mkdir(parents=True)
        (runs / folder / "provenance.json").write_text(json.dumps({"git_commit": commit}))
    (tmp_path / "results").mkdir()
    ref = reference.collect(runs, tmp_path / "results", [42])
    assert ref["run_commits"] == {"s42/pre-grow": "a" * 40, "beyond/scratch/s42/pre-joint": "b" * 40,
                                  "teacher": "c" * 40}


# A report that shows numbers over seeds must ship them per seed in references/toy.json. fig3 and figA2 are
# figures of one seed (their numbers are seed 42's plots), so they have no per-seed table.
SHIPPED_TOY = json.loads((ROOT / "references" / "toy.json").read_text())
ONE_SEED_FIGURES = {"fig3", "figA2"}


@pytest.mark.parametrize("table", sorted(set(SHIPPED_TOY["table_seeds"]) - ONE_SEED_FIGURES))
def test_the_shipped_toy_reference_holds_per_seed_values_for_every_table(table):
    seeds = SHIPPED_TOY["table_seeds"][table]
    numbers = SHIPPED_TOY["tables"][table]
    assert numbers, f"{table}: no per-seed values shipped"
    assert all(isinstance(v, list) and len(v) == len(seeds) for v in numbers.values())


# ---- the README's command table runs as written ----------------------------------------------------

TRAINS = ("run", "train", "regime", "search", "intervention", "planted", "placements", "scratch", "ideas")
# Rows whose options ask for what a machine may lack (Apple silicon, an optional package): their option
# names are checked (--help), not the run; each needs-line says why.
NEEDS = {"--device mps": "an Apple GPU", "--log tensorboard": "the tensorboard package"}


def readme_command_rows() -> list[tuple[list[str], list[str]]]:
    """Each row of the README's command table (## Commands): (its commands: the first cell's and any
    `python repro.py ...` in the others, its option hints: `--...` in the others)."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n\n| where |", 1)[0]
    rows = []
    for line in table.splitlines():
        if line.startswith("| `"):
            first, rest = line.split(" | ", 1)
            quoted = re.findall(r"`([^`]+)`", rest)
            rows.append((re.findall(r"`([^`]+)`", first) + [q for q in quoted if q.startswith("python repro.py")],
                         [q for q in quoted if q.startswith("--")]))
    return rows


def test_every_command_of_the_readmes_table_runs_as_written(tmp_path, monkeypatch):
    """A command that trains runs as a dry run, any other with --help (which checks its option names):
    none fails as written; an option a row's text names is one its command has (before: the placements
    row's --norm); the train row lists every protocol; a reference row over a file the kit ships says
    --force. Make targets exist in the Makefile."""
    rows = readme_command_rows()
    assert sum(len(commands) for commands, _ in rows) >= 30
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    monkeypatch.chdir(tmp_path)
    for commands, hints in rows:
        for command in commands:
            if command.startswith("make "):
                assert command.split()[1] in targets, command
                continue
            assert command.startswith("python repro.py"), command
            args = shlex.split(re.sub(r"\[[^\]]*\]", "", command))[2:]  # "[--nodes 4]": optional
            name = args[0] if args[0] in repro.cli.commands else "run"
            trains = name in TRAINS
            checked_only = [why for option, why in NEEDS.items() if option in command]
            more = ["--dry-run", "--runs-dir", str(tmp_path / "runs")] if trains and not checked_only else ["--help"]
            result = CliRunner().invoke(repro.cli, [*args, *more])
            assert result.exit_code == 0 and "Error" not in result.output, (command, result.output[-2000:])
            if name == "reference":
                assert "--force" in args or not (ROOT / "references" / f"{args[args.index('--scale') + 1]}.json").exists()
        first = shlex.split(commands[0])[2:3] if commands[0].startswith("python") else []
        row_command = first[0] if first and first[0] in repro.cli.commands else "run"
        options = {o for p in repro.cli.commands[row_command].params for o in p.opts + p.secondary_opts}
        for hint in hints if commands[0].startswith("python") else ():
            assert set(hint.split()[0].split("/")) <= options, (commands[0], hint)  # --compile/--no-compile
    train_row = next(hints for commands, hints in rows if "--protocol grow" in commands[0] and "train" in commands[0])
    listed = next(h for h in train_row if h.startswith("--protocol"))
    choices = next(p for p in repro.cli.commands["train"].params if p.name == "protocol").type.choices
    assert all(c in listed.replace(",", " ").split() for c in choices), listed
    assert not (tmp_path / "runs").exists()
