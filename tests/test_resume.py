"""grow.py's checkpoints and resume: killed runs resume bit-identical, run folders held by another process,
damaged run files, a full disk, no pickle on resume, and each damaged checkpoint file's fallback."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import distil_config, phase_weights

import checkpointing
import grow
import model
import nets
import rundir
from plumbing import checkpoint, errors, locks

ROOT = Path(__file__).resolve().parents[1]


def latest_files(writers: int) -> tuple[str, ...]:
    """The files of latest/ written by `writers` ranks (besides checksums.json): checkpointing.stage_latest's."""
    shards = [checkpoint.shard_file(kind, w, writers) for kind in ("model", "optimizer") for w in range(writers)]
    return (*shards, checkpoint.SHARDED_INDEX, "trainer_state.json")


# ---- killed and resumed; run folders held by another process -------------------------------------


def start_run(config_file, run_dir):
    run_grow = [sys.executable, str(ROOT / "tests" / "run_grow.py"), str(config_file), "--run-dir", str(run_dir)]
    return subprocess.Popen(run_grow, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_when(proc, condition, timeout=120):
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def logged_steps(run_dir):
    return max([r["step"] for r in rundir.read_metrics(run_dir)], default=0)


@pytest.mark.slow
def test_sigkill_mid_phase_and_at_transition_resumes_bit_identical(tiny_shards, tiny_teacher_dir, tmp_path):
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=5, checkpoint_interval=2)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(c)))
    reference = grow.train(c, tmp_path / "reference")

    run_dir = tmp_path / "killed"
    grow.train(c, run_dir, stop_after_step=1)  # stopped before its first checkpoint: a rerun starts at step 0
    assert checkpointing.newest_checkpoint(run_dir) is None and logged_steps(run_dir) == 1
    kill_when(start_run(config_file, run_dir), lambda: logged_steps(run_dir) >= 3)  # mid-phase 0
    assert not (run_dir / "done.json").exists()
    kill_when(start_run(config_file, run_dir), lambda: (run_dir / "phase-1").is_dir())  # right at a transition
    assert not (run_dir / "done.json").exists()
    proc = start_run(config_file, run_dir)
    assert proc.wait() == 0, proc.stderr.read().decode()[-3000:]

    assert json.loads((run_dir / "done.json").read_text()) == reference
    for p in range(3):
        a, b = phase_weights(tmp_path / "reference", p), phase_weights(run_dir, p)
        assert all(torch.equal(a[k], b[k]) for k in a), f"phase {p} differs"
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert strip(rundir.read_metrics(run_dir)) == strip(rundir.read_metrics(tmp_path / "reference"))


HOLD = ("import sys, time\nfrom plumbing import locks\nwith locks.held([sys.argv[1]]):\n    print('held', flush=True)\n"
        "    time.sleep(600)\n")


def test_a_held_folder_is_waited_for_or_refused_and_a_killed_holder_releases_it(tmp_path):
    """Another process holds a run folder: --no-wait stops in one line naming its pid; a waiter says who
    it waits for and takes the folder once the holder is SIGKILLed, saying so; nothing is left beside the folder."""
    import threading
    folder = tmp_path / "runs" / "smoke" / "s42" / "pre-grow"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(errors.TrainingError, match=f"in use by process {holder.pid} .*without --no-wait"):
            with locks.held([folder], wait=False):
                pass
        said = []
        threading.Timer(1.0, holder.send_signal, (signal.SIGKILL,)).start()
        with locks.held([folder], say=said.append):
            assert holder.wait(timeout=5) == -signal.SIGKILL  # we got the folder only after the kill
            assert json.loads(locks.lock_file(folder).read_text())["pid"] == os.getpid()
        assert len(said) == 2 and f"in use by process {holder.pid}" in said[0] and "waiting" in said[0]
        assert f"left by process {holder.pid}" in said[1] and "gone; taking it over" in said[1]  # killed: its file stays
    finally:
        holder.kill()
    assert not list((tmp_path / "runs").rglob("*.lock"))  # the lock file went with its last holder


def test_a_finished_run_is_reused_while_another_process_holds_it(tiny_shards, tiny_teacher_dir, tmp_path):
    """Two experiments that both reuse the suite's finished runs never wait on each other: a done run
    with the same config is read without being held; one of another config is still held (and refused
    under --no-wait while another process holds it)."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", phase_steps=2)
    done = grow.train(c, tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert grow.train(c, tmp_path / "run", wait=False) == done
        with pytest.raises(errors.TrainingError, match=f"in use by process {holder.pid}"):
            grow.train(replace(c, lr=1e-3), tmp_path / "run", force=True, wait=False)
    finally:
        holder.kill()


@pytest.mark.slow
def test_two_trains_of_one_run_at_once_end_as_one_run_even_when_the_holder_is_killed(tiny_shards, tiny_teacher_dir,
                                                                                       tmp_path):
    """The same run started twice at once: the second waits, then finds it done; a holder SIGKILLed mid-run
    is taken over by its waiter, which resumes. Both end with the weights and complete metrics log of one
    uninterrupted run."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=5, checkpoint_interval=2)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(c)))
    reference = grow.train(c, tmp_path / "reference")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    for name, kill_first in (("together", False), ("killed", True)):
        run_dir = tmp_path / name
        first = start_run(config_file, run_dir)
        while logged_steps(run_dir) < 3:
            assert first.poll() is None, first.stderr.read().decode()[-2000:]
            time.sleep(0.01)
        if kill_first:
            first.send_signal(signal.SIGSTOP)  # held mid-run: it cannot finish before the kill
        second = start_run(config_file, run_dir)
        if kill_first:
            time.sleep(1.0)  # the second is waiting on the lock by now (or about to)
            first.send_signal(signal.SIGKILL)
        assert [p.wait() for p in (first, second)] == [-signal.SIGKILL if kill_first else 0, 0]
        assert json.loads((run_dir / "done.json").read_text()) == reference
        assert strip(rundir.read_metrics(run_dir)) == strip(rundir.read_metrics(tmp_path / "reference"))
        for p in range(3):
            a, b = phase_weights(tmp_path / "reference", p), phase_weights(run_dir, p)
            assert all(torch.equal(a[k], b[k]) for k in a), f"{name}: phase {p} differs"
        assert not list(tmp_path.glob(".*.lock"))


def test_damaged_run_files_are_one_line_errors_naming_the_file(tiny_shards, tiny_teacher_dir, tmp_path):
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", phase_steps=2)
    done = grow.train(c, tmp_path / "r")
    (tmp_path / "r" / "done.json").write_text('{"step": 2}')
    with pytest.raises(errors.TrainingError, match=r"done\.json: lacks ce, ppl, kd"):
        grow.train(c, tmp_path / "r")
    (tmp_path / "r" / "config.json").write_text("{not json")
    with pytest.raises(errors.TrainingError, match=r"r/config\.json: not valid JSON .*--force"):
        grow.train(c, tmp_path / "r")
    assert grow.train(c, tmp_path / "r", force=True) == done  # the kit's own damaged run is redone
    assert nets.perplexity(800.0) == math.inf and nets.perplexity(1.0) == pytest.approx(math.e)


def test_disk_full_while_checkpointing_says_so_and_resumes(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    import errno
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=3, checkpoint_interval=2)
    reference = grow.train(c, tmp_path / "reference")
    real = checkpoint.write_weights

    def full_disk(folder, *args, **kwargs):
        if Path(folder).name == "phase-1.tmp":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "write_weights", full_disk)
    with pytest.raises(errors.TrainingError, match=r"no space left on device while writing .*phase-1; the previous "
                                                 r"checkpoint .*latest is intact: free some space"):
        grow.train(c, tmp_path / "r")
    monkeypatch.setattr(checkpoint, "write_weights", real)  # space freed
    assert grow.train(c, tmp_path / "r") == reference


@pytest.mark.slow
def test_a_file_size_limit_while_checkpointing_says_so_and_resumes(tiny_shards, tiny_teacher_dir, tmp_path):
    """A real limit, not a mock: the run's process under `ulimit -f` (RLIMIT_FSIZE) too small for a
    checkpoint fails with one line naming the folder and the limit; rerun without it, it ends as an
    uninterrupted run."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=3, checkpoint_interval=2)
    reference = grow.train(c, tmp_path / "reference")
    script = ("import json, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY)); "
              "import config, grow; grow.train(config.RunConfig(**json.loads(sys.argv[1])), sys.argv[2])")
    limited = subprocess.run([sys.executable, "-c", script, json.dumps(asdict(c)), str(tmp_path / "r")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert limited.returncode != 0
    assert "a file-size limit (ulimit -f) was reached while writing" in limited.stderr.splitlines()[-1]
    assert grow.train(c, tmp_path / "r") == reference


# A run whose writer, midway through latest/ at step 6 (its weights written, its AdamW state not yet), waits for
# training to take step 7 and then SIGKILLs the process: a synchronous save could never see step 7 (it would time out).
KILLED_MID_WRITE = """
import json, os, signal, sys, threading
import checkpointing, config, grow
stepped = threading.Event()
def training_point(event, name, step=0):
    if event == "stepped" and step == 7:
        stepped.set()
def writer_point(event, name, step=0):
    if event == "writing-latest" and step == 6:
        assert threading.current_thread() is not threading.main_thread(), "latest/ was written on the training thread"
        assert stepped.wait(120), "no training step ran while latest/ was being written"
        print("step 7 ran while latest/ at step 6 was being written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
grow.kill_point, checkpointing.kill_point = training_point, writer_point
grow.train(config.RunConfig(**json.loads(sys.argv[1])), sys.argv[2])
"""


def test_a_step_runs_while_a_checkpoint_is_written_and_a_kill_then_leaves_the_previous_one(tiny_shards,
                                                                                           tiny_teacher_dir, tmp_path):
    """Checkpoints are written in the background: training takes step 7 while latest/ of step 6 is still being
    written, and a SIGKILL then leaves latest/ of step 3 in place, whole and matching its checksums; the rerun
    resumes and ends as an uninterrupted run."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    reference = grow.train(c, tmp_path / "reference")
    run_dir = tmp_path / "r"
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, json.dumps(asdict(c)), str(run_dir)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "step 7 ran while latest/ at step 6 was being written" in killed.stdout
    assert logged_steps(run_dir) == 7 and (run_dir / "latest.tmp").is_dir()  # the write it cut short
    assert json.loads((run_dir / "latest" / "trainer_state.json").read_text())["step"] == 3
    assert checkpoint.damage(run_dir / "latest") == "" and (run_dir / "latest" / checkpoint.CHECKSUMS).is_file()
    assert grow.train(c, run_dir) == reference
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert strip(rundir.read_metrics(run_dir)) == strip(rundir.read_metrics(tmp_path / "reference"))


def test_resume_reads_no_pickle(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    """latest/ is safetensors and JSON: a resume with every unpickling entry point disabled reaches the
    same result as an uninterrupted run."""
    import pickle
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    reference = grow.train(c, tmp_path / "reference")
    grow.train(c, tmp_path / "r", stop_after_step=7)  # a rolling checkpoint at step 6, mid phase 1
    latest = sorted(p.name for p in (tmp_path / "r" / "latest").iterdir())
    assert latest == sorted((*latest_files(1), checkpoint.CHECKSUMS))

    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    assert grow.train(c, tmp_path / "r") == reference
    a, b = phase_weights(tmp_path / "reference", 2), phase_weights(tmp_path / "r", 2)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_rolling_checkpoint_of_an_older_kit_is_one_line(tiny_shards, tiny_teacher_dir, tmp_path):
    """latest/ as older versions wrote it (DCP files, or gathered safetensors; no index, no checksums):
    one line, never unpickled."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", checkpoint_interval=2)
    grow.train(c, tmp_path / "r", stop_after_step=3)
    latest = tmp_path / "r" / "latest"
    for name in (checkpoint.CHECKSUMS, checkpoint.SHARDED_INDEX, *(p.name for p in latest.glob("*.safetensors"))):
        (latest / name).unlink()
    (latest / ".metadata").write_bytes(b"\x80\x04not read")
    (latest / "model.safetensors").write_bytes(b"\x80\x04not read either")
    with pytest.raises(errors.TrainingError, match=r"latest: lacks index.json .* move the folder"):
        grow.train(c, tmp_path / "r")


def test_a_damaged_newest_checkpoint_is_passed_over_for_an_older_one(tiny_shards, tiny_teacher_dir, tmp_path, capsys):
    """Every checkpoint carries checksums of its files: a latest/ whose weights changed on disk is named
    in a one-line warning and the run resumes from phase-0/ instead, to the uninterrupted result."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    reference = grow.train(c, tmp_path / "reference")
    grow.train(c, tmp_path / "r", stop_after_step=7)  # latest/ at step 6, phase-0/ at step 4
    weights = tmp_path / "r" / "latest" / "model.rank0-of-1.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in a tensor
    weights.write_bytes(bytes(data))
    assert grow.train(c, tmp_path / "r") == reference
    assert "latest: damaged (model.rank0-of-1.safetensors does not match its checksum); resuming from an older " \
        "checkpoint" \
        in capsys.readouterr().out
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert strip(rundir.read_metrics(tmp_path / "r")) == strip(rundir.read_metrics(tmp_path / "reference"))


# ---- corruption of each file kind, with fallback -------------------------------------------------

def flip_a_byte(file: Path):
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


DAMAGES = {"flipped": flip_a_byte, "truncated": lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
           "deleted": lambda f: f.unlink()}


@pytest.fixture(scope="module")
def stopped_run(tiny_shards, tiny_teacher_dir, tmp_path_factory):
    """(config, an uninterrupted run's folder and result, a run stopped at step 7: latest/ at step 6,
    phase-0/ at step 4)."""
    base = tmp_path_factory.mktemp("corruption")
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    reference = grow.train(c, base / "reference")
    grow.train(c, base / "stopped", stop_after_step=7)
    return c, base / "reference", reference, base / "stopped"


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", [*latest_files(1), checkpoint.CHECKSUMS])
def test_each_damaged_file_of_the_rolling_checkpoint_falls_back_to_the_same_result(stopped_run, tmp_path, capsys,
                                                                                  name, damage):
    """Any file of latest/ flipped, truncated or deleted: the run names latest/ in a one-line warning,
    resumes from phase-0/ and ends with the uninterrupted run's result and metrics. (A deleted
    checksums.json reads as a checkpoint from before checksums: its intact files are used, same result.)"""
    c, reference_dir, reference, stopped = stopped_run
    run_dir = tmp_path / "r"
    shutil.copytree(stopped, run_dir)
    DAMAGES[damage](run_dir / "latest" / name)
    assert grow.train(c, run_dir) == reference
    warnings = [line for line in capsys.readouterr().out.splitlines() if ": damaged (" in line]
    if (name, damage) == (checkpoint.CHECKSUMS, "deleted"):
        assert not warnings
    else:
        assert len(warnings) == 1 and warnings[0].startswith(f"{run_dir / 'latest'}: damaged (")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert strip(rundir.read_metrics(run_dir)) == strip(rundir.read_metrics(reference_dir))


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "trainer_state.json"])
def test_each_damaged_file_of_a_kept_checkpoint_is_refused_on_load(stopped_run, tmp_path, name, damage):
    """A kept checkpoint (what eval, export, sample and the diagnostics read) with any file changed is
    a one-line CheckpointError naming the folder, never a silently different model."""
    _, reference_dir, _, _ = stopped_run
    ckpt = tmp_path / "phase-1"
    shutil.copytree(reference_dir / "phase-1", ckpt)
    DAMAGES[damage](ckpt / name)
    with pytest.raises(errors.CheckpointError) as error:
        model.Student.load(ckpt)
    assert len(str(error.value).splitlines()) == 1 and str(ckpt) in str(error.value)


def test_with_latest_and_the_phase_checkpoint_damaged_a_snapshot_is_the_resume_point(tiny_shards, tiny_teacher_dir,
                                                                                    tmp_path, capsys):
    """step-<n>/ is a resume point of last resort: weights only, so the run says that AdamW's moments
    restart there, and finishes."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3,
                   snapshot_interval=2)
    grow.train(c, tmp_path / "r", stop_after_step=7)   # latest/ 6, step-6/ 6, phase-0/ 4, step-2/ 2
    flip_a_byte(tmp_path / "r" / "latest" / "model.rank0-of-1.safetensors")
    result = grow.train(c, tmp_path / "r")
    out = capsys.readouterr().out
    assert "latest: damaged (model.rank0-of-1.safetensors does not match its checksum)" in out
    assert "step-6 holds weights but no AdamW state; its moments restart at step 6" in out
    assert math.isfinite(result["ce"]) and (tmp_path / "r" / "done.json").is_file()
