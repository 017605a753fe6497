"""Studies that outlive their machine (issue 38; experiments/studies.py): the ideas study at smoke scale run
in one go, and split over two fresh runs folders (as two fresh clones on two machines are: only the committed
records pass between them), give identical tables; a record edited by hand, or stale, stops the study in one
line before anything trains; a fresh folder with every record rebuilds the tables without training."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import record_files, studies
from plumbing import errors

ROOT = Path(__file__).resolve().parents[1]


def sealed(record: dict) -> dict:
    return {**record, "sha256": record_files.digest({k: v for k, v in record.items() if k != "sha256"})}


def test_a_record_reads_back_only_as_written(tmp_path):
    """read_record: the record's own sha256 over its canonical JSON; one changed number is refused."""
    path = tmp_path / "toy" / "s42" / "pre-grow.json"
    path.parent.mkdir(parents=True)
    shutil.copy(studies.RECORDS_DIR / "toy" / "s42" / "pre-grow.json", path)
    record = json.loads(path.read_text())
    assert studies.read_record(path) == record
    path.write_text(json.dumps({**record, "done": {**record["done"], "ce": 3.24}}))
    with pytest.raises(errors.TrainingError, match="does not match its sha256"):
        studies.read_record(path)


def test_the_config_hash_ignores_fields_at_their_default_and_observers_only():
    """A field added to RunConfig later, at its default, leaves every record valid; a setting that trains
    differently does not; the monitor's thresholds only observe."""
    base = {"name": "pre-grow", "lr": 6e-3, "seed": 42, "relative_to_run": True}
    hashed = lambda settings: record_files.digest(record_files.training_settings(settings))
    digest = hashed(base)
    assert hashed({**base, "append_init": "default", "monitor_interval": 25}) == digest
    assert hashed({**base, "append_init": "matched"}) != digest
    assert hashed({**base, "lr": 6.1e-3}) != digest


def test_a_record_keeps_evaluations_events_and_each_phases_last_step():
    rows = [{"step": 0, "phase": 0, "eval": True, "ce": 9.0}, {"step": 1, "phase": 0, "loss": 5.0},
            {"step": 2, "phase": 0, "loss": 4.0, "time": 2.0}, {"step": 2, "phase": 0, "eval": True, "ce": 4.5},
            {"step": 2, "event": "transition", "block": 1}, {"step": 3, "phase": 1, "loss": 3.0, "time": 3.0},
            {"step": 3, "monitor": True, "boundaries": []}]
    assert studies.kept_rows(rows) == [rows[0], rows[2], rows[3], rows[4], rows[5], rows[6]]


def ideas(runs: Path, records: Path, results: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`repro.py ideas` at smoke scale, seed 42, one thread, each run apart (so each is recorded as it finishes)."""
    return subprocess.run([sys.executable, str(ROOT / "repro.py"), "ideas", "--scale", "smoke", "--no-lockstep",
                           "--runs-dir", str(runs), "--records-dir", str(records), "--results-dir", str(results),
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def tables(results: Path) -> dict:
    """The ideas report's numbers: everything but where and how long each run took."""
    out = json.loads((results / "smoke" / "ideas.json").read_text())
    return {k: v for k, v in out.items() if k != "machines"}


def student_folders(runs: Path) -> list[Path]:
    return sorted(p for p in (runs / "smoke").rglob("done.json") if p.parent.name != "teacher")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """(one go, split) folders: the study in one go; then split: the first part killed as the suite's
    pre-freeze opens (the search and the suite's grow runs recorded, pre-freeze's grow prefix among them),
    the second part in a fresh runs folder with only the first part's records."""
    base = tmp_path_factory.mktemp("studies")
    whole = ideas(base / "whole-runs", base / "whole-records", base / "whole-results")
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    first = ideas(base / "first-runs", base / "records", base / "first-results",
                  env={"NORMGROW_KILL_AT": "opened:pre-freeze:8"})
    assert first.returncode == -9, first.stdout[-3000:] + first.stderr[-3000:]  # SIGKILLed where asked
    second = ideas(base / "second-runs", base / "records", base / "second-results")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    return base, first, second


@pytest.mark.slow
def test_a_study_split_over_two_fresh_folders_gives_the_tables_of_one_go(study):
    base, first, second = study
    recorded_first = [p for p in (base / "records").rglob("*.json")]
    assert tables(base / "second-results") == tables(base / "whole-results")
    # the first part recorded the search's 8 runs and some of the suite's before it was killed; the second
    # trained the rest and pre-grow again (pre-freeze's prefix: a record keeps no weights), keeping its record
    said = " ".join(second.stdout.split())
    for grow_run in ("pre-grow", "post-grow"):  # the prefixes of the suite's and the variants' freeze runs
        assert f"s42/{grow_run}: recorded without weights; trained again as the prefix" in said
    assert len(recorded_first) == len(list((base / "whole-records").rglob("*.json")))
    for path in (base / "whole-records").rglob("*.json"):
        split = json.loads((base / "records" / path.relative_to(base / "whole-records")).read_text())
        one = json.loads(path.read_text())
        assert one["done"] == split["done"] and one["diagnostics"] == split["diagnostics"], path
        assert one["identity"] == split["identity"]


@pytest.mark.slow
def test_a_fresh_folder_with_every_record_trains_nothing(study, tmp_path):
    base, _, _ = study
    dry = ideas(tmp_path / "runs", base / "records", tmp_path / "results", "--dry-run")
    assert dry.returncode == 0 and "remaining: 0 runs" in dry.stdout, dry.stdout[-2000:]
    done = ideas(tmp_path / "runs", base / "records", tmp_path / "results")
    assert done.returncode == 0, done.stderr[-2000:]
    assert tables(tmp_path / "results") == tables(base / "whole-results")
    # every student folder was restored from its record: none holds a checkpoint
    assert all(not any(f.name.startswith(("phase-", "latest")) for f in p.parent.iterdir())
               for p in student_folders(tmp_path / "runs"))


def edited(records: Path, tmp: Path, change, reseal: bool) -> Path:
    """A copy of the records with one changed by `change`; resealed (its sha256 recomputed: a record of other
    settings) or not (an edit by hand)."""
    copy = tmp / "records"
    shutil.copytree(records, copy)
    path = copy / "smoke" / "s42" / "post-grow.json"
    record = json.loads(path.read_text())
    change(record)
    if reseal:
        record["sha256"] = record_files.digest({k: v for k, v in record.items() if k != "sha256"})
    path.write_text(json.dumps(record))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("change, reseal, says", [
    (lambda r: r["done"].update(ce=r["done"]["ce"] - 0.1), False, "does not match its sha256 (edited by hand"),
    (lambda r: r["identity"].update(config_sha256=record_files.digest(record_files.training_settings(
        r["config"].update(lr=2 * r["config"]["lr"]) or r["config"]))), True, "stale, the run's settings changed"),
    (lambda r: r["identity"]["data"].update(train="0" * 64), True, "stale, the data's shards changed"),
], ids=["edited", "stale-config", "stale-data"])
def test_an_edited_or_stale_record_stops_the_study_in_one_line(study, tmp_path, change, reseal, says):
    base, _, _ = study
    path = edited(base / "records", tmp_path, change, reseal)
    before = path.read_bytes()
    out = ideas(tmp_path / "runs", tmp_path / "records", tmp_path / "results")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert str(path) in line and says in line
    assert student_folders(tmp_path / "runs") == [] and path.read_bytes() == before  # nothing trained or rewritten


@pytest.mark.slow
def test_a_table_over_seeds_is_a_study_too(tmp_path):
    """`repro.py table1 --seeds 42,43` records its runs; in a fresh runs folder the same command restores them
    (no student trains: no checkpoint anywhere) and writes the same table."""
    def table1(runs: Path, results: Path):
        done = subprocess.run([sys.executable, str(ROOT / "repro.py"), "table1", "--scale", "smoke", "--seeds", "42,43",
                               "--runs-dir", str(runs), "--records-dir", str(tmp_path / "records"), "--results-dir",
                               str(results)], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return json.loads((results / "smoke" / "table1.json").read_text())
    first = table1(tmp_path / "a", tmp_path / "a-results")
    assert len(list((tmp_path / "records" / "smoke").rglob("*.json"))) == 8  # 4 runs x 2 seeds
    assert table1(tmp_path / "b", tmp_path / "b-results") == first
    assert all(not any(f.name.startswith(("phase-", "latest")) for f in p.parent.iterdir())
               for p in student_folders(tmp_path / "b"))


def test_two_processes_share_out_a_study_instead_of_one_waiting_for_the_other(tmp_path):
    """locks.free_first: a run folder another process holds is put after the free ones and given last (its
    holder then waited for); locks.busy only looks: it makes no lock file, and a folder is free again once
    its holder lets go."""
    from plumbing import locks
    a, b, c = (tmp_path / name for name in "abc")
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom plumbing import locks\n"
                               "with locks.held([sys.argv[1]]):\n    print('held', flush=True)\n    sys.stdin.readline()\n",
                               str(b)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert (locks.busy(a), locks.busy(b), locks.busy(c)) == (False, True, False)
        assert list(locks.free_first([a, b, c])) == [0, 2, 1]
        assert list(locks.free_first([b, a])) == [1, 0] and list(locks.free_first([b])) == [0]
        assert not locks.lock_file(a).exists() and not locks.lock_file(c).exists()
    finally:
        holder.communicate("\n", timeout=30)
    assert not locks.busy(b) and list(locks.free_first([a, b, c])) == [0, 1, 2]
