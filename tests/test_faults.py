"""Fault injection over a smoke suite (`make test-faults`; `.ci/run` runs it after `make test`): the
suite is SIGKILLed at 21 points, from data preparation through the teacher, every kind of student
checkpoint, a run finishing, a shared prefix being adopted, to the reports, and rerun after each kill.
It must end with the same weights, metrics.jsonl (but wall time), done.json and tables as a suite
that was never interrupted."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rundir

pytestmark = pytest.mark.faults
ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("table1", "tableA3")  # the six replay runs of a seed, trained in lockstep
# In the order the suite reaches them (smoke: 8 steps per phase, checkpoints every 4; teacher 20 steps).
KILLS = ("prepared:data:0", "opened:teacher:0", "stepped:teacher:3", "saved:teacher:10", "done:teacher:20",
         "opened:pre-joint:0", "stepped:post-grow:2", "saved:post-grow:4", "done:pre-joint:8", "saved:pre-grow:8",
         "opened:pre-freeze:8", "opened:post-freeze:8", "stepped:pre-freeze:10", "saved:pre-freeze:12",
         "saved:post-grow:16", "stepped:post-freeze:20", "saved:post-grow:24", "done:post-grow:24",
         "done:post-freeze:24", "reported:table1:0", "reported:tableA3:0")


def suite(base: Path, kill_at: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "repro.py"), *EXPERIMENTS, "--scale", "smoke", "--runs-dir", str(base / "runs"),
           "--results-dir", str(base / "results")]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NORMGROW_KILL_AT": kill_at})


def run_folders(base: Path) -> list[Path]:
    return sorted(p for p in (base / "runs" / "smoke").glob("s42/*")) + [base / "runs" / "smoke" / "teacher"]


def test_a_suite_killed_at_21_points_ends_as_an_uninterrupted_one(tmp_path):
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
