"""A study's record (experiments/studies.py) as a file: checked whole when it is read (check_record), the text
it gives a page escaped and bounded (`cell`), its folder checked writable and written atomically. A record edited
and sealed again is one line naming it and the key, never a run folder that fails later, or a traceback.

    check_record(record, path)           # a BadRecord naming the record, the key and the fix
    cell(record["provenance"]["cpu"])    # one table cell: no line break, no |, at most 200 characters
"""

import hashlib
import json
import math
import os
import re
from dataclasses import MISSING, fields
from pathlib import Path

import config
import diag
import rundir
from plumbing import checkpoint, errors, locks
from plumbing.checkpoint import finite_number
from plumbing.hf_qwen3 import ModelConfig

FORMAT = 1
FIX = "restore it (git checkout) or move it away (its run then trains again)"
RUN_KEYS = {"format", "run", "workspace", "seed", "identity", "config", "provenance", "wall_seconds", "done", "metrics",
            "diagnostics", "sha256"}
IDENTITY_TYPES = {"config_sha256": str, "data": dict, "teacher": str}
PROVENANCE_TEXT = ("git_commit", "torch", "device", "cpu", "cpu_capability", "precision", "precision_reason")

# What a number or a text in a file the kit reads back can be: a CE is at most about log V (Qwen3's vocabulary,
# 11.9), and four times that bounds every CE and difference of CEs; other numbers stay far below 1e15.
CE_LIMIT = 4 * math.log(ModelConfig().vocab_size)
NUMBER_LIMIT = 1e15
TEXT_LIMIT, KEY_LIMIT = 4096, 200


def too_long(value, where: str = "") -> tuple[str, str] | None:
    """(the JSON path, what is wrong) of the first key or text in `value` longer than the kit ever writes, or None."""
    if isinstance(value, str) and len(value) > TEXT_LIMIT:
        return where or "the file", f"is a text of {len(value):,} characters (the kit writes at most {TEXT_LIMIT:,})"
    if isinstance(value, list):
        return next(filter(None, (too_long(item, f"{where}[{i}]") for i, item in enumerate(value))), None)
    for key, item in value.items() if isinstance(value, dict) else ():
        if len(key) > KEY_LIMIT:
            return where or "the file", f"holds a key of {len(key):,} characters (the kit writes at most {KEY_LIMIT})"
        if found := too_long(item, f"{where}.{key}" if where else key):
            return found
    return None


def bounded(value, low: float, high: float) -> bool:
    return finite_number(value) and low <= value <= high


# What a run is, as a record names it: its settings as they train, hashed

def training_settings(stored: dict) -> dict:
    """A config as its folder stores it, without the settings that only observe and without fields at their
    default (a field added to RunConfig later, at its default, leaves every record valid)."""
    defaults = json.loads(json.dumps({f.name: f.default for f in fields(config.RunConfig) if f.default is not MISSING}))
    return {k: v for k, v in stored.items()
            if k not in rundir.OBSERVING | {"relative_to_run"} and not (k in defaults and v == defaults[k])}


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# What a record must hold

class BadRecord(errors.TrainingError):
    def __init__(self, path: Path, where: str, problem: str):
        super().__init__(f"{locks.printable(str(path), 1000)}: {where} {problem}; {FIX}")


def describe(value) -> str:
    """What a JSON value is (never the value itself: it may be 200 MB, or hold a line break)."""
    return {bool: "a boolean", str: "a string", int: "a number", float: "a number", list: "a list",
            dict: "an object"}.get(type(value), "null")


def whole(value) -> bool:
    return type(value) is int and 0 <= value < 2**63


def cell(value, limit: int = 200) -> str:
    """Text from a file as one table cell or line of output: control characters and | escaped, at most `limit` long."""
    text = value if isinstance(value, str) else str(value)
    return locks.printable(text[:limit + 1], limit).replace("|", "\\|")


def check_record(record, path: Path):
    """The record whole: its format, every key of RUN_KEYS of its type, its label its place, its config the one its
    identity hashes, done.json's numbers its last evaluation's."""
    bad = lambda where, problem: BadRecord(path, where, problem)
    if not isinstance(record, dict):
        raise bad("the file", f"is {describe(record)}, not an object")
    if type(record.get("format")) is not int or record["format"] != FORMAT:
        raise bad("format", f"is not {FORMAT}, the format the kit writes")
    if found := too_long(record):
        raise bad(*found)
    expect_keys(record, RUN_KEYS, "", bad)
    for key in ("identity", "provenance", "config"):
        expect(record[key], dict, key, bad)
    check_place(record, path, bad)
    expect_keys(record["identity"], set(IDENTITY_TYPES), "identity.", bad)
    for key, kind in IDENTITY_TYPES.items():
        expect(record["identity"][key], kind, f"identity.{key}", bad)
    check_settings(record["config"], bad)
    if record["identity"]["config_sha256"] != digest(training_settings(record["config"])):
        raise bad("config", "is not the settings identity.config_sha256 names (edited by hand)")
    if "precision" not in record["provenance"]:
        raise bad("provenance.precision", "is missing")
    for key in PROVENANCE_TEXT:
        if key in record["provenance"] and not isinstance(record["provenance"][key], str):
            raise bad(f"provenance.{key}", f"is {describe(record['provenance'][key])}, not a text")
    check_precision(record["provenance"]["precision"], record["config"].get("precision", "auto"), bad)
    if not bounded(record["wall_seconds"], 0, NUMBER_LIMIT):
        raise bad("wall_seconds", f"is {describe(record['wall_seconds'])}, not a number of seconds from 0 to "
                                  f"{NUMBER_LIMIT:g}")
    rows = expect(record["metrics"], list, "metrics", bad)
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not whole(row.get("step")):
            raise bad(f"metrics[{i}]", "is not a row the kit logs (an object with its step)")
        if row.get("eval") and row.get("ce") is not None and not bounded(row["ce"], 0, CE_LIMIT):
            raise bad(f"metrics[{i}].ce", f"is {describe(row['ce'])} outside 0 to {CE_LIMIT:.1f}, what a CE can be")
    diverged = check_done(expect(record["done"], dict, "done", bad), rows, bad)
    diagnostics = expect(record["diagnostics"], dict, "diagnostics", bad)
    # diagnostics.block_removal as diag.recorded_block_removal reads it
    if not diverged and not diag.block_removal_rows(diagnostics.get("block_removal")):
        raise bad("diagnostics.block_removal", "is not a row of finite numbers per block, as the kit records it")
    for i, row in enumerate([] if diverged else diagnostics["block_removal"]):  # CEs and their difference
        if not all(bounded(row[key], -CE_LIMIT if key == "delta_ce" else 0, CE_LIMIT)
                   for key in ("ce_full", "ce_skip", "delta_ce")):
            raise bad(f"diagnostics.block_removal[{i}]", f"holds a CE outside 0 to {CE_LIMIT:.1f} (or a difference of "
                                                         "CEs outside ± that), what none can be")


TRAINED_IN = {"fp32": "float32", "bf16": "bfloat16"}  # config.precision -> provenance's


def check_precision(trained: str, asked, bad):
    """The precision its provenance says: one the kit trains in, and the one its config asks for unless "auto"."""
    if trained not in ("float32", "bfloat16"):
        raise bad("provenance.precision", f"is {cell(trained, 40)!r}, not a precision the kit trains in (float32, "
                                          "bfloat16)")
    if asked != "auto" and TRAINED_IN.get(asked) != trained:
        raise bad("provenance.precision", f"is {trained}, but its config asks for {cell(asked, 20)!r}, which never "
                                          f"trains in {trained}")


def expect(value, kind: type, where: str, bad):
    if not isinstance(value, kind):
        raise bad(where, f"is {describe(value)}, not {describe(kind())}")
    return value


def expect_keys(value: dict, keys: set, where: str, bad):
    missing, unknown = sorted(keys - set(value)), sorted(set(value) - keys)
    if missing:
        raise bad(f"{where}{missing[0]}", "is missing")
    if unknown:
        raise bad("the file", f"holds {cell(where + unknown[0], 60)!r}, not a key the kit writes there")


def check_place(record: dict, path: Path, bad):
    """A record belongs to the run of its place alone: a copy or another study's record is none of this study's."""
    run, workspace, seed = record["run"], record["workspace"], record["seed"]
    if not isinstance(run, str) or not isinstance(workspace, str) or not whole(seed):
        raise bad("run, workspace or seed", "is not of the kit's type (a text, a text, a whole number)")
    parts = [workspace, *run.split("/")]
    if any(part in ("", ".", "..") for part in parts) or len(parts) < 3 or parts[-2] != f"s{seed}":
        raise bad("run", f"{cell(run, 80)!r} is not a run's label (<folder>/s<seed>/<run>, of the record's seed {seed})")
    if list(Path(path).parts[-len(parts):]) != [*parts[:-1], f"{parts[-1]}.json"]:
        raise bad("its place", f"is not that of the run it records ({cell('/'.join(parts), 120)}.json): a record "
                               "belongs to the run its path names (a copy, or another study's record, is none)")


# A RunConfig field's annotation -> the JSON types config.json holds it as.
SETTING_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "tuple": (list,),
                 "dict": (dict, type(None))}


def check_settings(settings: dict, bad):
    """config.json as the kit writes it: RunConfig's fields only, each of its type, paths relative to the run."""
    kinds = {f.name: SETTING_TYPES.get(str(f.type).split("[")[0].split(" ")[0]) for f in fields(config.RunConfig)}
    for key, value in settings.items():
        if key not in kinds:
            raise bad("config", f"holds {cell(key, 60)!r}, not a run setting")
        kind = kinds[key]
        if kind and (not isinstance(value, kind) or isinstance(value, bool) != (bool in kind)
                     or (isinstance(value, (int, float)) and not isinstance(value, bool) and not finite_number(value))):
            raise bad(f"config.{key}", f"is {describe(value)}, not the setting's type")
    if settings.get("relative_to_run") is not True:
        raise bad("config.relative_to_run", "is not true (a record's paths are its run folder's)")


def check_done(done: dict, rows: list[dict], bad) -> bool:
    """done.json as rundir.final_eval reads it: a diverged entry, or its last evaluation's numbers. Whether it diverged."""
    if done.get("diverged") is not None:
        entry = done["diverged"]
        if not (isinstance(entry, dict) and whole(entry.get("step")) and isinstance(entry.get("why"), str)):
            raise bad("done.diverged", "is not the kit's entry (an object of step and why)")
        return True
    for key in rundir.RESULT_KEYS:
        if not finite_number(done.get(key)):
            raise bad(f"done.{key}", f"is {describe(done.get(key))}, not a finite number")
    if not bounded(done["ce"], 0, CE_LIMIT):
        raise bad("done.ce", f"is {done['ce']:.4g}, outside 0 to {CE_LIMIT:.1f}, what a cross-entropy can be")
    last = next((r for r in reversed(rows) if r.get("eval") and not r.get("phase_start")), None)
    if last is None:
        raise bad("metrics", "holds no evaluation for done's numbers to agree with")
    for key in rundir.RESULT_KEYS:
        agree = finite_number(last.get(key)) and math.isclose(last[key], done[key], rel_tol=rundir.AGREE,
                                                              abs_tol=rundir.AGREE)
        if not agree:
            raise bad(f"done.{key}", f"is not what metrics' last evaluation (step {last['step']}) logged")
    if done.get("step", last["step"]) != last["step"]:
        raise bad("done.step", f"is not the step of metrics' last evaluation ({last['step']})")
    return False


# The records folder, meant for git

def check_writable(folder: Path):
    """A study's records folder (or the nearest one above that exists) and every folder in it writable, checked
    before anything trains: each record is written after its run, maybe hours in."""
    above = next(p for p in (folder, *folder.parents) if p.exists() or p.is_symlink())
    for path in [above, *(p for p in sorted(folder.rglob("*")) if p.is_dir())] if folder.is_dir() else [above]:
        why = ("not a folder" if not path.is_dir() else
               "" if os.access(path, os.W_OK | os.X_OK) else "not writable by this user, or on a read-only disk")
        if why:
            raise errors.OptionError("--records-dir", f"{path} is {why}, and a study writes its records in "
                                     f"{folder}: choose another folder")


# What checkpoint.write_atomic leaves beside a file when it is killed between its temporary file and the rename.
TEMPORARY = re.compile(r"\.(.+\.json)\.(\d{1,10})\.tmp")


def write_record(path: Path, record: dict):
    """A record written atomically, the temporary files a killed write left there removed first (none is committed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for left in path.parent.iterdir():
        match = TEMPORARY.fullmatch(left.name)
        if match and left.is_file() and not left.is_symlink() and not locks.alive(int(match[2])):
            left.unlink(missing_ok=True)
    checkpoint.write_json(path, record)
