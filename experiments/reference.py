"""Reference results that ship with the kit: references/<scale>.json, written from a scale's runs and reports and
read only after a check of its whole shape (experiments/comparison.py checks runs and reports against it).

    python repro.py reference --scale toy --seeds 42,43,44     # writes references/toy.json from runs/ and results/
    python repro.py reference --scale toy --seeds 42,43,44 --tables planted --force   # one table, rerun apart

Per run, the validation CE at every evaluation and at the end; per experiment, every number of its report's
`numbers`; each as the shipped seeds' values; and the commit, precision and machine that trained each run (a table
rerun in a runs folder of its own keeps its runs' under `table_provenance`).
"""

import json
import re
from pathlib import Path

import rundir
from experiments import report
from experiments.record_files import CE_LIMIT, NUMBER_LIMIT, too_long
from experiments.suite import run_folder
from plumbing import checkpoint
from plumbing.errors import OptionError, UsageError

REFERENCES = Path(__file__).resolve().parents[1] / "references"


def points(rows: list[dict]) -> dict[str, float]:
    """{evaluation point: validation CE} of a run's log rows: "<step>" after it, "<step> start" at a phase start."""
    return {f"{r['step']}{' start' if r.get('phase_start') else ''}": r["ce"] for r in rows if r.get("eval")}


def collect(runs: Path, results: Path, seeds: list[int]) -> dict:
    """The reference of a scale from its runs (runs/<scale>/s<seed>/<run>/) and reports (results/<scale>/)."""
    curves, finals, tables = {}, {}, {}
    for seed in seeds:
        for run_dir in sorted(runs.glob(run_folder("*", seed))):  # on disk: idea 4's search picks some
            if (run_dir / "done.json").is_file():
                for point, ce in points(rundir.read_metrics(run_dir)).items():
                    curves.setdefault(run_dir.name, {}).setdefault(point, []).append(ce)
                finals.setdefault(run_dir.name, []).append(rundir.final_eval(run_dir)["ce"])
    # A run finished for only some seeds (an experiment still training) has no band for the others yet.
    finals = {name: values for name, values in finals.items() if len(values) == len(seeds)}
    # Likewise an evaluation point that some seed's run lacks: every value a reference ships is one per seed.
    curves = {name: {point: v for point, v in points.items() if len(v) == len(seeds)} for name, points in curves.items()
              if name in finals}
    # A report over some of the seeds ships with its own seeds named, if it has a spread to make bands from.
    table_seeds = {}
    for file in sorted(results.glob("*.json")):
        own, numbers = read_report(file)
        if own and set(own) <= set(seeds) and (len(own) > 1 or len(seeds) == 1):
            tables[file.stem], table_seeds[file.stem] = numbers, own
    return report.finite({"seeds": seeds, "git_commit": rundir.git_commit(), "curves": curves, "final_ce": finals,
                          "tables": tables, "table_seeds": table_seeds,
                          **run_provenance(runs, seeds)})  # strict JSON: n/a is null


def with_tables(shipped: dict, runs: Path, results: Path, names: list[str]) -> dict:
    """`shipped` with the tables `names` taken anew from their reports and their runs' provenance added: for an
    experiment rerun apart from the rest of its scale, in a runs folder of its own."""
    content = {**shipped, "tables": dict(shipped["tables"]), "table_seeds": dict(shipped.get("table_seeds", {})),
               "table_provenance": dict(shipped.get("table_provenance", {}))}
    for name in names:
        file = results / f"{name}.json"
        if not file.is_file():
            raise UsageError(f"{file}: no such report; run `repro.py {name}` first")
        own, numbers = read_report(file)
        if len(own) < 2 or not set(own) <= set(shipped["seeds"]):
            raise UsageError(f"{file}: its seeds {own} are not several of the shipped seeds {shipped['seeds']}")
        content["tables"][name], content["table_seeds"][name] = numbers, own
        # its runs folder is its own: folder names there say nothing of the scale's folders of the same name
        content["table_provenance"][name] = run_provenance(runs, own)
    return report.finite(content)


def machine_of(provenance: dict) -> str | None:
    """A run's machine as its provenance.json says it: the GPU's name, or the CPU and the instructions torch used."""
    device, cpu = provenance.get("device"), provenance.get("cpu")
    if device and device != "cpu":
        return device
    return f"{cpu} ({provenance['cpu_capability']})" if cpu and provenance.get("cpu_capability") else cpu


# What a reference keeps of each run's provenance.json: the commit (when it ran relative to its rule), the
# precision (a band's) and the machine (AVX2 and AVX-512 round differently).
PROVENANCE_FIELDS = {"run_commits": lambda p: p.get("git_commit"), "run_precisions": lambda p: p.get("precision"),
                     "run_machines": machine_of}


def run_provenance(runs: Path, seeds: list[int]) -> dict[str, dict[str, str | None]]:
    """{reference key: {run folder under runs/<scale>/: its provenance.json's field}} of every run of the seeds."""
    folders = [d for s in seeds for v in ("", "*") for d in runs.glob(run_folder("*", s, v))] + [runs / "teacher"]
    made = {str(d.relative_to(runs)): rundir.read_json(d / "provenance.json")
            for d in sorted(folders) if (d / "provenance.json").is_file()}
    return {key: {folder: field(p) for folder, p in made.items()} for key, field in PROVENANCE_FIELDS.items()}


def read_report(file: Path) -> tuple[list[int], dict[str, list]]:
    """(its seeds, its `numbers`: {name: per-seed values}) of a report over seeds, checked; a file that is not a
    report the kit wrote is one line naming it."""
    bad = complaint(file, f"not a report the kit wrote: move it out of {file.parent} (`reference` reads every *.json "
                          "there)")
    content = rundir.read_json(file)
    if not content.get("seeds"):
        return [], {}  # not a report over seeds: never shipped
    own = check_seeds(content["seeds"], "seeds", bad)
    if "numbers" not in content:
        raise UsageError(f"{file}: a report over seeds without \"numbers\" (an older kit's); rerun its command (e.g. "
                         f"`repro.py {file.stem} --scale {file.parent.name}`), or move it out if the kit did not write it")
    for key, values in expect(content["numbers"], dict, "numbers", bad).items():
        per_seed(values, len(own), json_path("numbers", key), bad)
    return own, content["numbers"]


# A shipped reference is checked whole against the shape `collect` writes before a page is rendered or a number
# compared: a hand edit would otherwise be a traceback or, worse, a page that is silently wrong.

def load(scale: str) -> dict:
    """references/<scale>.json, read strictly and checked whole (check_reference); one line if it is not the kit's."""
    path = REFERENCES / f"{scale}.json"
    if not path.is_file():
        raise UsageError(f"{path}: no shipped reference for --scale {scale}; make one with `repro.py reference`")
    try:
        content = checkpoint.loads(text := path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not valid JSON ({e}); {restore(path)}") from None
    json.loads(text, object_pairs_hook=lambda pairs: refuse_repeated_keys(pairs, path))
    check_reference(content, path)
    return content


def refuse_repeated_keys(pairs: list[tuple], path: Path) -> dict:
    """An object of the file read with each key once: a key given twice would otherwise be read as its last value."""
    content = dict(pairs)
    if len(content) < len(pairs):
        key = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
        raise UsageError(f"{path}: the key {json.dumps(key)[:80]} is given twice in one object (JSON reads only the "
                         f"last); {restore(path)}")
    return content


def restore(path: Path) -> str:
    return (f"restore it (git checkout {path.parent.name}/{path.name}) or write it again from its runs (repro.py "
            f"reference --scale {path.stem} --seeds ... --force)")


def complaint(path: Path, fix: str):
    """bad(where, problem): the error for a value named by its JSON path (`where`; "" the whole file), with `fix`."""
    return lambda where, problem: UsageError(f"{path}: {where or 'the file'} {problem}; {fix}")


REFERENCE_KEYS = {"seeds", "git_commit", "curves", "final_ce", "tables", "table_seeds", "machine", "table_provenance",
                  *PROVENANCE_FIELDS}
POINT = re.compile(r"\d+( start)?")  # an evaluation point: "<step>", or "<step> start" at a phase start


def check_reference(content, path: Path, fix: str = ""):
    """Every value of a reference where `collect` puts it and of the type it writes, each list of per-seed values
    as long as its seeds; the first that is not is one line naming its JSON path (and `fix`)."""
    bad = complaint(path, fix or restore(path))
    expect(content, dict, "", bad)
    if found := too_long(content):  # before a page copies a 200 MB string
        raise bad(*found)
    if missing := [key for key in ("seeds", "git_commit", "curves", "final_ce", "tables") if key not in content]:
        raise bad(missing[0], "is missing")
    if unknown := sorted(set(content) - REFERENCE_KEYS):
        raise bad(unknown[0], f"is not a key the kit writes ({', '.join(sorted(REFERENCE_KEYS))})")
    seeds = check_seeds(content["seeds"], "seeds", bad)
    expect(content["git_commit"], str, "git_commit", bad)
    expect(content.get("machine", ""), str, "machine", bad)
    curves, finals = expect(content["curves"], dict, "curves", bad), expect(content["final_ce"], dict, "final_ce", bad)
    if not curves:
        raise bad("curves", "is empty, where the kit writes every shipped run's curve")
    for run in sorted(curves.keys() ^ finals.keys()):
        where = "curves" if run in finals else "final_ce"
        raise bad(json_path(where, run), f"is missing, where {'final_ce' if where == 'curves' else 'curves'} has it")
    for run, points in curves.items():
        if not expect(points, dict, json_path("curves", run), bad):
            raise bad(json_path("curves", run), "is empty, where the kit writes the run's evaluations")
        for point, values in points.items():
            if not POINT.fullmatch(point):
                raise bad(json_path("curves", run, point), "is not an evaluation point (\"<step>\" or \"<step> start\")")
            per_seed(values, len(seeds), json_path("curves", run, point), bad, ce=True)
        per_seed(finals[run], len(seeds), json_path("final_ce", run), bad, ce=True)
    check_tables(content, seeds, bad)
    check_provenance(content, (), bad)
    for name, made in expect(content.get("table_provenance", {}), dict, "table_provenance", bad).items():
        if name not in content["tables"]:
            raise bad(json_path("table_provenance", name), "names a table that tables lacks")
        unknown = sorted(set(expect(made, dict, json_path("table_provenance", name), bad)) - {*PROVENANCE_FIELDS, "said"})
        if unknown:
            raise bad(json_path("table_provenance", name, unknown[0]), "is not a key the kit writes there")
        check_provenance(made, ("table_provenance", name), bad)
        expect(made.get("said", ""), str, json_path("table_provenance", name, "said"), bad)


def check_provenance(content: dict, where: tuple[str, ...], bad):
    """Each run folder's commit, precision and machine: a string, or null where its provenance.json lacked it."""
    for key in PROVENANCE_FIELDS:
        for folder, value in expect(content.get(key, {}), dict, json_path(*where, key), bad).items():
            if value is not None and not isinstance(value, str):
                raise bad(json_path(*where, key, folder), f"is {describe(value)}, not a string (or null)")


def check_tables(content: dict, seeds: list[int], bad):
    """Each table's numbers per seed, as many as its own seeds (table_seeds, a subset of the seeds) or the seeds."""
    tables = expect(content["tables"], dict, "tables", bad)
    own = expect(content.get("table_seeds", {}), dict, "table_seeds", bad)
    for name, table_seeds in own.items():
        if name not in tables:
            raise bad(json_path("table_seeds", name), "names a table that tables lacks")
        foreign = sorted(set(check_seeds(table_seeds, json_path("table_seeds", name), bad)) - set(seeds))
        if foreign:
            raise bad(json_path("table_seeds", name), f"holds seed {foreign[0]}, which the reference's seeds {seeds} lack")
    for name, numbers in tables.items():
        limit = CE_LIMIT if name in CE_TABLES else NUMBER_LIMIT
        for key, values in expect(numbers, dict, json_path("tables", name), bad).items():
            per_seed(values, len(own.get(name) or seeds), json_path("tables", name, key), bad, limit=limit)


def check_seeds(seeds, where: str, bad) -> list[int]:
    if not expect(seeds, list, where, bad):
        raise bad(where, "is empty, where the kit writes the seeds it shipped")
    for i, seed in enumerate(seeds):
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise bad(f"{where}[{i}]", f"is {describe(seed)}, not a seed (a whole number >= 0)")
    if len(set(seeds)) < len(seeds):
        raise bad(where, f"repeats a seed ({seeds})")
    return seeds


# The tables every number of which is a CE or a difference of CEs: within ± CE_LIMIT (1e200 would be a page's
# 827-character cell), the others' within ± NUMBER_LIMIT.
CE_TABLES = ("table1", "table3", "scratch", "placements", "intervention")


def per_seed(values, n: int, where: str, bad, ce: bool = False, limit: float = NUMBER_LIMIT):
    """A list of one value per seed: a finite number within ± limit (a CE, `ce`: 0 to CE_LIMIT), or null."""
    if len(expect(values, list, where, bad)) != n:
        raise bad(where, f"holds {len(values)} value{'s' * (len(values) != 1)} for {n} seeds")
    for i, value in enumerate(values):
        if value is None:
            continue
        if not checkpoint.finite_number(value):
            raise bad(f"{where}[{i}]", f"is {describe(value)}, not a number (or null, for a run without one)")
        if ce and value < 0:
            raise bad(f"{where}[{i}]", f"is {value}, and a CE is never below 0")
        if not -limit <= value <= (CE_LIMIT if ce else limit):
            what = "a CE" if ce else "a CE or a difference of CEs" if limit == CE_LIMIT else "a number the kit writes"
            raise bad(f"{where}[{i}]", f"is {value:.4g}, beyond what {what} can be (at most "
                                       f"{CE_LIMIT if ce else limit:.4g} in size)")


def expect(value, kind: type, where: str, bad):
    if not isinstance(value, kind):
        raise bad(where, f"is {describe(value)}, not {({dict: 'an object', list: 'a list', str: 'a string'})[kind]}")
    return value


def describe(value) -> str:
    """What a JSON value is, as its reader sees it: `true` is not a number here, though Python adds it as 1."""
    kind = {bool: "a boolean", str: "a string", int: "the number", float: "the number"}.get(type(value))
    return f"{kind} {json.dumps(value)[:40]}" if kind else {list: "a list", dict: "an object"}.get(type(value), "null")


def json_path(*keys: str) -> str:
    """A value's place in the file: dotted where a key is a plain name, tables["placements"]["post: delta_grow"] else."""
    return "".join((f".{k}" if i else k) if re.fullmatch(r"[A-Za-z0-9_-]+", k) else f"[{json.dumps(k)}]"
                   for i, k in enumerate(keys))


# The command: `reference` writes the shipped file

def write(scale: str, seeds: list[int], force: bool, runs: Path, results: Path) -> str:
    """references/<scale>.json from the finished runs and reports of `seeds`; the line that says what it wrote."""
    if missing := [seed for seed in seeds if not (runs / run_folder("*", seed)).parent.is_dir()]:
        raise UsageError(f"{(runs / run_folder('*', missing[0])).parent}: no runs of seed {missing[0]}; run them first")
    content = collect(runs, results, seeds)  # every report read whole (read_report)
    if not content["curves"]:
        raise UsageError(f"no finished runs of seeds {seeds} under {runs}; run them first")
    path = REFERENCES / f"{scale}.json"
    check_reference(content, path, f"nothing was written: a run under {runs} or a report in {results} gave it")
    REFERENCES.mkdir(exist_ok=True)
    if path.exists() and not force:  # shipped with the kit: what every user's `compare` checks against
        raise UsageError(f"{path} exists (seeds {rundir.read_json(path).get('seeds')}): the kit ships it and "
                         "`compare` checks against it; add --force to replace it (git checkout restores it)")
    checkpoint.write_json(path, content, indent=1)
    return f"wrote {path}: {len(content['curves'])} runs, {len(content['tables'])} tables, seeds {seeds}"


def write_tables(scale: str, seeds: list[int], force: bool, names: list[str], runs: Path, results: Path) -> str:
    """`reference --tables`: the shipped file's named tables taken anew (with_tables); the line that says so."""
    path = REFERENCES / f"{scale}.json"
    if not path.is_file():
        raise UsageError(f"{path}: no shipped reference to update; write it whole (without --tables)")
    shipped = load(scale)
    if sorted(seeds) != sorted(shipped["seeds"]):
        raise OptionError("--seeds", f"{path} ships seeds {shipped['seeds']}; its tables take the same seeds")
    if not names or not force:
        raise UsageError(f"{path}: the kit ships it and `compare` checks against it; name the tables and add "
                         "--force to replace them (git checkout restores it)")
    for file in sorted(results.glob("*.json")):  # every report reads as an object, one that does not named in one line
        rundir.read_json(file)
    content = with_tables(shipped, runs, results, names)
    check_reference(content, path, f"nothing was written: a run under {runs} or a report in {results} gave it")
    checkpoint.write_json(path, content, indent=1)
    return f"wrote {path}: tables {', '.join(names)} from {results}, seeds {seeds}"
