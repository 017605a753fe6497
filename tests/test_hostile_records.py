"""Hostile records (issue 50 §1, §2, §4, §5; experiments/studies.py, experiments/record_files.py): a study's record is
a file people commit, copy and edit, so it is data, never a fact to believe. A record sealed again after an edit
restores only when its content is what the kit writes (tests/bad_records.py: each other edit is one line); a
copy, another study's record or a run's text with a line break never reaches a results page as a run of the
study; processes sharing a study restore and train it as one does; a killed record write leaves nothing that is
counted or committed; an unwritable --records-dir is said before anything trains. And §6: a lock file's pid is
data, never a traceback."""
import errno
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from bad_records import SHIPPED, placed, put, recorded

from experiments import record_files, studies
from plumbing import errors
from tests.conftest import repro_cli

ROOT = Path(__file__).resolve().parents[1]


def table1(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "repro.py"), "table1", "--scale", "smoke", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A finished smoke table1 (seed 42) in R/, its results in S/."""
    base = tmp_path_factory.mktemp("tree")
    out = table1("--runs-dir", base / "R", "--results-dir", base / "S")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return base


# ---- §1: a record sealed again is restored only as the kit wrote it -------------------------------------------

def test_a_record_sealed_again_unchanged_restores_and_gives_the_same_table(tree, tmp_path):
    """The bad-input table's records fail because of their edits: the same record, sealed again unchanged,
    restores s42/post-grow (no weights, its record named) and table1 is the one its trained run gave."""
    shutil.copytree(tree, tmp_path / "c")
    recorded(lambda record: None)(tmp_path / "c")
    out = table1("--runs-dir", tmp_path / "c" / "R", "--results-dir", tmp_path / "c" / "S2", "--records-dir",
                 tmp_path / "c" / "rec")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    folder = tmp_path / "c" / "R" / "smoke" / "s42" / "post-grow"
    assert (folder / studies.RECORD).is_file() and not list(folder.glob("phase-*"))
    read = lambda results: json.loads((results / "smoke" / "table1.json").read_text())
    assert read(tmp_path / "c" / "S2") == read(tree / "S")


def test_a_record_of_other_settings_is_stale_and_nothing_is_restored(tree, tmp_path):
    """config.lr 1.0 with its identity and sha256 recomputed: a record of other settings, named stale in the last
    line before anything is written from it (before: restored, then "another config" in its run folder)."""
    shutil.copytree(tree, tmp_path / "c")
    recorded(put("config", "lr", value=1.0))(tmp_path / "c")
    path = tmp_path / "c" / "rec" / "smoke" / "s42" / "post-grow.json"
    before = path.read_bytes()
    out = table1("--runs-dir", tmp_path / "c" / "R", "--results-dir", tmp_path / "c" / "S2", "--records-dir",
                 tmp_path / "c" / "rec")
    line = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert str(path) in line and "stale, the run's settings changed" in line
    assert not (tmp_path / "c" / "R" / "smoke" / "s42" / "post-grow").exists() and path.read_bytes() == before


# ---- §2: a record belongs to a study by its place alone; its text is escaped and bounded on a page ------------

def test_a_copy_or_another_studys_record_is_named_never_counted(tmp_path):
    records = tmp_path / "records"
    first = placed(records / "toy", "s42/pre-grow")
    assert len([line for line in studies.recorded_machines("toy", records) if line.startswith("| s42/")]) == 1
    shutil.copy(first, first.with_name("pre-grow copy.json"))  # before: counted and listed twice
    with pytest.raises(errors.TrainingError, match="pre-grow copy.json: its place is not that of the run it records"):
        studies.recorded_machines("toy", records)
    first.with_name("pre-grow copy.json").unlink()
    smoke = placed(tmp_path / "smoke-records" / "smoke", "s43/pre-grow")
    (records / "toy" / "s43").mkdir()
    shutil.copy(smoke, records / "toy" / "s43" / "pre-grow.json")
    with pytest.raises(errors.TrainingError, match=r"s43/pre-grow.json: its place .* \(smoke/s43/pre-grow.json\)"):
        studies.recorded_machines("toy", records)  # before: listed among the toy study's runs and machines


def test_a_records_text_reaches_a_page_escaped_and_bounded(tmp_path):
    """A run label with a line break, a | and a markdown heading (in its own place: the file's name holds them), and
    a CPU named by 4,000 characters: each row of the page is one line of five cells, each cell at most 200 characters;
    a CPU named by 20 MB of text is refused as it is read, naming the key (issue 59 §4)."""
    records = tmp_path / "records"
    placed(records / "toy", "s42/pre\n# Results are fake | x")
    huge = placed(records / "toy", "s43/pre-grow", lambda r: r["provenance"].update(cpu="A" * 20_000_000 + "\n|"))
    with pytest.raises(record_files.BadRecord, match="provenance.cpu is a text of 20,000,002 characters"):
        studies.recorded_machines("toy", records)
    placed(records / "toy", "s43/pre-grow", lambda r: r["provenance"].update(cpu="A" * 4000 + "\n|"))
    assert huge.stat().st_size < 100_000
    lines = studies.recorded_machines("toy", records)
    assert all("\n" not in line and len(line) < 600 for line in lines)
    assert not any(line.startswith("#") and "fake" in line for line in lines)
    rows = [line for line in lines if line.startswith("| s4")]
    assert len(rows) == 2 and all(line.replace("\\|", "").count("|") == 5 for line in rows), rows
    assert "s42/pre\\n# Results are fake \\| x" in rows[0]


# ---- §4: processes sharing a study ----------------------------------------------------------------------------

@pytest.mark.slow
def test_three_processes_restoring_and_training_one_study_give_what_one_gives(tmp_path):
    """Three `table1` of one study at once on a fresh clone (seed 42 recorded, 43 not; their seeds in different
    orders): each restores under the run folder's lock and skips what another restored or trained meanwhile
    (before: restoring took no lock, so one deleted another's folder mid-write). Every record and every table
    equals the one process's; no temporary file is left among the records. Twice."""
    common = ["--set", "run.precision=auto"]
    for seeds in ("42,43", "43,42"):  # a table lists its seeds in the order given: one process's, in either order
        one = table1("--seeds", seeds, "--runs-dir", tmp_path / "one", "--records-dir", tmp_path / "rec-one",
                     "--results-dir", tmp_path / f"one-results-{seeds}", *common)
        assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
    wanted = {p.relative_to(tmp_path / "rec-one"): json.loads(p.read_text()) for p in (tmp_path / "rec-one").rglob("*.json")}
    assert len(wanted) == 8
    kept = ("run", "workspace", "seed", "identity", "config", "done", "diagnostics")
    orders = ("42,43", "43,42", "42,43")
    table = lambda results: json.loads(next(results.rglob("table1.json")).read_text())
    for attempt in range(2):
        rec, runs = tmp_path / f"rec-{attempt}", tmp_path / f"runs-{attempt}"
        shutil.copytree(tmp_path / "rec-one", rec, ignore=lambda d, names: [n for n in names if n == "s43"])
        procs = [subprocess.Popen([sys.executable, str(ROOT / "repro.py"), "table1", "--scale", "smoke", "--seeds", seeds,
                                   "--runs-dir", str(runs), "--records-dir", str(rec), "--results-dir",
                                   str(tmp_path / f"results-{attempt}-{i}"), *common], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                 for i, seeds in enumerate(orders)]
        outs = [p.communicate(timeout=900) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
        got = {p.relative_to(rec): json.loads(p.read_text()) for p in rec.rglob("*.json")}
        assert got.keys() == wanted.keys() and not [p for p in rec.rglob("*") if p.name.endswith(".tmp")]
        for path, record in wanted.items():
            assert {k: got[path][k] for k in kept} == {k: record[k] for k in kept}, path
        for i, seeds in enumerate(orders):
            assert table(tmp_path / f"results-{attempt}-{i}") == table(tmp_path / f"one-results-{seeds}"), (attempt, i)


# ---- §5: a killed write leaves nothing counted or committed; an unwritable --records-dir is said first ------------

KILLED_WRITE = ("import json, os, signal, sys\nfrom pathlib import Path\nfrom experiments import record_files\n"
                "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # between the temporary file and its rename\n"
                "record_files.write_record(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))\n")


def test_a_record_write_killed_before_its_rename_leaves_nothing_counted_and_nothing_for_git(tmp_path):
    folder = tmp_path / "records" / "toy"
    first = placed(folder, "s42/pre-grow")
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(folder / "s42" / "post-grow.json"), str(SHIPPED)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    left = [p.name for p in (folder / "s42").iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".post-grow.json.")  # what a SIGKILL leaves
    assert [path for path, _ in studies.study_records(folder)] == [first]  # never counted
    live = folder / "s42" / f".pre-grow.json.{os.getpid()}.tmp"  # a write in progress, its process alive: kept
    live.write_text("{")
    record_files.write_record(folder / "s42" / "post-grow.json", json.loads(first.read_text()))
    assert sorted(p.name for p in (folder / "s42").iterdir()) == [live.name, "post-grow.json", "pre-grow.json"]


def test_an_unwritable_records_dir_is_one_line_before_anything_trains(tmp_path):
    """Before: the error came after every run had trained, naming a .tmp file of the records folder."""
    (tmp_path / "records").write_text("a file where the records go")
    out = repro_cli("table1", "--scale", "smoke", "--runs-dir", tmp_path / "runs", "--records-dir", tmp_path / "records",
                    check=False)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "--records-dir" in lines[0] and "not a folder" in lines[0]
    assert not (tmp_path / "runs" / "smoke").exists()  # no data, no teacher, no run


def test_a_dry_run_reads_records_it_could_not_write(tmp_path, monkeypatch):
    """A read-only clone may plan: a dry run only reads the records, so a records folder this user cannot write (as
    os.access says here: root writes anywhere, so the check is made to say so) stops the run, not its dry run."""
    read_only = lambda folder: (_ for _ in ()).throw(errors.OptionError("--records-dir", f"{folder} is read-only here"))
    monkeypatch.setattr(record_files, "check_writable", read_only)
    args = ["table1", "--scale", "toy", "--runs-dir", tmp_path / "runs", "--records-dir", tmp_path / "records"]
    planned = repro_cli(*args, "--dry-run")
    assert "to train" in planned.stdout or "remaining" in planned.stdout
    refused = repro_cli(*args, check=False)
    assert refused.returncode == 2 and "--records-dir" in refused.stderr and "read-only here" in refused.stderr
    assert not (tmp_path / "runs" / "toy").exists()


# ---- §6: a line where a traceback was due (a lock's holder) ---------------------------------------------------

def test_a_lock_holders_pid_no_process_can_have_is_no_process(tmp_path, monkeypatch):
    """A lock file's pid is data: 10**30 (before: an OverflowError in kill()), 0 or -1 (a process group) is no
    live holder; where flock works the wait for its holder ends in one line, where it does not it is taken over."""
    from plumbing import locks
    assert not any(locks.alive(pid) for pid in (10**30, 0, -1)) and locks.alive(os.getpid())
    folder = tmp_path / "run"
    lock = locks.lock_file(folder)
    record = lambda pid: json.dumps({"host": socket.gethostname(), "pid": pid, "since": "2026-01-02", "command": "x"})
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | "
                               "os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, sys.argv[2].encode())\n"
                               "print('held', flush=True)\ntime.sleep(600)\n", str(lock), record(10**30)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("NORMGROW_LOCK_WAIT", "0")
        with pytest.raises(errors.TrainingError, match="has not changed for 0 s"):
            with locks.held([folder], say=lambda line: None):
                pass
    finally:
        holder.kill()
        holder.wait()
    lock.unlink()
    monkeypatch.setattr(fcntl, "flock", lambda fd, operation: (_ for _ in ()).throw(OSError(errno.ENOSYS, "no flock")))
    monkeypatch.setattr(locks, "_FLOCKLESS", {locks.mount_of(tmp_path)})
    for pid in (10**30, 0, -1):
        lock.write_text(record(pid))
        said = []
        with locks.held([folder], wait=False, say=said.append):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert len(said) == 1 and "is gone" in said[0] and "taking it over" in said[0]
