"""Fault injection over a smoke suite (`make test-faults`; `.ci/run` runs it after `make test`): the
suite is SIGKILLed at 31 points, from data preparation through the teacher, every kind of checkpoint
(each also midway through its write and midway through the folder swap), an evaluation, a run
finishing, a shared prefix being adopted, to the reports, and rerun after each kill.
It must end with the same weights, metrics.jsonl (but wall time), done.json and tables as a suite
that was never interrupted. And every file of a run folder, in turn, replaced by a pickle payload:
nothing may ever unpickle it."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import distil_config
from safetensors.torch import load_file

import rundir
from plumbing import errors

pytestmark = pytest.mark.faults
ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("table1", "tableA3")  # the six replay runs of a seed, trained in lockstep
# In the order the suite reaches them (smoke: 8 steps per phase, checkpoints every 4; teacher 20 steps).
KILLS = ("prepared:data:0", "opened:teacher:0", "stepped:teacher:3", "writing-latest:teacher:8", "saved:teacher:10",
         "writing-kept:teacher:20", "swapping-kept:teacher:20", "done:teacher:20",
         "opened:pre-joint:0", "stepped:post-grow:2", "writing-latest:pre-grow:4", "swapping-latest:pre-grow:4",
         "saved:post-grow:4", "swapping-kept:pre-joint:8", "done:pre-joint:8", "evaluated:post-joint:8",
         "writing-kept:pre-grow:8", "saved:pre-grow:8", "opened:pre-freeze:8", "opened:post-freeze:8",
         "stepped:pre-freeze:10", "swapping-latest:post-grow:12", "saved:pre-freeze:12", "saved:post-grow:16",
         "stepped:post-freeze:20", "evaluated:post-grow:24", "saved:post-grow:24", "done:post-grow:24",
         "done:post-freeze:24", "reported:table1:0", "reported:tableA3:0")


def suite(base: Path, kill_at: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "repro.py"), *EXPERIMENTS, "--scale", "smoke", "--runs-dir", str(base / "runs"),
           "--results-dir", str(base / "results")]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NORMGROW_KILL_AT": kill_at})


def run_folders(base: Path) -> list[Path]:
    return sorted(p for p in (base / "runs" / "smoke").glob("s42/*") if p.is_dir()) + [base / "runs" / "smoke" / "teacher"]


def test_a_suite_killed_at_31_points_ends_as_an_uninterrupted_one(tmp_path):
    clean = suite(tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr[-3000:]
    killed = tmp_path / "killed"
    assert len(KILLS) >= 20
    for kill_at in KILLS:
        out = suite(killed, kill_at)
        assert out.returncode == -signal.SIGKILL, f"{kill_at} was not reached: {out.stderr[-2000:]}"
    final = suite(killed)
    assert final.returncode == 0, final.stderr[-3000:]

    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    for a, b in zip(run_folders(tmp_path / "clean"), run_folders(killed), strict=True):
        assert a.name == b.name
        kept = sorted(p.name for p in a.iterdir() if p.name.startswith(("phase-", "step-")))
        assert kept == sorted(p.name for p in b.iterdir() if p.name.startswith(("phase-", "step-"))), a.name
        for ckpt in kept:
            x, y = load_file(a / ckpt / "model.safetensors"), load_file(b / ckpt / "model.safetensors")
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), f"{a.name}/{ckpt}"
        assert strip(rundir.read_metrics(a)) == strip(rundir.read_metrics(b)), a.name
        assert (a / "done.json").read_text() == (b / "done.json").read_text(), a.name
        assert not (b / "latest").exists()
    for name in EXPERIMENTS:
        rows = [json.loads((d / "results" / "smoke" / f"{name}.json").read_text())["rows"]
                for d in (tmp_path / "clean", killed)]
        assert [r["values"] for r in rows[0]] == [r["values"] for r in rows[1]], name


class Payload:
    """Unpickling this creates `marker`: proof that something was unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


@pytest.mark.parametrize("stopped", [False, True], ids=["finished", "mid-run"])
def test_a_pickle_planted_in_any_file_of_a_run_folder_never_runs(tiny_shards, tiny_teacher_dir, tmp_path, stopped):
    """Each file of a run folder in turn replaced by a pickle payload; resuming or reusing the run and
    loading its checkpoints must never unpickle it, and may only fail with one of the kit's errors."""
    import pickle
    import shutil
    from dataclasses import replace

    import grow
    import model
    config = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    original = tmp_path / "original"
    grow.train(config, original, stop_after_step=7 if stopped else None)
    marker = tmp_path / "executed"
    kit_errors = (errors.TrainingError, errors.CheckpointError, ValueError)
    files = sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    assert len(files) >= 10
    for i, name in enumerate(files):
        run_dir = tmp_path / f"planted-{i}"
        shutil.copytree(original, run_dir)
        (run_dir / name).write_bytes(pickle.dumps(Payload(marker)))
        for action in (lambda d=run_dir: grow.train(replace(config), d),
                       lambda d=run_dir: [model.Student.load(p) for p in sorted(d.glob("phase-*"))]):
            try:
                action()
            except kit_errors as error:
                assert len(str(error).splitlines()) == 1, (name, str(error))
        assert not marker.exists(), f"unpickled via {name}"
