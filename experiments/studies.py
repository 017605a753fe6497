"""Studies that outlive the machine they ran on. A study is a manifest of runs (Job: a workspace, a run, a seed);
each finished run leaves a small JSON record meant for git, references/records/<workspace>/<run folder>.json: what
the run was (its config's hash, the data's and the teacher's checksums), what it gave (done.json, its kept log rows,
the diagnostics the tables read), where and how long. On a fresh clone a study restores its recorded runs into
their folders (no weights) and trains only the others:

    python repro.py ideas --scale toy --seeds 42,43,44 --dry-run   # which runs are recorded, which remain
    python repro.py ideas --scale toy --seeds 42,43,44             # trains what remains, records each run

A record is used only where it matches what the command would train now; a stale one stops it, named with the
reason (--force retrains it). Records of other CPUs combine (fp32 differs between instruction sets only in
rounding; docs/preregistrations.md, 2026-12-03); of another precision, never.
"""

import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import config
import diag
import rundir
from experiments import presets, readouts, record_files, suite, tables, training, variants
from experiments.record_files import FORMAT, BadRecord, cell, digest, training_settings
from experiments.suite import RunName, Workspace
from plumbing import checkpoint, devices, errors, locks

RECORD = "record.json"  # in a run folder restored from its record: which record (no weights are there)
RECORDS_DIR = suite.SHIPPED_ROOT / "references" / "records"
# What a record keeps of metrics.jsonl: every row but the training steps', and each phase's last step (its
# token counts and clock: Table A2 reads them).
KEPT_ROW_KEYS = ("eval", "event", "monitor")


@dataclass(frozen=True)
class Job:
    ws: Workspace
    run: RunName
    seed: int

    @property
    def folder(self) -> Path:
        return self.ws.run_dir(self.run, self.seed)

    @property
    def label(self) -> str:
        return self.ws.folder(self.run, self.seed)


def unique(jobs) -> list[Job]:
    """Each run folder once, in the order given."""
    first: dict[Path, Job] = {}
    for job in jobs:
        first.setdefault(job.folder, job)
    return list(first.values())


def record_path(job: Job) -> Path:
    return job.ws.records / job.ws.runs.name / f"{job.label}.json"


# What a run is: its settings as they train, the data token for token, the teacher byte for byte

def stored_form(settings: config.RunConfig) -> dict:
    return json.loads(json.dumps(asdict(settings)))


def teacher_checksum(stored: dict, folder: Path) -> str:
    """The teacher as it computes: the sha256s of its config and weights (not the trainer state's clock), or ""."""
    if not stored.get("teacher"):
        return ""
    teacher = Path(config.absolute_paths(stored, folder)["teacher"])  # the run folder need not exist yet
    try:
        files = checkpoint.loads((teacher / checkpoint.CHECKSUMS).read_text())
    except (OSError, ValueError):
        return ""
    return digest({name: sha for name, sha in files.items() if name == "config.json" or name.endswith(".safetensors")})


def identity(job: Job, stored: dict, check_data: bool = True) -> dict:
    """What the run is; a dry run (no data prepared) knows its settings only: data and teacher None (not compared)."""
    return {"config_sha256": digest(training_settings(stored)), "data": suite.shard_sha256s(job.ws) if check_data else None,
            "teacher": teacher_checksum(stored, job.folder) if check_data else None}


# Reading and checking records

def read_record(path: Path) -> dict:
    """A record, its own checksum verified, then checked whole (record_files.check_record); else one line."""
    if not path.is_file():  # a FIFO or a folder at a record's name is never opened
        raise BadRecord(path, "the file", "is not a plain file")
    try:
        record = checkpoint.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadRecord(path, "the file", f"is not a record the kit wrote ({cell(e, 120)})") from None
    if not isinstance(record, dict) or record.get("sha256") != digest({k: v for k, v in record.items() if k != "sha256"}):
        raise BadRecord(path, "its content", "does not match its sha256 (edited by hand or damaged)")
    record_files.check_record(record, path)
    return record


def study_records(folder: Path) -> list[tuple[Path, dict]]:
    """Every run's record of a workspace (<records>/<workspace>/), each read whole (read_record)."""
    return [(path, read_record(path)) for path in (sorted(folder.rglob("*.json")) if folder.is_dir() else [])]


def stale_reason(record: dict, wanted: dict, stored: dict | None = None) -> str:
    """Why a record is not of the run the command would train now ("" if it is); a part of `wanted` that is None
    (a dry run's data and teacher) is not compared; with `stored`, which setting differs."""
    have = record["identity"]
    reasons = {"config_sha256": "the run's settings changed" + (changed_setting(record["config"], stored) if stored else ""),
               "data": "the data's shards changed", "teacher": "the teacher changed"}
    return "; ".join(why for key, why in reasons.items() if wanted[key] is not None and have.get(key) != wanted[key])


def changed_setting(recorded: dict, stored: dict) -> str:
    """" (<key> <value> in the record, <value> in the run trained there)" of the first setting that differs."""
    have, want = training_settings(recorded), training_settings(stored)
    keys = sorted(key for key in have.keys() | want.keys() if have.get(key) != want.get(key))
    if not keys:
        return ""
    show = lambda settings, key: cell(json.dumps(settings[key]), 60) if key in settings else "at its default"
    more = f"; and {len(keys) - 1} more" if len(keys) > 1 else ""
    return (f" ({cell(keys[0], 60)} {show(recorded, keys[0])} in the record, {show(stored, keys[0])} in the run "
            f"trained there{more})")


def machine(record: dict) -> str:
    p = record.get("provenance", {})
    return f"{cell(p.get('cpu', '?'), 100)} ({cell(p.get('cpu_capability', '?'), 40)}, {cell(p.get('precision', '?'), 20)})"


@dataclass
class Status:
    recorded: list[tuple[Job, dict]]   # valid records
    stale: list[tuple[Job, str]]       # (job, why)
    remaining: list[Job]               # no record


def stale_error(status: Status, fix: str) -> errors.TrainingError:
    """The first stale record of a survey, why, how many more, and `fix`: one line."""
    job, why = status.stale[0]
    more = f" (and {len(status.stale) - 1} more)" if len(status.stale) > 1 else ""
    return errors.TrainingError(f"{record_path(job)}: stale, {why}{more}; {fix}")


def survey(jobs: list[Job], teacher: Path, check_data: bool = True) -> Status:
    """Each job's record: valid, stale (and why) or missing (identity: a dry run compares the settings only)."""
    status = Status([], [], [])
    for job in unique(jobs):
        path = record_path(job)
        if not path.is_file():
            status.remaining.append(job)
            continue
        record = read_record(path)
        stored = stored_form(variants.job_config(job.ws, job.run, job.seed, teacher))
        why = stale_reason(record, identity(job, stored, check_data), stored)
        (status.stale.append((job, why)) if why else status.recorded.append((job, record)))
    return status


# What a results page reads of a study's records: by the check its dry run and its restore make

def page_workspace(scale: str, records: Path) -> Workspace:
    """A scale's workspace as its study's dry run places it (a record's paths are relative to its run folder)."""
    return Workspace(presets.PRESETS[scale], Path("runs") / scale, Path("results") / scale, devices.Dist(),
                     records=records)


def page_records(jobs: list[Job]) -> dict[str, dict]:
    """{run label: record} of the jobs recorded, each checked by survey as a study's dry run checks it (the data
    and the teacher aside): a stale one is one line naming it and the fix, never a number on a page."""
    status = survey(jobs, training.expected_teacher(jobs[0].ws) if jobs else None, check_data=False)
    if status.stale:
        raise stale_error(status, "a page reads only the runs its study trains: restore it (git checkout), or move it "
                                  "away (git rm) and rerun the study, whose dry run says what then trains")
    return {job.label: record for job, record in status.recorded}


# The precision rule (docs/method.md, "Precision in a study"): a study's "auto" runs train in the precision of its
# records of such runs, so that its numbers stay comparable whatever CPU continues it; only a study with none lets
# the machine decide. `--set run.precision=bf16` is another study.

NAMES = {"float32": "fp32", "bfloat16": "bf16"}  # provenance.json's dtype names -> RunConfig.precision's


def auto_precisions(folder: Path) -> dict[str, list[Path]]:
    """{the precision they trained in: the records} of every run under `folder` that asked for "auto"."""
    found: dict[str, list[Path]] = {}
    for path, record in study_records(folder):
        if record["config"].get("precision", "auto") == "auto":
            found.setdefault(record["provenance"]["precision"], []).append(path)
    return found


def settle_precision(ws: Workspace) -> Workspace:
    """The workspace whose "auto" precision is its records' (ws.ctx.auto_precision); records of two are refused."""
    folder = ws.records / ws.runs.name
    found = auto_precisions(folder)
    if len(found) > 1:
        named = "; ".join(f"{len(paths)} {cell(p, 40)} (e.g. {paths[0]})" for p, paths in sorted(found.items()))
        raise errors.TrainingError(f"{folder}: the study's records mix precisions ({named}); a study combines one "
                                   "precision: move the records of one away (git mv), they are another study")
    if not found or ws.preset.run.get("precision", "auto") != "auto":
        return ws
    (trained, paths), = found.items()
    if trained not in NAMES:
        raise errors.TrainingError(f"{paths[0]}: its provenance names precision {cell(trained, 40)!r}, not one the kit "
                                   f"trains in ({', '.join(NAMES)}); restore it (git checkout) or move it away")
    here = str(devices.precision_choice("auto", ws.ctx.device)[0]).removeprefix("torch.")
    why = f"the study's {len(paths)} records in {folder} are {trained}" + (
        "" if here == trained else f"; this machine would pick {here}: --set run.precision={NAMES[here]} trains a "
                                   "separate study")
    if ws.ctx.is_main:
        suite.console.print(f"precision: {trained}, {why}", markup=False, highlight=False)
    return replace(ws, ctx=replace(ws.ctx, auto_precision=(NAMES[trained], why)))


def check_precision(status: Status, teacher: Path):
    """Before anything is restored or trained, the one precision rule (training.check_one_precision) over a study's
    runs: a recorded run by its record (unless its folder holds a finished run of its own), the others by their
    folders or what this command trains them in."""
    runs, recorded = [], dict(status.recorded)
    for job in [job for job, _ in status.recorded] + status.remaining + [job for job, _ in status.stale]:
        if job in recorded and not ((job.folder / "done.json").is_file() and not (job.folder / RECORD).is_file()):
            runs.append(training.RunPrecision(str(record_path(job)), recorded[job]["provenance"]["precision"],
                                              "recorded in", f"move {record_path(job)} away (git mv)"))
        else:
            settings = variants.job_config(job.ws, job.run, job.seed, teacher)
            runs.append(training.run_precision(job.ws, settings, job.folder))
    training.check_one_precision(runs)


# Restoring recorded runs before a study trains; recording each run as it finishes

def restore(jobs: list[Job], teacher: Path, force: bool = False) -> Status:
    """Before a study trains: every record checked; stale ones stop it unless --force (retrained, their records
    replaced); valid ones restored (restore_folder). A recorded run whose checkpoint a missing run starts from is
    not restored, or if an earlier command restored it (no weights), cleared: it trains again first (its record kept)."""
    status = survey(jobs, teacher)
    if status.stale and not force:
        raise stale_error(status, "nothing was trained: move the stale records away (git rm) or pass --force to "
                                  "retrain those runs and replace them")
    check_precision(status, teacher)  # before a record is removed or a folder written
    for job, _ in status.stale:  # --force: retrained, and recorded again
        record_path(job).unlink()
    sources = {job: prefix_folder(job, teacher) for job in status.remaining + [job for job, _ in status.stale]}
    for job, record in status.recorded:
        if job.folder in sources.values() and not (job.folder / "done.json").is_file():
            suite.console.print(f"{job.folder}: recorded without weights; trained again as the prefix of the runs that "
                                "start from it (its record is kept)", markup=False, highlight=False)
        else:
            restore_folder(job, record)
    for job, source in sources.items():
        if source is not None and (source / RECORD).is_file():
            with held(source, job.ws):
                if (source / RECORD).is_file():  # not trained meanwhile by another process
                    suite.console.print(f"{source}: restored from its record without weights; trained again as the "
                                        f"prefix of {job.folder} (its record is kept)", markup=False, highlight=False)
                    rundir.check_discardable(source)
                    shutil.rmtree(source)
    return status


def held(folder: Path, ws: Workspace):
    """A run folder's lock, the one training takes: one process writes a folder at a time."""
    return locks.held([folder], ws.wait, say=lambda line: suite.console.print(line, markup=False, highlight=False))


def restore_folder(job: Job, record: dict):
    """The recorded run written into its folder (no checkpoint), unless it holds a finished run, under its lock."""
    folder = job.folder
    if (folder / "done.json").is_file():
        return
    with held(folder, job.ws):
        if (folder / "done.json").is_file():
            return
        if folder.exists():  # a partial run of the same settings, or a restored one: the record replaces it
            rundir.check_discardable(folder)
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        checkpoint.write_json(folder / "config.json", record["config"])
        checkpoint.write_json(folder / "provenance.json", record["provenance"])
        checkpoint.write_json(folder / RECORD, {"restored_from": record["sha256"]})
        checkpoint.write_atomic(folder / "metrics.jsonl", "".join(checkpoint.json_text(r, None) for r in record["metrics"]))
        checkpoint.write_json(folder / diag.DIAGNOSTICS, record["diagnostics"])
        checkpoint.write_json(folder / "done.json", record["done"])  # last: a folder without it is unfinished


def prefix_folder(job: Job, teacher: Path) -> Path | None:
    """The folder of the run whose phase checkpoint the job starts from (None: it starts from the teacher)."""
    settings = variants.job_config(job.ws, job.run, job.seed, teacher)
    if not settings.start_from:
        return None
    return Path(config.absolute_paths(stored_form(settings), job.folder)["start_from"]).parent


def record_finished(ws: Workspace, run: RunName, seed: int):
    """After a run finishes (or is reused): its record, written once (atomically). A run trained again as a prefix
    keeps its record, and a stale record is never overwritten here (restore's --force)."""
    job = Job(ws, run, seed)
    if ws.records is None or not (job.folder / "done.json").is_file() or (job.folder / RECORD).is_file():
        return
    path, stored = record_path(job), rundir.read_json(job.folder / "config.json")
    if path.is_file():
        old = read_record(path)
        why = stale_reason(old, identity(job, stored), stored)
        done = rundir.read_json(job.folder / "done.json")
        if why:
            suite.console.print(f"{path}: stale ({why}); kept: move it away to record this run")
        elif old["done"] != done:  # its folder keeps what it trained: the tables read its every step and weights
            suite.console.print(f"{job.label}: trained again on this machine (CE {done.get('ce')}), and the tables "
                                f"read this run; its record (CE {old['done'].get('ce')}, {machine(old)}) is unchanged")
        else:
            checkpoint.write_json(job.folder / diag.DIAGNOSTICS, old["diagnostics"])
        return
    record = make_record(job, stored)
    record_files.write_record(path, record)
    checkpoint.write_json(job.folder / diag.DIAGNOSTICS, record["diagnostics"])


def kept_rows(rows: list[dict]) -> list[dict]:
    kept = lambda row: any(row.get(k) for k in KEPT_ROW_KEYS)
    last_of_phase = {row.get("phase"): i for i, row in enumerate(rows) if not kept(row)}
    return [row for i, row in enumerate(rows) if kept(row) or i in last_of_phase.values()]


def wall_seconds(rows: list[dict]) -> float:
    """A run's wall time: the latest clock its log rows hold, evaluations aside (0 for a run that logged none)."""
    return max((r.get("time", 0.0) for r in rows if not r.get("eval")), default=0.0)


def make_record(job: Job, stored: dict) -> dict:
    rows = rundir.read_metrics(job.folder)
    done = rundir.read_json(job.folder / "done.json")
    record = {"format": FORMAT, "run": job.label, "workspace": job.ws.runs.name, "seed": job.seed,
              "identity": identity(job, stored), "config": stored,
              "provenance": rundir.read_json(job.folder / "provenance.json"),
              "wall_seconds": wall_seconds(rows), "done": done, "metrics": kept_rows(rows),
              "diagnostics": {} if done.get("diverged") else
              {"block_removal": readouts.block_removal(job.ws, job.run, job.seed)}}
    record["sha256"] = digest(record)
    return record


def folder_machine_row(run: str, folder: Path) -> dict:
    """machine_row of a run folder (a restored one holds its record's provenance and its phases' last step rows)."""
    return machine_row(run, rundir.read_json(folder / "provenance.json"), wall_seconds(rundir.read_metrics(folder)))


def machine_row(run: str, provenance: dict, wall_seconds: float) -> dict:
    """A row of machines_markdown: what a record or a run folder says, each text bounded (cell)."""
    return {"run": cell(run), "machine": machine({"provenance": provenance}), "wall_seconds": wall_seconds,
            "commit": cell(str(provenance.get("git_commit", ""))[:12])}


def machines_markdown(rows: list[dict]) -> list[str]:
    by_machine: dict[str, list[float]] = {}
    for row in rows:
        by_machine.setdefault(row["machine"], []).append(row["wall_seconds"])
    lines = ["## Runs and their machines", "", "| machine | runs | wall time, summed |", "| --- | --- | --- |"]
    lines += [f"| {m} | {len(w)} | {sum(w) / 3600:.2f} h |" for m, w in by_machine.items()]
    lines += ["", "| run | machine | wall time | commit |", "| --- | --- | --- | --- |"]
    return lines + [f"| {r['run']} | {r['machine']} | {r['wall_seconds'] / 60:.1f} min | {r['commit']} |" for r in rows]


# The tables that read only what a record keeps (final and per-phase evaluations, the last block's removal, each
# phase's last step): a study of them restores its recorded runs; others (diagnostics over checkpoints,
# curves) read weights or every step, so their runs are recorded but trained where they have no folder.
RECORD_COMPLETE = ("table1", "table2", "table3", "tableA2", "tableA3")


def suite_jobs(ws: Workspace, runs, seeds: list[int]) -> list[Job]:
    return [Job(ws, run, seed) for seed in seeds for run in suite.with_prefixes(runs)]


def restorable_jobs(ws: Workspace, names: list[str], runs, seeds: list[int]) -> list[Job]:
    """The jobs of the runs a record can stand in for (those only RECORD_COMPLETE experiments among `names` read),
    without the prefixes they start from (a prefix not restorable itself trains)."""
    kept = [run for run in runs if all(name in RECORD_COMPLETE for name in names if run in tables.TABLES[name].runs)]
    return [job for job in suite_jobs(ws, kept, seeds) if job.run in kept]


def restore_study(ws: Workspace, jobs: list[Job], force: bool):
    """A recording study's runs restored (restore) on the main process, after its one precision is checked."""
    if ws.records is not None and jobs:
        expected = training.expected_teacher(ws)  # the settings alone, before the data or the teacher is made
        ws.ctx.on_main(lambda: check_precision(survey(jobs, expected, check_data=False), expected), "the precision rule")
        teacher = suite.ensure_inputs(ws, force)
        ws.ctx.on_main(lambda: restore(jobs, teacher, force), "restoring records")


def recorded_machines(scale: str, records: Path = RECORDS_DIR) -> list[str]:
    """machines_markdown of every run of a scale a study recorded (<records>/<scale>/), for its results page."""
    rows = [machine_row(r["run"], r["provenance"], r["wall_seconds"]) for _, r in study_records(records / scale)]
    return machines_markdown(rows) if rows else []


def attach(ws: Workspace, records: Path | None, dry_run: bool = False) -> Workspace:
    """The workspace, recording each finished run under `records` (None: the kit's RECORDS_DIR; at smoke scale
    none), its "auto" precision its records'. A dry run only reads them: a read-only clone may plan."""
    records = records or (None if ws.preset.name == "smoke" else RECORDS_DIR)
    if records is None:
        return ws
    if not dry_run:
        record_files.check_writable(records / ws.runs.name)
    return settle_precision(replace(ws, records=records, on_finished=record_finished))
