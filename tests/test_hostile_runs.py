"""Hostile run folders (issue 34, causes 1-4; issue 30 item 7): what a lock file, a done.json or metrics.jsonl,
an extra file in a checkpoint, or a corpus that changes or is not a file can make the kit believe. Each case
ends in one line naming the file (a KitError, which repro.py prints as one line), or in the right numbers;
nothing the user owns is written to."""
import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import TINY_VOCAB, distil_config
from safetensors.torch import load_file, save_file

import checkpointing
import grow
import model
import rundir
from experiments import comparison, prepare_shards
from plumbing import checkpoint, corpora, errors, locks, tokenizer

ROOT = Path(__file__).resolve().parents[1]


# ---- cause 1: a lock file is the kit's own plain file, and what it holds is data ----------------------------

def held_by_us(lock: Path) -> bool:
    record = json.loads(lock.read_text())
    return (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())


def refused_lock(folder: Path, what: str):
    with pytest.raises(errors.TrainingError) as e:
        with locks.held([folder], wait=False):
            pass
    line = str(e.value)
    assert "\n" not in line and str(locks.lock_file(folder)) in line and what in line and "remove it" in line
    return line


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_at_a_lock_path_is_refused_and_its_target_never_written(tmp_path, dangling):
    """Before: the lock code truncated the file the link points to and wrote its holder line into it."""
    folder, users = tmp_path / "runs" / "s42" / "pre-grow", tmp_path / "users-notes.txt"
    if not dangling:
        users.write_text("my notes\n")
    folder.parent.mkdir(parents=True)
    locks.lock_file(folder).symlink_to(users)
    refused_lock(folder, "a symbolic link")
    assert (users.read_text() == "my notes\n") if not dangling else not users.exists()


@pytest.mark.parametrize("kind", ["folder", "fifo", "hard link", "socket"])
def test_a_lock_path_that_is_not_a_plain_file_of_its_own_is_one_line(tmp_path, kind):
    """A folder (before: IsADirectoryError), a FIFO (before: taken as the lock, then deleted), a hard link
    to a user's file (before: truncated and written), a socket."""
    folder, users = tmp_path / "data", tmp_path / "users-notes.txt"
    lock = locks.lock_file(folder)
    users.write_text("my notes\n")
    if kind == "folder":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(lock))
    else:
        os.link(users, lock)
    refused_lock(folder, {"folder": "a folder", "fifo": "a FIFO", "hard link": "a hard link",
                          "socket": "not a plain file"}[kind])
    assert users.read_text() == "my notes\n" and os.path.lexists(lock)  # nothing of the user's removed either


def test_a_stale_lock_file_is_replaced_never_written_into(tmp_path):
    """A lock file left behind (its holder killed, or put there by someone): taken over by making a new one,
    so the kit never truncates or writes a file it did not create."""
    folder = tmp_path / "run"
    lock = locks.lock_file(folder)
    lock.write_text("someone else's text")
    with open(lock) as old:  # the stale file's own inode, as its maker sees it
        with locks.held([folder]):
            assert held_by_us(lock)
            assert os.fstat(old.fileno()).st_ino != os.stat(lock).st_ino
        assert Path(f"/proc/self/fd/{old.fileno()}").read_text() == "someone else's text"
    assert not lock.exists()


FORGED = "x\nError: forged second line\x1b[31m" + "y" * 1000  # past the 300 characters shown, within the 4 KiB read


@pytest.mark.parametrize("forged", ["process 1 on h (" + FORGED, json.dumps(dict(host="h", pid=1, since="", command=FORGED)),
                                    "[" * 4000])
def test_a_holder_line_names_the_host_and_is_printed_as_one_line_of_data(tmp_path, forged):
    """A forged holder line or record with a newline, an "Error:" and terminal escapes is shown escaped,
    bounded, on the kit's one line (before: printed raw, a second "Error:" line); JSON nested too deep for
    the parser is shown as text."""
    folder = tmp_path / "run"
    with locks.held([folder]):
        lock = locks.lock_file(folder)
        assert held_by_us(lock)
        lock.write_text(forged)
        with pytest.raises(errors.TrainingError) as e:
            with locks.held([folder], wait=False):
                pass
    line = str(e.value)
    assert "\n" not in line and "\x1b" not in line and len(line) < 600
    assert forged.startswith("[") or ("\\nError: forged" in line and "\\x1b[31m" in line)


def test_where_flock_is_unsupported_an_exclusive_lock_file_holds_the_folder(tmp_path, monkeypatch):
    """Lustre or NFS without flock (ENOSYS; issue 30 item 7): one line naming the mount, then the lock file's
    existence is the lock: a second holder is refused naming the first's pid and host, a holder gone from
    this host is taken over, one on another host is refused naming the file to remove."""
    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(locks, "_FLOCKLESS", set())
    folder, said = tmp_path / "run", []
    lock = locks.lock_file(folder)
    with locks.held([folder, tmp_path / "data"], say=said.append):  # one line for the mount, not per folder
        assert len(said) == 1 and "does not support flock" in said[0] and locks.mount_of(tmp_path) in said[0]
        assert held_by_us(lock)
        with pytest.raises(errors.TrainingError, match=f"in use by process {os.getpid()} on {socket.gethostname()}"):
            with locks.held([folder], wait=False, say=said.append):
                pass
    assert not lock.exists()
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    lock.write_text(lock_record(socket.gethostname(), dead))
    with locks.held([folder], wait=False, say=said.append):  # its holder is gone: stale, taken over
        assert held_by_us(lock)
    lock.write_text("process 7 on another-node-17 (repro.py train)")
    with pytest.raises(errors.TrainingError, match=f"another-node-17.*remove {lock}"):
        with locks.held([folder], wait=False, say=said.append):
            pass
    assert lock.read_text() == "process 7 on another-node-17 (repro.py train)"
    lock.unlink()
    got, holding = [], []

    def wait_for_it():
        holding.append(locks.held([folder], say=got.append))
        holding[0].__enter__()
    with locks.held([folder], say=said.append):  # a waiter polls until the holder removes its file
        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        waiter.join(timeout=1.5)
        assert waiter.is_alive() and len(got) == 1 and "waiting for it" in got[0] and str(lock) in got[0]
    waiter.join(timeout=5)
    assert not waiter.is_alive() and held_by_us(lock)  # the waiter holds it
    holding[0].__exit__(None, None, None)
    assert not lock.exists()


# ---- a requeue on another node: the lock a job left on the shared filesystem ------------------------------

def lock_record(host: str, pid: int) -> str:
    """A lock file as the kit writes it (JSON: who holds the folder and since when), written by hand."""
    return json.dumps({"host": host, "pid": pid, "since": "2026-01-02T03:04:05+00:00", "command": "repro.py all"})


FLOCK_AS = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, sys.argv[2].encode())\nprint('held', flush=True)\n"
            "time.sleep(600)\n")


def no_flock(fd, operation):
    raise OSError(errno.ENOSYS, "Function not implemented")


def hold_in_thread(folder: Path, said: list) -> tuple[threading.Thread, list]:
    outcome = []

    def hold():
        try:
            with locks.held([folder], say=said.append):
                outcome.append("held")
        except errors.TrainingError as e:
            outcome.append(str(e))
    waiter = threading.Thread(target=hold, daemon=True)
    waiter.start()
    return waiter, outcome


@pytest.mark.parametrize("flock", [True, False])
def test_a_lock_of_a_job_on_another_host_is_given_up_after_the_stated_wait(tmp_path, monkeypatch, flock):
    """A requeued job finds the lock its predecessor, killed on another node, left on the shared filesystem:
    the file with its flock still held (an NFS server keeps a crashed client's lock) or, without flock, the
    file itself. After NORMGROW_LOCK_WAIT seconds (2 here) it stops in one line naming the holder's host,
    pid and start and the fix, and leaves the file. Before: it waited forever (this test's thread hung)."""
    folder, said = tmp_path / "run", []
    lock, record = locks.lock_file(folder), lock_record("node-b", 4242)
    monkeypatch.setenv("NORMGROW_LOCK_WAIT", "2")
    holder = None
    if flock:  # a process of this host holds the flock, its record naming another host, as NFS's server would
        holder = subprocess.Popen([sys.executable, "-c", FLOCK_AS, str(lock), record], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
    else:
        monkeypatch.setattr(fcntl, "flock", no_flock)
        lock.write_text(record)
    try:
        waiter, outcome = hold_in_thread(folder, said)
        waiter.join(timeout=60)
        assert not waiter.is_alive(), f"still waiting 60 s past NORMGROW_LOCK_WAIT=2: {said}"
    finally:
        if holder:
            holder.kill()
    line = outcome[0]
    assert "\n" not in line and "held by process 4242 on node-b since 2026-01-02T03:04:05+00:00 (repro.py all)" in line
    assert "2 s" in line and f"remove {lock}" in line and "NORMGROW_LOCK_WAIT=forever" in line
    assert lock.read_text() == record  # the other job's file is left as it was


HEARTBEAT_AS = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, sys.argv[2].encode())\nprint('held', flush=True)\n"
                "while not os.path.exists(sys.argv[3]):\n    os.utime(fd)\n    time.sleep(0.1)\ntime.sleep(600)\n")


def test_a_holder_on_another_host_is_waited_for_while_its_heartbeat_goes_on(tmp_path, monkeypatch):
    """A job at work on another node (a teacher pretrained for hours) touches its lock file: waited for past
    NORMGROW_LOCK_WAIT (1 s here) as long as it does; once it stops (its node died holding the NFS lock),
    given up 1 s later in the same one line. Before: given up 1 s after the wait began, at work or not."""
    folder, said, stop = tmp_path / "run", [], tmp_path / "stop"
    lock = locks.lock_file(folder)
    monkeypatch.setenv("NORMGROW_LOCK_WAIT", "1")
    holder = subprocess.Popen([sys.executable, "-c", HEARTBEAT_AS, str(lock), lock_record("node-b", 4242), str(stop)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter, outcome = hold_in_thread(folder, said)
        waiter.join(timeout=4)
        assert waiter.is_alive() and outcome == [], outcome  # 4 s past the start, 3 past the stated wait
        stop.touch()
        waiter.join(timeout=60)
        assert not waiter.is_alive(), f"still waiting 60 s after the heartbeat stopped: {said}"
    finally:
        holder.kill()
    assert "held by process 4242 on node-b" in outcome[0] and "has not changed for 1 s" in outcome[0]


def test_a_holder_touches_its_lock_file_while_it_holds_it(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "HEARTBEAT_SECONDS", 0.05)
    folder = tmp_path / "run"
    lock = locks.lock_file(folder)
    with locks.held([folder]):
        stamps = {lock.stat().st_mtime_ns}
        for _ in range(40):  # 2 s at most: 40 heartbeats' time
            time.sleep(0.05)
            stamps.add(lock.stat().st_mtime_ns)
        assert len(stamps) > 1 and held_by_us(lock)  # touched, its record untouched
    assert not lock.exists()


@pytest.mark.parametrize("flock", [True, False])
def test_a_lock_of_a_process_gone_from_this_host_is_taken_over_saying_so(tmp_path, monkeypatch, flock):
    folder, said = tmp_path / "run", []
    lock = locks.lock_file(folder)
    if not flock:
        monkeypatch.setattr(fcntl, "flock", no_flock)
        monkeypatch.setattr(locks, "_FLOCKLESS", {locks.mount_of(tmp_path)})
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    lock.write_text(lock_record(socket.gethostname(), dead))
    with locks.held([folder], wait=False, say=said.append):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert len(said) == 1 and f"process {dead} on {socket.gethostname()} since 2026-01-02T03:04:05" in said[0]
    assert "is gone" in said[0] and "taking it over" in said[0]


def test_a_live_holder_on_this_host_is_waited_for_past_the_stated_wait(tmp_path, monkeypatch):
    """A holder this host sees alive is a job at work (two experiments sharing a teacher): waited for."""
    folder, said = tmp_path / "run", []
    monkeypatch.setenv("NORMGROW_LOCK_WAIT", "0.5")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom plumbing import locks\n"
                               "with locks.held([sys.argv[1]]):\n    print('held', flush=True)\n    time.sleep(600)\n",
                               str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter, outcome = hold_in_thread(folder, said)
        waiter.join(timeout=3)
        assert waiter.is_alive() and outcome == [] and f"process {holder.pid} on {socket.gethostname()}" in said[0]
    finally:
        holder.kill()
    waiter.join(timeout=30)
    assert outcome == ["held"]


# ---- cause 2: every JSON number is finite; done.json agrees with its run and with what a CE can be ---------

@pytest.mark.parametrize("text", ["1e999", "-1e999", '{"ce": 1e400}', "[1, NaN]", '{"x": Infinity}'])
def test_no_json_read_by_the_kit_yields_a_non_finite_number(text):
    with pytest.raises(ValueError, match="finite"):
        checkpoint.loads(text)
    assert checkpoint.loads("[1e308, -2.5e-320, 12345678901234567890]") == [1e308, -2.5e-320, 12345678901234567890]


@pytest.fixture(scope="module")
def finished(tiny_shards, tiny_teacher_dir, tmp_path_factory) -> Path:
    """A finished two-phase grow run (2 steps a phase) of the tiny student."""
    run = tmp_path_factory.mktemp("finished") / "run"
    grow.train(distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=2, blocks=2), run)
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


def edit(file: Path, **values):
    file.write_text(json.dumps({**json.loads(file.read_text()), **values}))


def test_an_untouched_done_json_is_what_its_last_evaluation_logged(run):
    result = rundir.final_eval(run)
    last = [r for r in rundir.read_metrics(run) if r.get("eval")][-1]
    assert result["ce"] == last["ce"] and result["step"] == last["step"] == 4
    assert 0 < result["ce"] < math.log(TINY_VOCAB + 1) + 1


@pytest.mark.parametrize("ce, why", [("logged - 0.3", "but the run's last evaluation"), ("-3.0", "cross-entropy"),
                                     ("1e999", "out of a float's range"), ("'5.0'", "not a number"),
                                     ("logged * (1 + 1e-5)", "but the run's last evaluation")])
def test_a_done_json_edited_by_hand_is_refused_in_one_line(run, ce, why):
    """Before: used as it is (5.3879 -> 5.0 in band; -3.0 in a table; 1e999 an inf in a table, exit 0)."""
    logged = rundir.final_eval(run)["ce"]
    value = eval(ce, {"logged": logged})
    if value == 1e999:
        (run / "done.json").write_text((run / "done.json").read_text().replace(repr(logged), "1e999"))
    else:
        edit(run / "done.json", ce=value)
    with pytest.raises(errors.TrainingError) as e:
        rundir.final_eval(run)
    assert str(run / "done.json") in str(e.value) and why in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(errors.TrainingError):
        comparison.run_numbers(run)  # compare's numbers: never a band check of an edited number


@pytest.mark.parametrize("key, change", [("ppl", lambda v: v * 0.9), ("kd", lambda v: v + 0.01), ("step", lambda v: v - 1)])
def test_any_number_of_done_json_that_differs_from_the_log_is_refused(run, key, change):
    edit(run / "done.json", **{key: change(rundir.final_eval(run)[key])})
    with pytest.raises(errors.TrainingError, match=f"done.json: {key} .*, but the run's last evaluation"):
        rundir.final_eval(run)


def test_a_done_json_without_an_evaluation_in_its_log_is_refused(run):
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rundir.read_metrics(run)
                                               if not r.get("eval")))
    with pytest.raises(errors.TrainingError, match="done.json: the run's metrics.jsonl holds no evaluation"):
        rundir.final_eval(run)


def test_done_json_and_metrics_edited_alike_still_cannot_exceed_what_a_cross_entropy_can_be(run):
    """An edit of both files to the same number is caught by the bounds: 0 <= CE <= log V + the run's margin
    above a uniform prediction (diverged_above_uniform, 1 by default; past it the run is recorded as diverged)."""
    rows, log_v = rundir.read_metrics(run), math.log(TINY_VOCAB + 1)

    def both(value):
        (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "ce": value} if r.get("eval") else r) + "\n"
                                                   for r in rows))
        edit(run / "done.json", ce=value)
    both(log_v + 0.5)
    assert rundir.final_eval(run)["ce"] == log_v + 0.5
    both(log_v + 1.5)
    with pytest.raises(errors.TrainingError, match="log V \\+ 1 = 7.2"):
        rundir.final_eval(run)
    edit(run / "config.json", diverged_above_uniform=2.0)
    assert rundir.final_eval(run)["ce"] == log_v + 1.5
    both(log_v + 2.5)
    with pytest.raises(errors.TrainingError, match="log V \\+ 2 = 8.2"):
        rundir.final_eval(run)


def test_a_diverged_run_s_null_numbers_are_an_outcome(run):
    edit(run / "done.json", ce=None, ppl=None, kd=None, diverged={"step": 4, "why": "non-finite"})
    assert rundir.final_eval(run)["diverged"]["step"] == 4


def test_a_torn_line_in_a_finished_run_s_log_is_reported_with_its_line_number(run):
    """Before: the row was dropped without a word (compare counted 27 of 27, not 28 of 28)."""
    text = (run / "metrics.jsonl").read_text()
    lines = len(text.splitlines())
    (run / "metrics.jsonl").write_text(text[:-20])
    with pytest.raises(errors.TrainingError, match=f"metrics.jsonl:{lines}: cut short"):
        comparison.measured(run)
    (run / "metrics.jsonl").write_text(text.replace("\n", "\n{\"step\": 3, \"lo\n", 1))  # not the last line
    with pytest.raises(errors.TrainingError, match="metrics.jsonl:2: cut short"):
        rundir.read_metrics(run)
    (run / "metrics.jsonl").write_text(text + "3\n")
    with pytest.raises(errors.TrainingError, match=f"metrics.jsonl:{lines + 1}: not a row the kit writes"):
        rundir.read_metrics(run)


def test_the_last_evaluation_is_read_from_the_log_s_tail_and_a_damaged_line_there_named_by_its_number(run):
    """final_eval reads metrics.jsonl a block (64 KiB) from its end at a time: an evaluation behind more than
    a block of rows is found, and a damaged line between is named by its number in the whole file."""
    rows = rundir.read_metrics(run)
    result, evaluated = rundir.final_eval(run), max(i for i, r in enumerate(rows) if r.get("eval")) + 1
    filler = [json.dumps({"step": rows[-1]["step"], "note": "x" * 100}) + "\n"] * 1000  # ~120 KB of rows
    lines = [json.dumps(r) + "\n" for r in rows]
    (run / "metrics.jsonl").write_text("".join(lines[:evaluated] + filler + lines[evaluated:]))
    assert rundir.final_eval(run) == result
    (run / "metrics.jsonl").write_text("".join(lines[:evaluated] + ['{"step": 3, "lo\n'] + filler + lines[evaluated:]))
    with pytest.raises(errors.TrainingError, match=f"metrics.jsonl:{evaluated + 1}: cut short"):
        rundir.final_eval(run)


def test_a_torn_last_line_of_an_unfinished_run_is_what_a_kill_leaves_and_its_resume_drops(run):
    (run / "done.json").unlink()
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text + '{"step": 5, "pha')
    assert rundir.read_metrics(run) == [json.loads(line) for line in text.splitlines()]


# ---- cause 3: a checkpoint folder is what its checksums list ------------------------------------------------

def plant_index(folder: Path, weights: dict):
    """An index and a weights file the checksums do not list: the loader used to prefer the index."""
    save_file(weights, folder / "other.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: "other.safetensors"
                                                                                    for k in weights}}))


def test_an_index_added_to_a_teacher_folder_is_refused_naming_it(tmp_path):
    """The shipped teacher with an index to other weights: before, prepare said "checksums verified" and the
    teacher's CE was 10.80 (its own: 3.0496); now `prepare`'s check and every load refuse it in one line."""
    teacher = Path(shutil.copytree(ROOT / "teachers" / "toy", tmp_path / "toy"))
    weights = {k: torch.zeros_like(v) for k, v in load_file(teacher / "phase-0" / "model.safetensors").items()}
    plant_index(teacher / "phase-0", weights)
    assert checkpoint.damage(teacher) == ""
    assert checkpoint.damage(teacher / "phase-0").startswith("model.safetensors.index.json is not one of its files")
    with pytest.raises(errors.CheckpointError, match="phase-0: damaged \\(model.safetensors.index.json is not one"):
        model.load_qwen3(teacher / "phase-0")
    (teacher / "phase-0" / "model.safetensors.index.json").unlink()
    with pytest.raises(errors.CheckpointError, match="other.safetensors is not one of its files"):
        model.load_qwen3(teacher / "phase-0")
    (teacher / "phase-0" / "other.safetensors").unlink()
    (teacher / "notes.txt").write_text("mine")  # the run folder's own checksums list no notes either
    assert checkpoint.damage(teacher).startswith("notes.txt is not one of its files")


def test_an_index_added_to_a_student_checkpoint_is_refused_by_eval_and_resume(run):
    """A student's phase-1/ given another run's weights through an index (before: eval reported them)."""
    ckpt = run / "phase-1"
    plant_index(ckpt, {k: v + 1 for k, v in load_file(ckpt / "model.safetensors").items()})
    with pytest.raises(errors.CheckpointError, match="model.safetensors.index.json is not one of its files"):
        model.Student.load(ckpt)
    warned = []
    found = checkpointing.newest_checkpoint(run, verify=True, warn=warned.append)
    assert found[0].name == "phase-0" and len(warned) == 1 and "phase-1: damaged (model.safetensors.index" in warned[0]


def test_a_kill_s_temporary_file_in_a_checkpoint_is_not_an_extra_file(run):
    (run / "phase-1" / ".config.json.4242.tmp").write_text("{")  # write_atomic's, left by a kill
    assert checkpoint.damage(run / "phase-1") == ""
    model.Student.load(run / "phase-1")


# ---- cause 4: a corpus is hashed from the bytes that are tokenized, and is a regular file --------------------

@pytest.fixture(scope="module")
def enc():
    return tokenizer.qwen3_tokenizer(vocab_size=TINY_VOCAB)


def jsonl(texts) -> str:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts)


def test_a_corpus_edited_while_prepare_runs_gives_shards_of_the_text_it_hashed(tmp_path, enc, monkeypatch):
    """Before: the manifest named the old content's sha256 while the shards held the edited text, and once
    the file was restored the rerun reused those shards."""
    corpus = tmp_path / "corpus.jsonl"
    original = [f"document number {i} of the original corpus" for i in range(12)]
    corpus.write_text(jsonl(original))
    made = corpora.corpus

    def edited_after_hashing(*args, **options):
        built = made(*args, **options)
        corpus.write_text(jsonl(t.replace("original", "EDITED") for t in original))
        return built
    monkeypatch.setattr(corpora, "corpus", edited_after_hashing)
    train, val = prepare_shards.prepare("local", tmp_path / "shards", enc, max_len=64, n_train_docs=None, n_val_docs=2,
                                        workers=1, progress=False, path=str(corpus))
    texts = [enc.decode(s.document(i)[1:-1].tolist()) for s in (val, train) for i in range(len(s))]
    assert sorted(texts) == sorted(original)  # the text the manifest's sha256 names
    hashed = hashlib.sha256(b"corpus.jsonl\0" + jsonl(original).encode()).hexdigest()
    assert train.manifest["corpus"]["sha256"] == val.manifest["corpus"]["sha256"] == hashed


def test_a_parquet_corpus_changed_while_it_was_read_leaves_no_shard(tmp_path, enc, monkeypatch):
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": [f"row {i} of the table" for i in range(12)]}), corpus)
    made = corpora.corpus

    def edited_after_hashing(*args, **options):
        built = made(*args, **options)
        pq.write_table(pa.table({"text": [f"row {i} CHANGED" for i in range(12)]}), corpus)
        return built
    monkeypatch.setattr(corpora, "corpus", edited_after_hashing)
    with pytest.raises(errors.DataError, match="changed while they were read"):
        prepare_shards.prepare("local", tmp_path / "shards", enc, max_len=64, n_train_docs=None, n_val_docs=2, workers=1,
                               progress=False, path=str(corpus))
    assert not (tmp_path / "shards" / "val").exists()


@pytest.mark.parametrize("layout", ["data.path", "in a folder", "a device in a folder"])
def test_a_fifo_as_a_corpus_is_one_line_not_a_hang(tmp_path, layout):
    """Before: reading data.path blocked forever on the FIFO (and hashed /dev/zero without end)."""
    fifo = tmp_path / "corpus.jsonl" if layout == "data.path" else tmp_path / "texts" / "b.txt"
    fifo.parent.mkdir(exist_ok=True)
    if layout != "data.path":
        (fifo.parent / "a.txt").write_text("a regular document")
    fifo.symlink_to("/dev/zero") if layout.startswith("a device") else os.mkfifo(fifo)
    outcome = []

    def build():
        try:
            corpora.corpus("local", 0, path=str(fifo if layout == "data.path" else fifo.parent))
            outcome.append("built")
        except errors.DataError as e:
            outcome.append(str(e))
    worker = threading.Thread(target=build, daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive() and not layout.startswith("a device"):  # release the hung reader, so the test ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=5)
    assert outcome and f"{fifo}: not a regular file" in outcome[0] and "\n" not in outcome[0]


def test_prepare_refuses_to_install_a_shipped_teacher_with_an_extra_index(tmp_path, monkeypatch):
    """`prepare`'s install of the shipped teacher: before, "installed the shipped one (checksums verified)"."""
    from experiments import presets, suite
    from plumbing import devices
    shipped = tmp_path / "kit"
    teacher = Path(shutil.copytree(ROOT / "teachers" / "toy", shipped / "teachers" / "toy"))
    plant_index(teacher / "phase-0", {k: torch.zeros_like(v) for k, v in
                                      load_file(teacher / "phase-0" / "model.safetensors").items()})
    monkeypatch.setattr(suite, "SHIPPED_ROOT", shipped)
    ws = suite.Workspace(presets.PRESETS["toy"], tmp_path / "runs" / "toy", tmp_path / "results", devices.Dist())
    with pytest.raises(errors.CheckpointError, match="phase-0: the shipped teacher is damaged \\(model.safetensors.index"):
        suite.install_shipped_teacher(ws)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kind", ["symlink", "folder"])
def test_the_cli_says_one_line_for_a_bad_data_lock(tmp_path, kind):
    """The data lock (`repro.py data`) as the run locks: one line, exit 1, the link's target untouched."""
    from conftest import repro_cli
    lock, users = tmp_path / "R" / "smoke" / ".data.lock", tmp_path / "users-notes.txt"
    lock.parent.mkdir(parents=True)
    users.write_text("my notes\n")
    lock.symlink_to(users) if kind == "symlink" else lock.mkdir()
    out = repro_cli("data", "--scale", "smoke", "--runs-dir", tmp_path / "R", check=False)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and out.stderr.startswith(f"Error: {lock}: the lock file")
    assert users.read_text() == "my notes\n" and not (tmp_path / "R" / "smoke" / "data").exists()


def test_an_atomic_write_never_writes_through_a_link_planted_at_its_temporary_name(tmp_path):
    """A symlink at `.<name>.<pid>.tmp` (anyone who can write to a run folder can plant one) is removed,
    not followed: the user's file it points to keeps its bytes, and the target gets the content."""
    import os

    from plumbing import checkpoint
    users = tmp_path / "users-notes.txt"
    users.write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    (run / f".done.json.{os.getpid()}.tmp").symlink_to(users)
    checkpoint.write_json(run / "done.json", {"ce": 3.5})
    assert users.read_text() == "mine"
    assert checkpoint.loads((run / "done.json").read_text()) == {"ce": 3.5}
    assert sorted(p.name for p in run.iterdir()) == ["done.json"]
