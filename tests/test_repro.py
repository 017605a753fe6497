"""repro.py: presets and their dry runs, the CLI's options and overrides, the toy and mini as miniatures,
run names, the README's command table. The smoke suite end to end: test_smoke_suite.py; reports and
references: test_reports.py."""
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import repro_cli

import config
import data
import repro
import rundir
from experiments import presets, registry, set_values, suite, tables, training
from plumbing import checkpoint, devices, errors, paths
from plumbing.flops import forward_flops_per_token
from tools import checkpoints, lockstep_plan, plan

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
    teacher steps, and the four fresh-data long controls, pre- and post-norm reading the same documents, share
    100k (joint-long's phase 1 together, then joint-longer's phase 2): 250k."""
    ws = suite.Workspace(presets.PRESETS["full"], Path("/nonexistent/full"), Path("/nonexistent"), devices.Dist())
    runs = plan.planned_runs(ws, list(tables.RUNS), 42)
    assert lockstep_plan.teacher_passes(runs, lockstep=False) == 2 * (50_000 + 150_000 + 100_000 + 50_000 + 50_000 + 100_000)
    assert lockstep_plan.teacher_passes(runs, lockstep=True) == 150_000 + 2 * 50_000
    # One CPU process keeping the shard's first-epoch teacher states: a replaying run pays its steps in phase 0 only
    # (joint 50k, grow 50k, freeze and the same-shard control none); the long controls' fresh documents 50k each
    assert lockstep_plan.teacher_passes(runs, lockstep=True, first_epoch_kept=True) == 50_000 + 2 * 50_000
    assert lockstep_plan.teacher_passes(runs, lockstep=False, first_epoch_kept=True) == 2 * (50_000 + 50_000 + 2 * 50_000)
    assert [[r.name for r in group] for group in lockstep_plan.lockstep_groups(runs)][1] == [
        "pre-joint-long", "pre-joint-longer", "post-joint-long", "post-joint-longer"]
    assert lockstep_plan.most_resident(runs) == 6  # joint ends where freeze joins; the same-shard controls run throughout
    result = plan.print_plan(ws, runs, [42], "h100", 8, suite.console)
    saved = result["separate"]["flops"] - result["lockstep"]["flops"]
    teacher = presets.teacher_shape(ws.preset)
    layers, _ = forward_flops_per_token(teacher, 36, 972.5 / 2)
    assert saved == pytest.approx((1_000_000 - 250_000) * 64 * 972.5 * layers)
    assert result["lockstep"]["memory_gib"] > result["separate"]["memory_gib"]
    assert result["lockstep_default"] == (result["lockstep"]["memory_gib"] <= 0.9 * 80)


def test_a_studys_remaining_flops_are_what_training_computes():
    """The dry run's "remaining" FLOPs of a study's suite runs: the lockstep plan of those runs (prefix phases paid
    once, a teacher pass a batch for each lockstep group), not each run alone with its prefix paid again, which
    made the toy's estimate twice its time; a variant's run is still priced alone. One CPU process keeps the
    teacher's states of the shard's first epoch (the toy's fit), so a replaying run's later phases pay no teacher."""
    from experiments import studies
    from tools import preflight
    ws = suite.Workspace(presets.PRESETS["toy"], Path("/nonexistent/toy"), Path("/nonexistent"), devices.Dist())
    names = [r for r in tables.RUNS if r.protocol != "freeze"]
    jobs = [studies.Job(ws, run, 42) for run in suite.with_prefixes(names)]
    lockstep = plan.print_plan(ws, plan.planned_runs(ws, names, 42), [42], "h100", 1, suite.console,
                               first_epoch_kept=True)["lockstep"]
    assert preflight.remaining_flops(jobs, None) == lockstep["flops"]
    per_pass = (plan.print_plan(ws, plan.planned_runs(ws, names, 42), [42], "h100", 1, suite.console)["lockstep"]["flops"]
                - lockstep["flops"]) / (2 * 250)  # grow's phases 1 and 2: a toy teacher's forward over 16 documents
    layers, _ = forward_flops_per_token(presets.teacher_shape(ws.preset), 12, 95.0 / 2)
    assert per_pass == pytest.approx(16 * 95.0 * layers)
    alone = sum(plan.print_plan(ws, [lockstep_plan.PlannedRun(job.run.name, suite.run_config(ws, job.run, 42), 0)],
                                [42], "h100", 1, suite.console)["separate"]["flops"] for job in jobs)
    assert alone > 1.5 * lockstep["flops"]  # the long controls' and replays' prefixes, and every teacher pass


class LengthsOnly:
    """A validation shard of documents of these lengths (both <|endoftext|> included), all eot tokens."""
    eot = 0

    def __init__(self, lengths):
        self.lengths = np.asarray(lengths)

    def __len__(self):
        return len(self.lengths)

    def document(self, i):
        return np.zeros(self.lengths[i], dtype=np.uint32)


@pytest.mark.parametrize("world, eval_batch", [(1, 4), (8, 1), (3, 2)])
def test_the_plans_evaluations_are_the_batches_the_ranks_run(world, eval_batch):
    """The dry run prices each evaluation as it runs: the batches each rank's forward receives from
    data.eval_batches, every rank of a step as long as the step's costliest batch (a packed batch: the sum of
    its documents), through the teacher and the phase's active student. Summed here from the batches themselves."""
    full = presets.PRESETS["full"]
    teacher = presets.teacher_shape(full)
    ws = suite.Workspace(full, Path("/nonexistent/full"), Path("/nonexistent"), devices.Dist())
    grow_run = next(r for r in plan.planned_runs(ws, tables.MAIN_RUNS, 42) if r.name == "post-grow")
    grow_run.config = replace(grow_run.config, eval_batch=eval_batch)
    shard = LengthsOnly(np.random.default_rng(0).lognormal(6, 1, 37).astype(int).clip(2, 8193))
    per_rank = [list(data.eval_batches(shard, eval_batch, r, world)) for r in range(world)]
    def cost(batch, student_layers):  # each document's tokens through the teacher, the student and two heads
        def document(n):
            t_layers, head = forward_flops_per_token(teacher, 36, n / 2)
            return n * (t_layers + forward_flops_per_token(teacher, student_layers, n / 2)[0] + 2 * head)
        return sum(document(n) for n in batch.doc_lengths) if batch.doc_ids else 0.0
    run = sum(26 * world * max(cost(b, 3 * blocks) for b in step)  # 26 evaluations a phase, 3 phases
              for blocks in (1, 2, 3) for step in zip(*per_rank))
    # The same products summed in another order: float64 rounding only
    assert plan.evaluation_flops(grow_run, full, teacher, shard.lengths - 1, world) == pytest.approx(run, rel=1e-12)


@pytest.mark.parametrize("world", [3, 128])
def test_the_launch_the_dry_run_and_the_rehearsal_refuse_a_shape_with_one_line(tmp_path, world):
    """64 documents a step on 3 ranks (not a multiple) or on 128 (fewer than the ranks): the launch refuses
    before any work (training.check_before_work, on its ranks), and the dry run and the rehearsal refuse the
    same shape with the same line before pricing or rehearsing anything (the dry run priced both before:
    the second with a negative imbalance line and 'balance inf')."""
    from tools import preflight, rehearse
    ws = suite.Workspace(presets.PRESETS["full"], tmp_path / "full", tmp_path / "results",
                         devices.Dist(0, world, local_world=world))
    runs = plan.planned_runs(ws, tables.MAIN_RUNS, 42)
    lines = set()
    for attempt in (lambda: training.check_before_work(ws, [(run, 42) for run in tables.MAIN_RUNS], False),
                    lambda: plan.print_plan(ws, runs, [42], "h100", world, suite.console),
                    lambda: preflight.rehearse_launch(ws, rehearse.Launch(world), tables.MAIN_RUNS, "both", False, "t")):
        with pytest.raises(errors.DataError) as refused:
            attempt()
        lines.add(str(refused.value))
    assert len(lines) == 1 and f"global_batch=64: must be a positive multiple of world_size={world}" in lines.pop()
    assert not any(tmp_path.iterdir())  # nothing made


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


def test_repro_py_without_its_dependencies_says_how_to_install_them():
    """`python3 repro.py` outside the virtualenv (no torch there): one line naming the package and the fix, not a
    ModuleNotFoundError traceback."""
    blocked = "import runpy, sys; sys.modules['torch'] = None; sys.argv[0] = 'repro.py'; runpy.run_path('repro.py', " \
              "run_name='__main__')"
    out = subprocess.run([sys.executable, "-c", blocked, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == "" and out.stderr.splitlines() == [
        "Error: torch is not installed; run `make install`, then `.venv/bin/python repro.py ...`"]


def probe_runs_folder(folder: Path, calls: int, start) -> list[str]:
    start.wait()
    failures = []
    for _ in range(calls):
        try:
            paths.writable_dir(folder, "--runs-dir")
        except errors.OptionError as e:
            failures.append(str(e))
    return failures


def test_ranks_that_probe_the_runs_folder_at_once_all_find_it_writable(tmp_path):
    """Every rank of a launch probes the runs folder as it starts (suite.workspace). 8 processes x 400
    probes of one folder, released together: none fails, and no probe is left behind. Before the fix each
    wrote and deleted the same `.write-test` and one rank deleted another's: "runs is not a writable
    folder (No such file or directory)"."""
    import multiprocessing
    context = multiprocessing.get_context("fork")
    start = context.Manager().Barrier(8)
    with context.Pool(8) as pool:
        results = pool.starmap(probe_runs_folder, [(tmp_path, 400, start)] * 8)
    failures = [f for r in results for f in r]
    assert failures == [], f"{len(failures)} of 3200 probes failed: {failures[0]}"
    assert list(tmp_path.iterdir()) == []


def test_edited_preset_is_refused_then_forced_without_redoing_what_matches(tmp_path):
    preset = presets.PRESETS["smoke"]
    original = suite.Workspace(preset, tmp_path / "smoke", tmp_path / "results", devices.Dist())
    post_joint = suite.RunName("post", "joint")
    training.ensure_runs(original, [post_joint], [42])
    edited = replace(preset, run={**preset.run, "lr": preset.run["lr"] / 2})
    ws = suite.Workspace(edited, tmp_path / "smoke", tmp_path / "results", devices.Dist())
    tokens = ws.data_dir / "train" / "tokens.u32"
    teacher_done = ws.teacher_dir / "done.json"
    stamps = (tokens.stat().st_mtime_ns, teacher_done.stat().st_mtime_ns)
    with pytest.raises(errors.TrainingError, match="another config .*differs in lr.*--force"):
        training.ensure_runs(ws, [post_joint], [42])
    training.ensure_runs(ws, [post_joint], [42], force=True)
    config = json.loads((ws.run_dir(post_joint, 42) / "config.json").read_text())
    assert config["lr"] == preset.run["lr"] / 2 and (ws.run_dir(post_joint, 42) / "done.json").is_file()
    # The shards and the teacher matched the edited preset: reused, not redone.
    assert (tokens.stat().st_mtime_ns, teacher_done.stat().st_mtime_ns) == stamps


# ---- the toy as a faithful miniature (the ratios, mini, the shipped teacher) ---------------------


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
    """As pre-registered: no rung met the criterion, so mini is the toy with the overrides of the last rung run
    (rung 2, tokens-x4: docs/records/2026-12-01-miniature-search.md); its teacher's settings are the toy's, so the
    shipped teacher serves both."""
    toy = presets.PRESETS["toy"]
    mini, _ = presets.apply_overrides(toy, presets.parse_overrides(toy, ["run.phase_steps=1000", "run.eval_interval=500",
                                                                         "run.snapshot_interval=500"]))
    assert presets.PRESETS["mini"].run == mini.run and presets.PRESETS["mini"].data == mini.data
    toy_teacher = {**presets.PRESETS["toy"].run, **presets.PRESETS["toy"].teacher_run}
    mini_teacher = {**presets.PRESETS["mini"].run, **presets.PRESETS["mini"].teacher_run}
    assert toy_teacher == mini_teacher and presets.PRESETS["mini"].shipped_teachers[0] == "teachers/toy"


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


def test_the_shipped_teacher_installed_is_the_one_trained_as_this_workspace_would_train(tmp_path, monkeypatch):
    """Of several shipped teachers, the one whose config is the workspace's teacher config, and whose shards
    (where teachers/shards.json records them) are the workspace's token for token; none: the kit trains."""
    root = tmp_path / "kit"
    shutil.copytree(ROOT / "teachers" / "toy", root / "teachers" / "toy")
    other = Path(shutil.copytree(ROOT / "teachers" / "toy", root / "teachers" / "other"))
    settings = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**settings, "lr": settings["lr"] / 2}))
    checkpoint.write_checksums(other)  # as shipped: whole, for a teacher trained at another LR
    monkeypatch.setattr(suite, "SHIPPED_ROOT", root)
    preset = replace(presets.PRESETS["toy"], shipped_teachers=("teachers/other", "teachers/toy"))
    ws = suite.Workspace(preset, tmp_path / "runs" / "toy", tmp_path / "results", devices.Dist())
    suite.prepare_data(ws)
    assert suite.shipped_teacher_for(ws) == "teachers/toy"
    shards = {s: json.loads((ws.data_dir / s / "manifest.json").read_text())["sha256"] for s in ("train", "val")}
    (root / "teachers" / "shards.json").write_text(json.dumps({"teachers/toy": shards}))
    assert suite.shipped_teacher_for(ws) == "teachers/toy"
    shards["train"]["tokens.u32"] = "0" * 64  # trained on other tokens than these: not this workspace's teacher
    (root / "teachers" / "shards.json").write_text(json.dumps({"teachers/toy": shards}))
    assert suite.shipped_teacher_for(ws) == "" and not suite.install_shipped_teacher(ws)
    assert not ws.teacher_dir.exists()


def test_a_teacher_shipped_by_the_kit_is_installed_for_its_own_data_only(tmp_path, monkeypatch):
    """`teacher --ship`: the finished teacher's files as trained (no snapshots), checksummed, its shards
    recorded; a workspace of the same settings and data installs it, one whose data differ trains its own;
    a name taken, or not a plain folder name, is refused."""
    from tools import preflight
    monkeypatch.setattr(suite, "SHIPPED_ROOT", tmp_path / "kit")
    ws = suite.workspace("smoke", tmp_path / "runs", tmp_path / "results")
    preflight.pretrain_teacher(ws)
    assert "teachers/smoke-x" in preflight.ship_teacher(ws, "smoke-x")
    shipped = tmp_path / "kit" / "teachers" / "smoke-x"
    assert sorted(p.name for p in shipped.iterdir()) == sorted([*preflight.SHIPPED_FILES, checkpoint.CHECKSUMS])
    assert checkpoint.damage(shipped) == "" and checkpoint.damage(shipped / "phase-0") == ""
    shards = json.loads((tmp_path / "kit" / "teachers" / "shards.json").read_text())["teachers/smoke-x"]
    assert shards["train"] == json.loads((ws.data_dir / "train" / "manifest.json").read_text())["sha256"]
    preset = replace(presets.PRESETS["smoke"], shipped_teachers=("teachers/smoke-x",))
    fresh = suite.Workspace(preset, tmp_path / "again" / "smoke", tmp_path / "results", devices.Dist())
    suite.prepare_data(fresh)
    assert suite.install_shipped_teacher(fresh)
    weights = "phase-0/model.safetensors"
    assert (fresh.teacher_dir / weights).read_bytes() == (ws.teacher_dir / weights).read_bytes()
    other = suite.Workspace(replace(preset, data={**preset.data, "max_len": preset.data["max_len"] // 2}),
                            tmp_path / "other" / "smoke", tmp_path / "results", devices.Dist())
    suite.prepare_data(other)  # as many documents, cut shorter: the same config, other tokens
    assert suite.teacher_config(other) == suite.teacher_config(fresh) and not suite.install_shipped_teacher(other)
    for name, message in (("smoke-x", "exists"), ("../up", "folder name")):
        with pytest.raises(errors.OptionError, match=message):
            preflight.ship_teacher(ws, name)


def test_the_scan_with_set_reads_that_workspaces_teacher(tmp_path):
    """`scan --set teacher_model.num_hidden_layers=3`: the teacher trained (or installed) for those settings is
    the one scanned, a row per layer, in that workspace's results; the scale's own teacher is never made."""
    repro_cli("scan", "--scale", "smoke", "--set", "teacher_model.num_hidden_layers=3", "--runs-dir", tmp_path / "runs",
              "--results-dir", tmp_path / "results")
    out = json.loads((tmp_path / "results" / "smoke+teacher_model.num_hidden_layers=3" / "scan.json").read_text())
    assert out["teacher"] == str(tmp_path / "runs" / "smoke+teacher_model.num_hidden_layers=3" / "teacher" / "phase-0")
    assert [r["layer"] for r in out["scans"]["teacher"]] == [0, 1, 2] and not (tmp_path / "runs" / "smoke").exists()


# ---- overrides ---------------------------------------------------------------------------------


def test_override_values_are_typed():
    preset = presets.PRESETS["smoke"]
    overrides = presets.parse_overrides(preset, ["run.lr=3e-4", "data.max_len=16", "run.betas=0.9,0.99",
                                                 "teacher_model.tie_word_embeddings=false", "run.seed=7", "run.seed=8"])
    # one shape after parsing, {section: {key: typed value}}; a later value of a key wins
    assert overrides == {"run": {"lr": 3e-4, "betas": (0.9, 0.99), "seed": 8}, "data": {"max_len": 16},
                         "teacher_model": {"tie_word_embeddings": False}}
    del overrides["run"]["seed"]
    new, changes = presets.apply_overrides(preset, overrides, compile_flag=True)
    assert new.run["lr"] == 3e-4 and new.data["max_len"] == 16 and new.run["betas"] == (0.9, 0.99)
    assert new.teacher_model["tie_word_embeddings"] is False and new.run["compile"] is True
    assert preset.run["lr"] == 3e-3  # the preset itself is unchanged
    assert set_values.override_name(changes) == ("data.max_len=16,run.betas=(0.9,0.99),run.compile=True,run.lr=0.0003,"
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


def test_long_override_names_are_cut_and_end_in_a_hash_of_the_whole():
    changes = {"run": {"phase_lrs": tuple([3e-3] * 40)}, "data": {"path": "/a" * 200}}
    name = set_values.override_name(changes)
    other = set_values.override_name({**changes, "data": {"path": "/b" * 200}})
    assert len(name.encode()) == set_values.OVERRIDE_NAME_BYTES and name != other and "~" in name
    assert set_values.override_name({"run": {"lr": 0.0003}}) == "run.lr=0.0003"  # short ones unchanged


def test_override_names_are_one_per_set_of_values():
    """/ was shown as _ and spaces dropped, so /a/b, /a_b and _a_b (and a b, ab) named one workspace; a value
    holding ',' or '=' could read as two items. Each now names its own; a value that loses nothing keeps the
    name it always had (existing workspaces and run folders keep theirs)."""
    sets = [{"data": {"path": v}} for v in ("/a/b", "/a_b", "_a_b", "a b", "ab", "a,data.source=local", "a~1")] + \
        [{"data": {"path": "a", "source": "local"}}]
    names = [set_values.override_name(changes) for changes in sets]
    assert len(set(names)) == len(names), names
    assert names[2] == "data.path=_a_b" and names[4] == "data.path=ab" and names[7] == "data.path=a,data.source=local"
    assert names[0].startswith("data.path=_a_b~") and names[3].startswith("data.path=ab~")


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
    said = " ".join(repro_cli("--help").stdout.split())
    assert f"Experiments: {' '.join(tables.TABLES)}, or all" in said and " ".join(registry.STUDIES) in said


# ---- the README's command table runs as written ----------------------------------------------------

TRAINS = ("run", "train", *registry.STUDIES)
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
