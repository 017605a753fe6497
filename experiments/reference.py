"""Reference results that ship with the kit, and the check of a run against them.

    python repro.py reference --scale toy --seeds 42,43,44     # writes references/toy.json from runs/ and results/
    python repro.py compare runs/toy                           # every run of every seed, against references/toy.json
    python repro.py compare runs/toy/s42/post-grow             # one run
    python repro.py compare results/toy                        # the tables

A reference holds, per run, the validation CE at every evaluation (the curve) and at the end, per
experiment every number over seeds (a table's rows, a report's named numbers), each as the values of the
shipped seeds, and the commit that trained each run (`run_commits`, from its provenance.json). A number is within the band
when it lies within mean ± max(a 95% prediction interval for one more seed, a tolerance): seeds set
the band's width where there are several, the tolerance (1% of the value + 0.001) where they agree.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from rich.table import Table

import rundir
from experiments import report, suite
from plumbing import checkpoint
from plumbing.errors import OptionError, UsageError

REFERENCES = Path(__file__).resolve().parents[1] / "references"


def curve(run_dir: Path) -> dict[str, float]:
    """{evaluation point: validation CE} of a run: "<step>" after it, "<step> start" at a phase start."""
    return {f"{r['step']}{' start' if r.get('phase_start') else ''}": r["ce"]
            for r in rundir.read_metrics(run_dir) if r.get("eval")}


def collect(runs: Path, results: Path, seeds: list[int]) -> dict:
    """The reference of a scale from its runs (runs/<scale>/s<seed>/<run>/) and reports (results/<scale>/)."""
    curves, finals, tables = {}, {}, {}
    for seed in seeds:
        for run_dir in sorted((runs / f"s{seed}").iterdir()):
            if (run_dir / "done.json").is_file():
                for point, ce in curve(run_dir).items():
                    curves.setdefault(run_dir.name, {}).setdefault(point, []).append(ce)
                finals.setdefault(run_dir.name, []).append(rundir.final_eval(run_dir)["ce"])
    # A run finished for only some seeds (an experiment still training) has no band for the others yet.
    partial = [name for name, values in finals.items() if len(values) < len(seeds)]
    for name in partial:
        del finals[name]
        curves.pop(name, None)
    # A report over some of the seeds (the regime map runs two by default) ships with its own seeds named,
    # if it has a spread to make bands from: one seed of several would give a band of the tolerance alone.
    table_seeds = {}
    for file in sorted(results.glob("*.json")):
        content = checkpoint.loads(file.read_text())
        own = content.get("seeds") or []
        if own and set(own) <= set(seeds) and (len(own) > 1 or len(seeds) == 1):
            tables[file.stem], table_seeds[file.stem] = report_numbers(content), content["seeds"]
    return report.finite({"seeds": seeds, "git_commit": rundir.git_commit(), "curves": curves, "final_ce": finals,
                          "tables": tables, "table_seeds": table_seeds,
                          "run_commits": run_commits(runs, seeds)})  # strict JSON: n/a is null


def with_tables(shipped: dict, runs: Path, results: Path, names: list[str]) -> dict:
    """`shipped` with the tables `names` taken anew from their reports (results/<name>.json) and the commits
    of the runs under `runs` added: for an experiment rerun apart from the rest of its scale (its own runs
    folder), whose other tables and curves stay as shipped. A report must cover several of the shipped
    seeds (one seed's band would be the tolerance alone)."""
    content = {**shipped, "tables": dict(shipped["tables"]), "table_seeds": dict(shipped["table_seeds"]),
               "run_commits": dict(shipped.get("run_commits", {}))}
    for name in names:
        file = results / f"{name}.json"
        if not file.is_file():
            raise UsageError(f"{file}: no such report; run `repro.py {name}` first")
        report_content = checkpoint.loads(file.read_text())
        own = report_content.get("seeds") or []
        if len(own) < 2 or not set(own) <= set(shipped["seeds"]):
            raise UsageError(f"{file}: its seeds {own} are not several of the shipped seeds {shipped['seeds']}")
        content["tables"][name], content["table_seeds"][name] = report_numbers(report_content), own
        content["run_commits"].update(run_commits(runs, own))
    return report.finite(content)


def run_commits(runs: Path, seeds: list[int]) -> dict[str, str | None]:
    """{run folder relative to runs/<scale>/: the kit's commit that trained it (its provenance.json)}, for
    every run of the seeds (the suite's, beyond/'s) and the teacher, so when a run ran relative to the
    rule that governs it can be checked against `git log`."""
    folders = [d for seed in seeds for d in runs.glob(f"s{seed}/*")] + \
        [d for seed in seeds for d in runs.glob(f"beyond/*/s{seed}/*")] + [runs / "teacher"]
    return {str(d.relative_to(runs)): rundir.read_json(d / "provenance.json").get("git_commit")
            for d in sorted(folders) if (d / "provenance.json").is_file()}


def report_numbers(content: dict) -> dict[str, list]:
    """Every number over seeds in a report, by name, as its per-seed values: a table's rows by key; the
    experiments beyond the paper (regime points, placements, interventions and their contrasts, the planted
    interactions) by row name and quantity; a report of named numbers (scratch's `numbers`, planted's
    `delta_grow`) by name."""
    numbers = {}
    for row in content.get("rows", []) + content.get("points", []) + content.get("separations", []) + \
            content.get("interactions", []):
        if "key" in row:
            numbers[row["key"]] = row["values"]
            continue
        name = row.get("variant") or row.get("placement") or row.get("point") or row.get("label") or \
            row.get("contrast") or row.get("dose")
        for quantity, value in row.items():
            if isinstance(value, dict) and "values" in value:
                numbers[f"{name}: {quantity}"] = value["values"]
    for key, value in content.get("numbers", {}).items():
        numbers[key] = value["values"]
    for key, value in content.get("delta_grow", {}).items():
        numbers[f"delta_grow: {key}"] = value["values"]
    return numbers


def band(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    mean, n = statistics.fmean(finite), len(finite)
    spread = report.t975(n - 1) * statistics.stdev(finite) * math.sqrt(1 + 1 / n) if n > 1 else 0.0
    half = max(spread, 0.01 * abs(mean) + 0.001)
    return mean - half, mean + half


def measured(target: Path) -> dict[str, float]:
    """{name: value} of what `target` holds: one run, a scale's runs folder, or a results folder."""
    target = Path(target)
    if (target / "metrics.jsonl").is_file():
        return run_numbers(target)
    if any(target.glob("s*/*/metrics.jsonl")):
        return {f"{d.parent.name}/{k}": v for d in sorted(target.glob("s*/*")) if (d / "metrics.jsonl").is_file()
                for k, v in run_numbers(d).items()}
    values = {}
    for file in sorted(target.glob("*.json")):
        for key, seeds in report_numbers(checkpoint.loads(file.read_text())).items():
            for i, value in enumerate(seeds):
                values[f"{file.stem}/{key}/{i}"] = value
    return values


def run_numbers(run_dir: Path) -> dict[str, float]:
    numbers = {f"{run_dir.name}/ce at {point}": ce for point, ce in curve(run_dir).items()}
    if (run_dir / "done.json").is_file():
        numbers[f"{run_dir.name}/final ce"] = rundir.final_eval(run_dir)["ce"]  # checked against its own log
    return numbers


def reference_values(reference: dict, name: str) -> list[float] | None:
    """The shipped seeds' values for a measured number's name (the seed folder and table seed dropped)."""
    parts = name.split("/")
    if len(parts) == 3 and parts[0].startswith("s") and parts[0][1:].isdigit():
        parts = parts[1:]  # s<seed>/<run>/<number>: any seed's run compares with the run's band
    if len(parts) == 3:  # <experiment>/<row key>/<seed index>
        return reference["tables"].get(parts[0], {}).get(parts[1])
    run, number = parts
    if number == "final ce":
        return reference["final_ce"].get(run)
    return reference["curves"].get(run, {}).get(number.removeprefix("ce at "))


def compare(target: Path, reference: dict) -> list[dict]:
    """Per number of `target` that the reference has: {"name", "value", "band", "within"}."""
    rows = []
    for name, value in measured(target).items():
        values = reference_values(reference, name)
        if not values:
            continue
        lo, hi = band(values)
        if value is None or not math.isfinite(value):  # n/a, never or diverged (null in JSON): fine if a seed had it too
            within = any(v is None or not math.isfinite(v) for v in values)
        elif math.isnan(lo):
            continue  # the reference has no finite value to compare a finite one with
        else:
            within = lo <= value <= hi
        rows.append({"name": name, "value": value, "band": [lo, hi], "within": within})
    return rows


# ----------------------------------------------------------------------------------------------
# The commands: `reference` writes the shipped file, `compare` checks against it

def write(scale: str, seeds: list[int], force: bool, runs: Path, results: Path) -> str:
    """references/<scale>.json from the finished runs and reports of `seeds` (runs/<scale>, results/<scale>);
    the line that says what it wrote."""
    missing = [seed for seed in seeds if not (runs / f"s{seed}").is_dir()]
    if missing:
        raise UsageError(f"{runs / f's{missing[0]}'}: no runs of seed {missing[0]}; run them first")
    check_reports(results)
    content = collect(runs, results, seeds)
    if not content["curves"]:
        raise UsageError(f"no finished runs of seeds {seeds} under {runs}; run them first")
    REFERENCES.mkdir(exist_ok=True)
    path = REFERENCES / f"{scale}.json"
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
    shipped = rundir.read_json(path)
    if sorted(seeds) != sorted(shipped["seeds"]):
        raise OptionError("--seeds", f"{path} ships seeds {shipped['seeds']}; its tables take the same seeds")
    if not names or not force:
        raise UsageError(f"{path}: the kit ships it and `compare` checks against it; name the tables and add "
                         "--force to replace them (git checkout restores it)")
    check_reports(results)
    checkpoint.write_json(path, with_tables(shipped, runs, results, names), indent=1)
    return f"wrote {path}: tables {', '.join(names)} from {results}, seeds {seeds}"


def check_reports(folder: Path):
    """Every JSON file in a folder (reports, or a run's own files) reads as an object, each one that
    does not named in one line: this module reads them with json alone."""
    for file in sorted(folder.glob("*.json")):
        rundir.read_json(file)


def print_comparison(target: Path, scale: str) -> list[dict]:
    """compare() of `target` against the shipped reference of `scale`, printed as a table (the numbers
    outside the band, else the first 20); its rows."""
    path = REFERENCES / f"{scale}.json"
    if not path.is_file():
        raise UsageError(f"no shipped reference for --scale {scale} ({path}); make one with `repro.py reference`")
    shipped = rundir.read_json(path, "curves", "final_ce", "tables", "seeds")
    check_reports(target)
    rows = compare(target, shipped)
    if not rows:
        raise UsageError(f"{target}: holds no run or table that {path} has numbers for")
    table = Table(title=f"{target} against {path.name} (seeds {shipped['seeds']})")
    for column in ("number", "value", "band", "within"):
        table.add_column(column)
    outside = [r for r in rows if not r["within"]]
    for r in outside or rows[:20]:
        table.add_row(r["name"], f"{r['value']:.4f}", f"[{r['band'][0]:.4f}, {r['band'][1]:.4f}]",
                      "yes" if r["within"] else "NO")
    suite.console.print(table)
    suite.console.print(f"{len(rows) - len(outside)} of {len(rows)} numbers within the band")
    return rows
