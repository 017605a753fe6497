"""The precision rule (issue 47 §1; experiments/studies.settle_precision): a study's "auto" runs train in its
records' precision on every CPU, whatever the probe would pick, and the dry run names exactly the runs that train
and that precision. The toy's committed records are float32: the README's commands must work on a bf16 machine."""
import json
import re
import shutil

import pytest
import torch
from bad_records import placed

import rundir
from experiments import record_files, studies
from plumbing import devices, errors
from tests.conftest import repro_cli

AUTO = "set/run.precision=auto"  # where smoke's runs with --set run.precision=auto live (and their records)
PROBES = {"fp32": 0.5, "bf16": 3.0}  # a bf16 matmul's speed over fp32's: below and above BF16_MIN_SPEEDUP


@pytest.fixture(params=list(PROBES))
def probe(request, monkeypatch):
    """The matmul probe forced to pick fp32 (an AVX2 machine: bf16 emulated) or bf16 (an AMX one)."""
    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda: PROBES[request.param])
    assert devices.precision_choice("auto", torch.device("cpu"))[0] == devices.DTYPES[request.param]
    return request.param


def to_train(stdout: str) -> list[str]:
    """The dry run's "to train:" list (the console wraps long lines)."""
    text = " ".join(stdout.split())
    found = re.search(r"to train: (.*?) remaining: (\d+) runs in (\w+)", text)
    assert found, stdout[-2000:]
    names = [] if found.group(1) == "nothing" else [n.removeprefix(f"{AUTO}/") for n in found.group(1).split(", ")]
    assert int(found.group(2)) == len(names)
    return names, found.group(3)


@pytest.mark.parametrize("args, expected", [
    (["table1"], ["s42/pre-joint", "s42/post-joint"]),
    # `all` reads every run's weights or every step (Table 4, the figures): they train, the freeze runs restore
    ([], ["s42/pre-joint-long", "s42/pre-joint-longer", "s42/post-joint-long", "s42/post-joint-longer",
          "s42/pre-joint-replay", "s42/post-joint-replay", "s42/pre-joint", "s42/post-joint", "s42/pre-grow",
          "s42/post-grow"])])
def test_the_toy_dry_run_names_the_runs_and_the_records_precision_on_either_probe(probe, args, expected, tmp_path):
    """The kit's float32 records of seed 42's grow and freeze runs (a fixed subset: the kit's own folder gains
    records as studies land) stand in for a study; the dry run names what trains and in which precision."""
    records = tmp_path / "records" / "toy" / "s42"
    records.mkdir(parents=True)
    for run in ("pre-grow", "post-grow", "pre-freeze", "post-freeze"):
        shutil.copy(studies.RECORDS_DIR / "toy" / "s42" / f"{run}.json", records / f"{run}.json")
    out = repro_cli(*args, "--scale", "toy", "--dry-run", "--runs-dir", tmp_path / "runs", "--records-dir",
                    tmp_path / "records")
    text = " ".join(out.stdout.split())  # the console wraps long lines
    assert "precision: float32, the study's 4 records" in text
    assert ("this machine would pick bfloat16" in text) == (probe == "bf16")
    names, precision = to_train(out.stdout)
    assert names == expected and precision == "float32"


def record(folder, name: str, precision: str, asked: str = "auto"):
    """A kit's record placed as `name`'s, of that precision (read whole since issue 50: a stub is refused)."""
    return placed(folder, name, lambda r: (r["config"].update(precision=asked), r["provenance"].update(precision=precision)))


def test_records_of_two_precisions_are_refused_naming_each(tmp_path):
    record(tmp_path / "toy", "s42/pre-grow", "float32")
    assert list(studies.auto_precisions(tmp_path / "toy")) == ["float32"]
    record(tmp_path / "toy", "set/precision=bf16/s42/pre-grow", "bfloat16", asked="bf16")  # its own study: not counted
    assert list(studies.auto_precisions(tmp_path / "toy")) == ["float32"]
    record(tmp_path / "toy", "s43/pre-grow", "bfloat16")
    found = studies.auto_precisions(tmp_path / "toy")
    assert {p: len(v) for p, v in found.items()} == {"float32": 1, "bfloat16": 1}


def test_a_mixed_study_is_refused_even_with_nothing_left_to_train(tmp_path, monkeypatch):
    """Issue 50: every run recorded, one record bfloat16: one line naming both precisions, exit non-zero."""
    records = tmp_path / "records"
    shutil.copytree(studies.RECORDS_DIR / "toy" / "s42", records / "toy" / "s42")
    path = records / "toy" / "s42" / "post-grow.json"
    body = json.loads(path.read_text())
    body["provenance"]["precision"] = "bfloat16"
    body = {k: v for k, v in body.items() if k != "sha256"}
    path.write_text(json.dumps({**body, "sha256": record_files.digest(body)}))
    out = repro_cli("table1", "--scale", "toy", "--dry-run", "--runs-dir", tmp_path / "runs", "--records-dir", records,
                    check=False)
    assert out.returncode != 0 and "mix precisions (1 bfloat16" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def trained_and_restored(runs) -> tuple[set, set]:
    folders = [p.parent for p in runs.rglob("done.json") if p.parent.name != "teacher"]
    label = lambda f: str(f.relative_to(runs / "smoke" / AUTO))
    return ({label(f) for f in folders if not (f / studies.RECORD).is_file()},
            {label(f) for f in folders if (f / studies.RECORD).is_file()})


@pytest.mark.slow
def test_records_of_the_other_precision_train_what_the_dry_run_said_in_their_precision(tmp_path, monkeypatch):
    """At smoke, the README's path on a machine whose probe picks the other precision: records made under an
    fp32 probe; then under a bf16 probe, one record removed, a fresh runs folder: the dry run names that run and
    float32, the command trains exactly it, in float32, and restores the others."""
    records = tmp_path / "records"
    common = ["--scale", "smoke", "--records-dir", records, "--set", "run.precision=auto"]  # smoke's own is fp32
    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda: PROBES["fp32"])
    repro_cli("table1", *common, "--runs-dir", tmp_path / "a", "--results-dir", tmp_path / "ra")
    assert set(studies.auto_precisions(records / "smoke")) == {"float32"}
    (records / "smoke" / AUTO / "s42" / "post-joint.json").unlink()
    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda: PROBES["bf16"])
    dry = repro_cli("table1", *common, "--runs-dir", tmp_path / "b", "--dry-run")
    assert to_train(dry.stdout) == (["s42/post-joint"], "float32")
    repro_cli("table1", *common, "--runs-dir", tmp_path / "b", "--results-dir", tmp_path / "rb")
    trained, restored = trained_and_restored(tmp_path / "b")
    assert trained == {"s42/post-joint"} and restored == {"s42/pre-joint", "s42/pre-grow", "s42/post-grow"}
    provenance = json.loads((tmp_path / "b" / "smoke" / AUTO / "s42" / "post-joint" / "provenance.json").read_text())
    assert provenance["precision"] == "float32" and "records" in provenance["precision_reason"]
    # `all` on a fresh folder: every run trains (weights and every step are read), in float32, as the dry run says;
    # the records stay as they were, and every table and figure is written from the runs trained here
    before = {p: p.read_bytes() for p in records.rglob("*.json")}
    dry = repro_cli(*common, "--runs-dir", tmp_path / "c", "--dry-run")
    names, precision = to_train(dry.stdout)
    repro_cli(*common, "--runs-dir", tmp_path / "c", "--results-dir", tmp_path / "rc")
    trained, restored = trained_and_restored(tmp_path / "c")
    assert precision == "float32" and trained == set(names) and restored <= {"s42/pre-freeze", "s42/post-freeze"}
    assert {p: p.read_bytes() for p in records.rglob("*.json") if p in before} == before
    results, = (tmp_path / "rc").iterdir()  # results/smoke+<the --set>
    assert all((results / name).is_file() for name in ("table1.md", "table4.md", "tableA4.md", "fig3b.png", "fig5.json"))


def test_a_finished_folder_of_another_precision_is_named_before_it_mixes_in(tmp_path):
    """Issue 59 §1b: a finished bfloat16 folder beside a study pinned to float32 is named, whether it has a record or
    not (the tables would read the folder), and so is a record of another precision than the runs trained now."""
    from dataclasses import replace

    from experiments import suite
    ws = suite.workspace("smoke", tmp_path / "runs", tmp_path / "results")
    pinned = ("fp32", "the study's 4 records are float32")
    ws = replace(ws, records=tmp_path / "rec", ctx=replace(ws.ctx, auto_precision=pinned))
    job, other = (studies.Job(ws, suite.RunName(norm, "grow"), 42) for norm in ("pre", "post"))
    job.folder.mkdir(parents=True)
    (job.folder / "done.json").write_text("{}")
    (job.folder / "provenance.json").write_text(json.dumps({"precision": "bfloat16"}))
    teacher = ws.teacher_dir / "phase-0"
    for status in (studies.Status([], [], [job, other]), studies.Status([(job, {})], [], [other])):
        with pytest.raises(errors.TrainingError, match=f"{job.folder}: trained in bfloat16, but {other.folder} trains "
                                                       "in float32"):
            studies.check_precision(status, teacher)
    (job.folder / "provenance.json").write_text(json.dumps({"precision": "float32"}))
    studies.check_precision(studies.Status([], [], [job, other]), teacher)
    recorded = {"provenance": {"precision": "bfloat16"}}
    fresh = studies.Job(ws, suite.RunName("pre", "joint"), 42)  # trains now, in the study's float32
    with pytest.raises(errors.TrainingError, match="post-grow.json: recorded in bfloat16, but .* trained in float32"):
        studies.check_precision(studies.Status([(other, recorded)], [], [job, fresh]), teacher)


def test_a_resumed_run_keeps_its_precision_and_its_provenance(tmp_path):
    """Issue 59 §1c: a run killed at its step-12 checkpoint while it trained in bfloat16, resumed where float32 is
    chosen: refused in one line where it would resume (rundir.prepare_run_dir), its provenance.json unchanged; in
    bfloat16 it resumes; finished, or without a checkpoint (it starts over), it is never asked."""
    from experiments import suite
    from plumbing import devices
    ws = suite.workspace("smoke", tmp_path / "runs", tmp_path / "results", dry_run=True)
    settings, folder = suite.run_config(ws, suite.RunName("post", "grow"), 42), tmp_path / "post-grow"
    ctx = devices.Dist()
    made = lambda precision: rundir.provenance(ctx, devices.DTYPES[precision], f"{precision} (a test)")
    assert rundir.prepare_run_dir(settings, folder, False, ctx, made("bf16")) is False
    before = (folder / "provenance.json").read_bytes()
    assert rundir.prepare_run_dir(settings, folder, False, ctx, made("fp32")) is False  # no checkpoint yet: anew
    (folder / "provenance.json").write_bytes(before)
    (folder / "step-12").mkdir()
    with pytest.raises(errors.TrainingError, match="started in bfloat16 .* continue it in float32 .* a run keeps"):
        rundir.prepare_run_dir(settings, folder, False, ctx, made("fp32"))
    assert (folder / "provenance.json").read_bytes() == before
    assert rundir.prepare_run_dir(settings, folder, False, ctx, made("bf16")) is False
