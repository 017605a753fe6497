"""The bad-input table's cases (run by tests/test_bad_inputs.py) of a study's records (issue 50 §1, §2, §5): a record
edited and sealed again (its sha256 recomputed, so only a check of its content can tell), a copy beside it,
another study's record dropped into its folder, and a --records-dir that cannot be written. Each case records
the finished smoke tree's s42/post-grow in {C}/rec and moves its run folder away, so that `table1 --records-dir`
would restore it from the record: the record is refused in one line naming it and the key, before anything is
written from it (the folder stays away, nothing else changes). Also the helpers that make such records.
Issue 59 §5 and §6 (PAGE_RECORDS, SCALES): a committed record whose settings are not the run its study trains at
its place (a dose, a seed, a remedy's threshold edited and sealed again) is refused by `results` as the study's dry
run and restore refuse it, naming the record and the setting; the causal test at a scale it cannot size its dose at
is one line naming --scale, before any folder is made."""
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

from bad_references import pages_here, shipped
from conftest import RUN, case

from experiments import record_files, studies, suite

REC = "{C}/rec"
TABLE1_RECORDED = ["table1", *RUN, "--records-dir", REC]
SHIPPED = studies.RECORDS_DIR / "toy" / "s42" / "pre-grow.json"  # a record of the kit's, to edit


def sealed(record: dict, config_hash: bool = True) -> dict:
    """The record sealed again after an edit: its sha256 recomputed, and (config_hash) its identity's config hash
    too, so that neither checksum tells the edit."""
    if config_hash and isinstance(record.get("identity"), dict) and isinstance(record.get("config"), dict):
        record["identity"]["config_sha256"] = record_files.digest(record_files.training_settings(record["config"]))
    body = {k: v for k, v in record.items() if k != "sha256"}
    return {**body, "sha256": record_files.digest(body)}


def placed(folder: Path, run: str, change=lambda record: None, source: Path = SHIPPED) -> Path:
    """A copy of a kit's record as the record of `run` (<folder>/<run>.json, folder being <records>/<workspace>),
    changed by change(record) and sealed."""
    record = json.loads(source.read_text())
    record.update(run=run, workspace=folder.name, seed=int(run.split("/")[-2][1:]))
    change(record)
    path = folder / f"{run}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sealed(record)))
    return path


def smoke_record(case_dir: Path, run: str = "post-grow") -> tuple[dict, Path]:
    """(the record the kit writes of the smoke tree's s42/<run>, its path under {C}/rec)."""
    ws = replace(suite.workspace("smoke", case_dir / "R", dry_run=True), records=case_dir / "rec")
    job = studies.Job(ws, suite.RunName(*run.split("-", 1)), 42)
    return studies.make_record(job, json.loads((job.folder / "config.json").read_text())), studies.record_path(job)


def recorded(change, reseal: bool = True, config_hash: bool = True):
    """Damage: s42/post-grow recorded in {C}/rec, the record changed by change(record) (and sealed again), its run
    folder moved out of the runs tree."""
    def apply(case_dir: Path):
        record, path = smoke_record(case_dir)
        change(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(sealed(record, config_hash) if reseal else record))
        shutil.move(case_dir / "R" / "smoke" / "s42" / "post-grow", case_dir / "post-grow moved away")
    return apply


def bf16_folder_beside_its_record(case_dir: Path):
    """Issue 59 §1b: s42/post-grow recorded as the kit records it, and its finished folder (which the tables would
    read, not the record) trained in bfloat16 beside the study's float32."""
    record, path = smoke_record(case_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    provenance = case_dir / "R" / "smoke" / "s42" / "post-grow" / "provenance.json"
    provenance.write_text(json.dumps({**json.loads(provenance.read_text()), "precision": "bfloat16"}))


def put(*keys, value):
    def change(record):
        target = record
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return change


def pop(*keys):
    def change(record):
        target = record
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
    return change


def bad(id, change, names, config_hash: bool = True):
    return case(id, TABLE1_RECORDED, ("rec/smoke/s42/post-grow.json", *names), recorded(change, config_hash=config_hash))


def also(damage):
    """A second damage, after `recorded`'s (with the record of s42/post-grow in place)."""
    return lambda case_dir: damage(case_dir, case_dir / "rec" / "smoke" / "s42")


RECORDS = [
    bad("record: done.ce changed, sealed again", lambda r: r["done"].update(ce=r["done"]["ce"] - 0.1),
        ("done.ce", "metrics' last evaluation")),
    bad("record: config.lr 1.0, sealed again (identity as it was)", put("config", "lr", value=1.0),
        ("config", "identity.config_sha256"), config_hash=False),
    bad("record: no diagnostics", pop("diagnostics"), ("diagnostics", "missing")),
    bad("record: identity null", put("identity", value=None), ("identity", "null")),
    bad("record: identity without its teacher", pop("identity", "teacher"), ("identity.teacher", "missing")),
    bad("record: a block-removal row a string", put("diagnostics", "block_removal", 0, value="low"),
        ("diagnostics.block_removal",)),
    bad("record: another seed's run", put("run", value="s43/post-grow"), ("run", "s43")),
    bad("record: another run's label", put("run", value="s42/pre-grow"), ("its place", "s42/pre-grow.json")),
    bad("record: another study's workspace", put("workspace", value="toy"), ("its place", "toy/s42/post-grow")),
    bad("record: seed a boolean", put("seed", value=True), ("seed",)),
    bad("record: wall_seconds a string", put("wall_seconds", value="fast"), ("wall_seconds", "a string")),
    bad("record: a 401-digit done.ce", put("done", "ce", value=10**400), ("done.ce", "not a finite number")),
    bad("record: a 401-digit wall_seconds", put("wall_seconds", value=10**400), ("wall_seconds",)),
    bad("record: a 401-digit block-removal delta", put("diagnostics", "block_removal", 0, "delta_ce", value=10**400),
        ("diagnostics.block_removal",)),
    bad("record: provenance.precision a number", put("provenance", "precision", value=32), ("provenance.precision",)),
    bad("record: no provenance.precision", pop("provenance", "precision"), ("provenance.precision", "missing")),
    bad("record: a metrics row without its step", lambda r: r["metrics"][0].pop("step"), ("metrics[0]",)),
    bad("record: metrics an object", put("metrics", value={}), ("metrics", "not a list")),
    bad("record: done.diverged not the kit's entry", put("done", "diverged", value="yes"), ("done.diverged",)),
    bad("record: a key the kit never writes", put("notes", value="mine"), ("notes", "not a key the kit writes")),
    bad("record: format true", put("format", value=True), ("format",)),
    bad("record: config.relative_to_run false", put("config", "relative_to_run", value=False),
        ("config.relative_to_run",)),
    bad("record: config.blocks a string", put("config", "blocks", value="3"), ("config.blocks",)),
    bad("record: config with a setting the kit lacks", put("config", "speed", value=2), ("config", "speed")),
    # issue 59 §1a, §4: a run of fp32 recorded as bfloat16; numbers and texts no run gives
    bad("record: bfloat16 under an fp32 config, sealed again", put("provenance", "precision", value="bfloat16"),
        ("provenance.precision", "'fp32'")),
    bad("record: precision float16, sealed again", put("provenance", "precision", value="float16"),
        ("provenance.precision", "float16")),
    bad("record: done.ce 1e200 (its log too), sealed again",
        lambda r: [row.update(ce=1e200) for row in [r["done"], *r["metrics"]] if "ce" in row], ("ce", "a CE")),
    bad("record: a block's delta_ce 1e200", put("diagnostics", "block_removal", 0, "delta_ce", value=1e200),
        ("diagnostics.block_removal[0]",)),
    bad("record: a 5,000-character cpu", put("provenance", "cpu", value="x" * 5000), ("provenance.cpu", "5,000")),
    case("record: a finished bfloat16 folder beside the float32 records", TABLE1_RECORDED,
         ("s42/post-grow: trained in bfloat16", "float32"), bf16_folder_beside_its_record),
    case("record: edited by hand, not sealed again", TABLE1_RECORDED, ("post-grow.json", "does not match its sha256"),
         recorded(put("done", "ce", value=1.0), reseal=False)),
    case("record: a copy beside it", TABLE1_RECORDED, ("post-grow copy.json", "its place"), recorded(lambda r: None),
         also(lambda case_dir, s42: shutil.copy(s42 / "post-grow.json", s42 / "post-grow copy.json"))),
    case("record: another study's record dropped in", TABLE1_RECORDED, ("rec/smoke/s42/pre-grow.json", "its place",
                                                                         "toy/s42/pre-grow"),
         recorded(lambda r: None), also(lambda case_dir, s42: shutil.copy(SHIPPED, s42 / "pre-grow.json"))),
    case("record: a FIFO at a record's name", TABLE1_RECORDED, ("pre-grow.json", "not a plain file"),
         recorded(lambda r: None), also(lambda case_dir, s42: os.mkfifo(s42 / "pre-grow.json"))),
    case("--records-dir: a file", ["table1", *RUN, "--records-dir", "{C}/notes.txt"], ("--records-dir", "notes.txt",
                                                                                       "not a folder"),
         lambda case_dir: (case_dir / "notes.txt").write_text("mine")),
    case("--records-dir: inside a file", ["table1", *RUN, "--records-dir", "{C}/notes.txt/rec"],
         ("--records-dir", "notes.txt", "not a folder"), lambda case_dir: (case_dir / "notes.txt").write_text("mine")),
]


# ---- issue 59 §5: a page reads a study's records by the check its dry run and its restore make ----------------

TOY_RESULTS = ["results", "--scale", "toy"]
TOY_RECORDS = "{C}/references/records/toy"


def records_here(case_dir: Path, monkeypatch):
    """The page and the README written in the case folder, the study's committed records read from its copy there."""
    pages_here(case_dir, monkeypatch)
    monkeypatch.setattr(studies, "RECORDS_DIR", case_dir / "references" / "records")


def shipped_record(run: str, change):
    """The case's copy of the kit's toy record of `run` changed by change(record) and sealed again (its identity's
    config hash too): only a comparison with what the study trains at its place can tell."""
    def apply(case_dir: Path):
        path = case_dir / "references" / "records" / "toy" / f"{run}.json"
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(sealed(record)))
    return apply


def page_bad(id, run, change, names):
    return case(id, TOY_RESULTS, (f"{TOY_RECORDS}/{run}.json", "stale", *names), shipped, shipped_record(run, change),
                setup=records_here)


PAGE_RECORDS = [
    # before: read as the 37x dose and the seed-42 run, exit 0, the pages unchanged; `tail --dry-run` called them stale
    page_bad("results: a 37x record of boundary_tail 0.0, sealed again", "beyond/tail-37/s42/pre-grow",
             put("config", "boundary_tail", value=0.0), ("boundary_tail 0.0 in the record",)),
    page_bad("results: a record in s42/ whose config says seed 43, sealed again", "s42/pre-grow",
             put("config", "seed", value=43), ("seed 43 in the record, 42 in the run trained there",)),
    page_bad("results: a record of another run name, sealed again", "beyond/tail-6/s43/pre-joint",
             put("config", "name", value="pre-grow"), ('name "pre-grow" in the record',)),
    # the same class on the ideas' section: idea 3's firings are counted from its remedy runs' records
    page_bad("results: an idea-3 record of another identity_threshold, sealed again", "beyond/idea3-reinit/s42/pre-grow",
             put("config", "identity_threshold", value=0.5), ("identity_threshold 0.5 in the record",)),
]


# ---- issue 59 §6: the causal test at a scale it cannot size its dose at, before any folder ----------------------

TAIL_AT = lambda scale, *more: ["tail", "--scale", scale, "--runs-dir", "{C}/new-runs", "--results-dir", "{C}/new-results",
                                *more]
SCALES = [
    case("tail: --scale mini (no regular RMS measured there)", TAIL_AT("mini"), ("--scale", "mini", "toy or smoke")),
    case("tail: --scale mini, its dry run", TAIL_AT("mini", "--dry-run"), ("--scale", "mini", "REGULAR_RMS")),
]

RECORDS += [*PAGE_RECORDS, *SCALES]  # test_bad_inputs.py runs RECORDS
