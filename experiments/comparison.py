"""A run, a scale's runs or a results folder checked against the shipped seeds (`repro.py compare`): a number is
within its band when it lies within mean ± max(a 95% prediction interval for one more seed, a tolerance): seeds set
the band's width where there are several, the tolerance (1% of the value + 0.001) where they agree.

    python repro.py compare runs/toy                           # every run of every seed, against references/toy.json
    python repro.py compare runs/toy/s42/post-grow             # one run
    python repro.py compare runs/toy/beyond/tail-37            # a variant's runs, against its study's records
    python repro.py compare results/toy                        # the tables

What a run is comes from its config.json, never its folder: a suite run's band is the reference's of its name, any other's
(a variant's, though it shares a suite run's name, or a --set run's) its study's records of its settings but the seed.
"""

import math
import re
import statistics
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

import rundir
from config import PATH_FIELDS
from experiments import report, studies, suite
from experiments.presets import PRESETS
from experiments.record_files import digest, training_settings
from experiments.reference import REFERENCES, load, points, read_report
from experiments.studies import RECORDS_DIR
from plumbing import checkpoint
from plumbing.errors import KitError, OptionError, UsageError


def band(values: list[float]) -> tuple[float, float]:
    if not (finite := [v for v in values if v is not None and math.isfinite(v)]):
        return math.nan, math.nan
    mean, n = statistics.fmean(finite), len(finite)
    spread = report.t_quantile(n - 1, 0.975) * statistics.stdev(finite) * math.sqrt(1 + 1 / n) if n > 1 else 0.0
    half = max(spread, 0.01 * abs(mean) + 0.001)
    return mean - half, mean + half


def measured(target: Path) -> dict[str, float]:
    """{name: value} of what `target` holds: one run, a scale's runs folder, or a results folder (each report read
    as `reference` reads it)."""
    if runs := run_folders(target):
        return {f"{label(run, target)}/{k}": v for run in runs if (run / "metrics.jsonl").is_file()
                for k, v in run_numbers(run).items()}
    return {f"{file.stem}/{key}/{i}": value for file in sorted(target.glob("*.json"))
            for key, seeds in read_report(file)[1].items() for i, value in enumerate(seeds)}


def run_numbers(run_dir: Path) -> dict[str, float]:
    numbers = {f"ce at {point}": ce for point, ce in points(rundir.read_metrics(run_dir)).items()}
    if (run_dir / "done.json").is_file():
        numbers["final ce"] = rundir.final_eval(run_dir)["ce"]  # checked against its own log
    return numbers


def compare(target: Path, reference: dict, records: Path | None = None) -> list[dict]:
    """Per number of `target` that has a band: {"name", "value", "band", "within"}; a variant's band from the
    records of `records` (its scale's: <records>/<scale>/; None: none)."""
    rows, bands = [], run_bands(target, reference, records)
    for name, value in measured(target).items():
        run, _, number = name.rpartition("/")
        values = bands[run].get(number) if run in bands else table_values(reference, name)
        if not values:
            continue
        lo, hi = band(values)
        if not checkpoint.finite_number(value):  # n/a, never or diverged (null in JSON): fine if a seed had it too
            within = any(v is None or not math.isfinite(v) for v in values)
        elif math.isnan(lo):
            continue  # the reference has no finite value to compare a finite one with
        else:
            within = lo <= value <= hi
        rows.append({"name": name, "value": value, "band": [lo, hi], "within": within})
    return rows


def table_values(reference: dict, name: str) -> list[float] | None:
    """The shipped seeds' values of a report's number, <experiment>/<row key>/<seed index>."""
    experiment, key, _ = name.rsplit("/", 2)
    return reference["tables"].get(experiment, {}).get(key)


def run_bands(target: Path, reference: dict, records: Path | None) -> dict[str, dict[str, list]]:
    """{run as `measured` names it: {number: the seeds' values}}: a suite run's from the reference by its config's
    name, a variant's from the records of its settings but the seed (variant_band); none for a run without settings."""
    stored, recorded = {run: settings(run) for run in run_folders(target)}, {}
    is_suite = {run: bool(its) and suite_run(its) for run, its in stored.items()}  # each builds every scale's config
    if records and not all(is_suite[run] for run, its in stored.items() if its):
        for _, record in studies.study_records(records):  # each checked whole
            recorded.setdefault(unseeded(record["config"]), []).append(record)
    return {label(run, target): {} if not its else variant_band(run, its, recorded, records) if not is_suite[run] else {
            **{f"ce at {point}": values for point, values in reference["curves"].get(its["name"], {}).items()},
            **({"final ce": reference["final_ce"][its["name"]]} if its["name"] in reference["final_ce"] else {})}
            for run, its in stored.items()}


def settings(run: Path) -> dict | None:
    """A run's config.json, None without one."""
    return rundir.read_json(run / "config.json") if (run / "config.json").is_file() else None


def suite_run(stored: dict) -> bool:
    """Whether a run's settings are a suite run's at a scale they name (scales_named): those suite.run_config gives
    the run its "name" names (the suite's RunName of its norm with that .name) at its seed, compared as
    training_settings compares them but for PATH_FIELDS (relative to the run's folder, they differ by where a runs
    tree sits, as start_from and teacher do)."""
    same = lambda values: {k: v for k, v in training_settings(values).items() if k not in PATH_FIELDS}
    named = [r for r in (suite.RunName(stored.get("norm"), p) for p in suite.RUN_PROTOCOLS) if r.name == stored.get("name")]
    suite_settings = lambda scale: checkpoint.loads(checkpoint.json_text(asdict(
        suite.run_config(suite.workspace(scale, Path("runs"), dry_run=True), named[0], stored.get("seed")))))
    try:
        return bool(named) and any(same(suite_settings(scale)) == same(stored) for scale in scales_named(stored))
    except KitError:  # a norm or seed no suite run has, at any scale
        return False


def scales_named(stored: dict) -> list[str]:
    """The scales whose preset's run settings a run's settings hold (but the seed, its own): how compare names a run's
    scale, a suite run's (every suite run holds its preset's) and a variant's (which sets what its study changes)."""
    return [name for name, preset in PRESETS.items() if all(
        stored.get(k, v) == v for k, v in checkpoint.loads(checkpoint.json_text(preset.run)).items() if k != "seed")]


def variant_band(run: Path, stored: dict, recorded: dict[str, list[dict]], records: Path | None) -> dict[str, list]:
    """A variant's run's band: its records, found by what the run is (unseeded), never by its folder's name; one
    line naming the fix where fewer than two seeds are recorded."""
    same = recorded.get(unseeded(stored), [])
    if len(same) < 2:
        raise UsageError(f"{run}: a variant's run (its settings are not the suite's {stored.get('name')}), and {records} "
                         f"holds {len(same)} record{'s' * (len(same) != 1)} of its settings (a band needs two seeds or "
                         "more): record it over seeds with the study that trains it (`repro.py <study> --seeds 42,43,44` "
                         "records each run it finishes there), then compare again")
    curves = [points(r["metrics"]) for r in same]
    return {**{f"ce at {point}": [c[point] for c in curves] for point in curves[0] if all(point in c for c in curves)},
            "final ce": [r["done"].get("ce") for r in same]}


def unseeded(stored: dict) -> str:
    """What a run is but for its seed: its settings as a record hashes them, the seed and the seed's folder in a
    path (a freeze run's start_from, ../s42/pre-grow/phase-0) taken out, so every seed of a variant gives one."""
    seed = re.compile(rf"(?<![^/])s{stored.get('seed')}(?![^/])")
    return digest({key: seed.sub("s*", value) if isinstance(value, str) else value
                   for key, value in training_settings(stored).items() if key != "seed"})


def label(run: Path, target: Path) -> str:
    """A run as compare names it: by its folder's name, or <seed folder>/<run> in a runs folder."""
    return run.name if run == target else f"{run.parent.name}/{run.name}"


def check_scale(target: Path, scale: str, path: Path):
    """Runs or reports of another scale would put every number outside the band: one line instead."""
    for file, theirs in made_at(target):
        if theirs != scale:
            raise UsageError(f"{file}: of scale {theirs}, and {path} holds scale {scale}'s numbers (every number "
                             f"would fall outside their band); compare with --scale {theirs}")


def run_folders(target: Path) -> list[Path]:
    """`target` if it is a run (one that has logged, or only been set up), else the runs of its seeds."""
    is_run = lambda d: (d / "metrics.jsonl").is_file() or (d / "config.json").is_file()
    return [target] if is_run(target) else [d for d in sorted(target.glob(suite.run_folder("*", "*"))) if is_run(d)]


def made_at(target: Path) -> list[tuple[Path, str]]:
    """(file, scale) for each report or run under `target` whose "scale" or run settings name the scale made it."""
    said = [(file, rundir.read_json(file).get("scale")) for file in sorted(target.glob("*.json"))]
    said += [(run / "config.json", name) for run in run_folders(target) if (stored := settings(run)) is not None
             for name in scales_named(stored)]
    return [(file, scale) for file, scale in said if isinstance(scale, str)]


def print_comparison(target: Path, scale: str, records: Path = RECORDS_DIR) -> list[dict]:
    """compare() of `target`, printed as a table (the numbers outside the band, else the first 20); its rows."""
    path, shipped = REFERENCES / f"{scale}.json", load(scale)
    check_scale(target, scale, path)  # reads every *.json first: one that is not a JSON object is named in one line
    rows = compare(target, shipped, records / scale)
    if not rows and not not_yet(target, shipped, records / scale):
        raise UsageError(f"{target}: holds no run or table that {path} has numbers for")
    stored = [its for run in run_folders(target) if (its := settings(run))]
    variants = bool(stored) and not any(map(suite_run, stored))
    made_in = "" if variants else precisions(shipped.get("run_precisions", {}).values())
    table = Table(title=f"{target} against the variant's records in {records / scale}" if variants else
                  f"{target} against {path.name} (seeds {shipped['seeds']}; its runs in "
                  f"{made_in or 'a precision it does not record'})")
    for column in ("number", "value", "band", "within"):
        table.add_column(column)
    outside = [r for r in rows if not r["within"]]
    for r in outside or rows[:20]:
        table.add_row(r["name"], f"{r['value']:.4f}", f"[{r['band'][0]:.4f}, {r['band'][1]:.4f}]",
                      "yes" if r["within"] else "NO")
    suite.console.print(table)
    suite.console.print(f"{len(rows) - len(outside)} of {len(rows)} numbers within the band")
    theirs = precisions(rundir.read_json(run / "provenance.json").get("precision") for run in run_folders(target)
                        if (run / "provenance.json").is_file())
    if made_in and theirs and theirs != made_in:
        suite.console.print(f"note: the bands come from {made_in} runs and these ran in {theirs}: a band measures the "
                            f"seeds' spread in {made_in}, not what another precision's rounding adds", markup=False)
    return rows


def not_yet(target: Path, reference: dict, records: Path | None = None) -> list[tuple[str, Path, list[str]]]:
    """(run as compare names it, its folder, the numbers its band has that it lacks) of each unfinished run."""
    have, bands = measured(target), run_bands(target, reference, records)
    return [(label(run, target), run, [n for n in bands[label(run, target)] if f"{label(run, target)}/{n}" not in have])
            for run in run_folders(target) if bands[label(run, target)] and not (run / "done.json").is_file()]


def check(target: Path, scale: str | None, records: Path = RECORDS_DIR):
    """`repro.py compare` (`scale` None: the one its runs' settings or its reports name, made_at): print_comparison,
    then one line, exit 1, if a number is outside its band or an unfinished run lacks numbers its band has."""
    named = sorted({theirs for _, theirs in made_at(target)})
    if not (scale := scale or (named[0] if len(named) == 1 else None)):
        raise OptionError("--scale", f"{target} names {'scales ' + ' and '.join(named) if named else 'no scale'} (by its "
                          "runs' settings or its reports' \"scale\"); pass --scale")
    rows = print_comparison(target, scale, records)
    outside = [r for r in rows if not r["within"]]
    problems = [f"{len(outside)} of {len(rows)} numbers of {target} are outside the shipped seeds' band (first: "
                f"{outside[0]['name']} = {outside[0]['value']:.4f})"] if outside else []
    if pending := not_yet(target, load(scale), records / scale):
        runs = ", ".join(f"{name} {suite.run_status(run)}" for name, run, _ in pending)
        name, _, lacking = pending[0]
        problems.append(f"unfinished: {runs}; {sum(len(p[2]) for p in pending)} numbers {scale}.json has for them do "
                        f"not exist yet (first: {name}/{lacking[0]}): finish the runs (rerun the command that trains "
                        "them: it resumes) and compare again")
    if problems:
        raise KitError("; ".join(problems))


def precisions(values) -> str:
    """The precisions a set of runs computed in, in words ("float32", "bfloat16 and float32"); "" if none is known."""
    return " and ".join(sorted({v for v in values if v}))
