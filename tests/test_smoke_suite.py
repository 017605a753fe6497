"""The smoke suite end to end (`repro.py --scale smoke`, killed once and resumed) and what is built on its
runs: every report and figure, shared prefixes, the train, eval, data, search and regime commands,
overrides, a moved runs tree, runs sharing one preparation, SIGTERM."""
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import repro_cli
from safetensors.torch import load_file

import config
import data
import grow
import rundir
from experiments import paper_reports, presets, reference, suite, tables
from plumbing import devices, locks

ROOT = Path(__file__).resolve().parents[1]


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
    for name, exp in tables.TABLES.items():
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


def test_a_live_report_holds_the_section_its_shipped_numbers_render(smoke):
    """One renderer (paper_reports.section): below its heading, each paper table's live report is the results page's
    section rendered from the reference these runs and reports make, then only what live runs add (figures)."""
    runs, results, _, _ = smoke
    shipped = reference.collect(runs, results, [42, 43])
    for name, exp in tables.TABLES.items():
        if exp.numbers:
            section = "\n".join(paper_reports.page_section(name, shipped, "smoke")[2:]).strip()
            assert (results / f"{name}.md").read_text().startswith(f"# {name} (smoke scale)\n\n{section}"), name


def test_compare_passes_an_honest_rerun_and_flags_a_perturbed_one(smoke, tmp_path):
    """references/smoke.json ships the smoke suite's seeds 42 and 43 (repro.py reference): this rerun
    of them is within the band, and a run whose validation loss was raised is not."""
    runs, results, _, _ = smoke
    for target in (runs, results, runs / "s43" / "pre-grow"):
        out = repro_cli("compare", target, "--scale", "smoke")
        assert "numbers within the band" in out.stdout and "NO" not in out.stdout, out.stdout[-2000:]
    perturbed = tmp_path / "post-grow"
    perturbed.mkdir()
    shutil.copy(runs / "s42" / "post-grow" / "config.json", perturbed)  # what the run is: smoke's post-grow
    rows = rundir.read_metrics(runs / "s42" / "post-grow")
    (perturbed / "metrics.jsonl").write_text("".join(
        json.dumps({**r, "ce": r["ce"] + 3.0} if r.get("eval") and r["step"] == 16 else r) + "\n" for r in rows))
    out = repro_cli("compare", perturbed, "--scale", "smoke", check=False)
    assert out.returncode == 1 and "post-grow/ce at 16" in out.stdout
    assert len(out.stderr.strip().splitlines()) == 1 and "outside the shipped seeds' band" in out.stderr


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
    expected = hashlib.sha256(b"".join((runs / f"s{seed}" / run.name / "config.json").read_bytes()
                                       for seed in (42, 43) for run in tables.MAIN_RUNS)).hexdigest()
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


def test_a_moved_runs_tree_is_reused_not_retrained(smoke, tmp_path, monkeypatch):
    """Configs store paths relative to their run folder: a finished tree copied elsewhere and used from
    another working directory reuses every run (nothing retrained, every done.json untouched) and its
    tables come out the same; `python tests/run_grow.py RUN/config.json` resumes a partial run in place."""
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
    resumed = subprocess.run([sys.executable, str(ROOT / "tests" / "run_grow.py"), str(run / "config.json")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run / "done.json").read_text())["ce"] == rows[0][1]["values"][0]  # pre_grow, seed 42


@pytest.mark.slow
def test_two_different_runs_sharing_one_preparation_end_as_sequential_runs(smoke, tmp_path):
    """pre-grow and post-joint started together on an empty runs folder: one prepares the data and trains
    the teacher while the other waits for each (locks.held); both end with the results of the smoke
    suite's (lockstep, which equals runs made one after the other), the teacher trained once. The test holds
    the shared data folder until both wait for it, so that which of them gets there first, and whether one
    finishes before the other starts on a loaded machine, is left to the locks, not to the scheduler."""
    def train(runs, norm, protocol):
        return subprocess.Popen([sys.executable, str(ROOT / "repro.py"), "train", "--scale", "smoke", "--norm", norm,
                                 "--protocol", protocol, "--runs-dir", str(runs)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    jobs, waiting = (("pre", "grow"), ("post", "joint")), "waiting for it to finish"
    with locks.held([tmp_path / "together" / "smoke" / "data"], say=lambda line: None):
        together = [train(tmp_path / "together", norm, protocol) for norm, protocol in jobs]
        lines = [[] for _ in together]
        readers = [threading.Thread(target=lambda p=p, out=out: out.extend(p.stdout)) for p, out in zip(together, lines)]
        for reader in readers:
            reader.start()
        deadline = time.time() + 300
        while not all(any(waiting in line for line in out) for out in lines):
            assert time.time() < deadline and all(p.poll() is None for p in together), lines
            time.sleep(0.2)
    for reader, p in zip(readers, together):
        reader.join()
        p.wait()
    outputs = ["".join(out) for out in lines]
    assert [p.returncode for p in together] == [0, 0], outputs
    for name in ("teacher", "s42/pre-grow", "s42/post-joint"):
        a, b = smoke[0] / name, tmp_path / "together" / "smoke" / name
        assert json.loads((a / "done.json").read_text()) == json.loads((b / "done.json").read_text()), name
        final = "phase-0" if name != "s42/pre-grow" else "phase-2"
        wa, wb = load_file(a / final / "model.safetensors"), load_file(b / final / "model.safetensors")
        assert all(torch.equal(wa[k], wb[k]) for k in wa), name
    teacher_rows = [r for r in rundir.read_metrics(tmp_path / "together" / "smoke" / "teacher") if "loss" in r]
    assert [r["step"] for r in teacher_rows] == list(range(1, len(teacher_rows) + 1))  # trained once, complete


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
