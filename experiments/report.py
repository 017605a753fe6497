"""Reports: statistics over seeds (mean, sample std, a 95% t-interval), the cells and tables they are printed in,
and the writing of results/<scale>/<report>.json and .md, so that one number looks the same in every report.

    stats = report.across_seeds([3.26, 3.25, 3.26])    # {"mean", "std", "ci95", "n", "values"}
    report.stats_cell(stats)                            # "3.2567 [3.2438, 3.2695]"
    report.write(Path("results/toy"), "table1", numbers, markdown_lines)
"""

import hashlib
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from scipy.stats import t as student_t

import rundir
from experiments.suite import RunName, Workspace, console
from plumbing import checkpoint

# Statistics over seeds

def t_quantile(df: int, p: float) -> float:
    return float(student_t.ppf(p, df))


def reading(s: dict, margin: float, p_adjusted: float | None = None) -> str:
    """How a difference over seeds reads, by the rule fixed before the results (readings.RULE); in a family, by
    `p_adjusted`, its p adjusted over the family by holm. A diverged seed or a single seed gives no reading."""
    if s.get("diverged"):
        return f"no reading: {diverged_text(s)}"
    if s["n"] < 2 or not math.isfinite(s["std"]):
        return "no reading: one seed"
    lo, hi = s["ci95"]
    if (hi < 0 or lo > 0) if p_adjusted is None else p_adjusted < 0.05:
        return "below 0" if s["mean"] < 0 else "above 0"
    return tie_or_inconclusive(s, margin)


def tie_or_inconclusive(s: dict, margin: float) -> str:
    """"a tie within ±margin" if the 90% t-interval lies inside ±margin (two one-sided tests at 5%)."""
    return f"a tie within ±{margin:g}" if smallest_tie_margin(s) < margin else "inconclusive"


def smallest_tie_margin(s: dict) -> float:
    """The smallest margin a tie could have been read within: |mean| plus the 90% interval's half-width (nan with
    under two seeds or a diverged one)."""
    if s.get("diverged") or s["n"] < 2 or not math.isfinite(s["std"]):
        return math.nan
    return abs(s["mean"]) + t_quantile(s["n"] - 1, 0.95) * s["std"] / math.sqrt(s["n"])


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of m p-values (family-wise error), in the input's order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def p_two_sided(s: dict) -> float:
    """The one-sample t-test's two-sided p-value that the mean over seeds is 0 (nan: no spread)."""
    if s.get("diverged") or s["n"] < 2 or not s["std"]:
        return math.nan
    return float(2 * student_t.sf(abs(s["mean"]) / (s["std"] / math.sqrt(s["n"])), s["n"] - 1))


class Diverged(float):
    """A diverged run's number: NaN that stays Diverged through a table's arithmetic, so every report shows
    "diverged" and counts it, never a number with a verdict."""

    def __new__(cls):
        return super().__new__(cls, math.nan)

    def _diverged(self, *_):
        return DIVERGED

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _diverged
    __neg__ = __abs__ = _diverged

    def __repr__(self):
        return "diverged"


DIVERGED = Diverged()


def across_seeds(values: list[float]) -> dict:
    """mean, sample std and a 95% t-interval of one number over the seeds whose runs did not diverge."""
    if diverged := sum(isinstance(v, Diverged) for v in values):
        kept = [v for v in values if not isinstance(v, Diverged)]
        stats = across_seeds(kept) if kept else {"mean": math.nan, "std": math.nan, "ci95": None, "n": 0}
        return {**stats, "values": [None if isinstance(v, Diverged) else v for v in values], "diverged": diverged}
    n = len(values)
    if not all(math.isfinite(v) for v in values):  # "n/a" (NaN) or "never" (inf) on some seed: no spread
        return {"mean": sum(values) / n, "std": math.nan, "ci95": None, "n": n, "values": values}
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    half = t_quantile(n - 1, 0.975) * std / math.sqrt(n) if n > 1 else None
    return {"mean": mean, "std": std, "ci95": [mean - half, mean + half] if half is not None else None,
            "n": n, "values": values}


def paired(a: list[float], b: list[float]) -> dict:
    return across_seeds([x - y for x, y in zip(a, b)])


# Finished runs as reports count them: a final CE, or a divergence said in every report

def final_ce(ws: Workspace, run: RunName, seed: int) -> float:
    """The scheduled endpoint's validation CE (never a best checkpoint), or DIVERGED."""
    result = rundir.final_eval(ws.run_dir(run, seed))
    return DIVERGED if result.get("diverged") else result["ce"]


def diverged_runs(ws: Workspace, runs, seeds) -> list[str]:
    """'<run> s<seed> (step <n>: <why>)' for each run of `runs` x `seeds` that diverged."""
    return [f"{run.name} s{seed} (step {record['step']}: {record['why']})" for seed in seeds for run in runs
            if (record := rundir.final_eval(ws.run_dir(run, seed)).get("diverged"))]


def diverged_line(diverged: list[str], total: int) -> str:
    """A report's count of its diverged runs among `total`, said even when none did."""
    if not diverged:
        return f"Diverged: none of {total} runs."
    return (f"Diverged: {len(diverged)} of {total} runs, shown as diverged and left out of every mean and "
            f"interval: {'; '.join(diverged)}.")


# Cells and tables

TOKENS = -1  # Row.digits of a token count: printed as 3.11B, 312.40k, ...


@dataclass
class Row:
    label: str
    key: str
    paper: float | None
    digits: int = 4
    compare: bool = True  # "kit - paper" is shown only where both are in the same units at every scale
    sign: bool = False    # a difference whose sign is the paper's claim: below full scale, is the sign the same?


def fmt(value, digits):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if digits == TOKENS:
        unit, size = next(((u, s) for u, s in (("B", 1e9), ("M", 1e6), ("k", 1e3)) if abs(value) >= s), ("", 1))
        return f"{value / size:.2f}{unit}"
    return f"{value:.{digits}f}"


def configs_hash(run_dirs: list[Path]) -> str:
    """sha256 over the config.json of every run a report reads (which settings made it), in order."""
    digest = hashlib.sha256()
    for run_dir in run_dirs:
        digest.update((Path(run_dir) / "config.json").read_bytes())
    return digest.hexdigest()


def figure_table(rows: list[tuple]) -> list[str]:
    """A figure's numbers as Markdown: (quantity, kit, paper) with numbers to 5 significant digits."""
    cell = lambda v: "" if v is None else f"{v:.5g}" if isinstance(v, float) else str(v)
    return ["| quantity | kit | paper |", "| --- | --- | --- |"] + [f"| {q} | {cell(k)} | {cell(p)} |" for q, k, p in rows]


def diverged_text(s: dict) -> str:
    return f"{s['diverged']} of {s['diverged'] + s['n']} diverged" if s.get("diverged") else ""


def kit_cell(s: dict, digits: int) -> str:
    if s.get("diverged"):
        return f"diverged ({diverged_text(s)})" if not s["n"] else f"{kit_cell({**s, 'diverged': 0}, digits)}; " \
            f"{diverged_text(s)}"
    if s["n"] == 1 or s["ci95"] is None:
        return fmt(s["mean"], digits) if s["n"] == 1 else f"{fmt(s['mean'], digits)} (per seed: " \
            + ", ".join(fmt(v, digits) for v in s["values"]) + ")"
    lo, hi = s["ci95"]
    return f"{fmt(s['mean'], digits)} ± {fmt(s['std'], digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


def comparison(r: Row, s: dict, full: bool) -> str:
    """At full scale, kit - paper; below it only a direction: for a difference whose sign is the paper's claim,
    whether the kit's sign is the same (and whether the seeds' interval excludes zero)."""
    if r.paper is None:
        return ""
    if s.get("diverged"):
        return f"none: {diverged_text(s)}"
    if full:
        return fmt(s["mean"] - r.paper, r.digits) if r.compare else ""
    if not r.sign or math.isnan(s["mean"]):
        return ""
    same = "same sign" if (s["mean"] > 0) == (r.paper > 0) else "OPPOSITE sign"
    lo, hi = s["ci95"] or (s["mean"], s["mean"])
    return same + (", interval excludes 0" if lo > 0 or hi < 0 else ", interval includes 0") * (s["n"] > 1)


def comparison_column(full: bool) -> str:
    return "kit − paper" if full else "direction vs the paper"


def table_cells(rows: list[Row], stats: dict, full: bool) -> list[tuple[str, str, str, str]]:
    """Each row's cells: quantity, the kit's cell, the paper's, the comparison."""
    return [(r.label, kit_cell(stats[r.key], r.digits), fmt(r.paper, r.digits), comparison(r, stats[r.key], full))
            for r in rows]


def table_markdown(rows: list[Row], stats: dict, n_seeds: int, full: bool = False) -> list[str]:
    kit = "kit" if n_seeds == 1 else f"kit (mean ± std [95% CI], {n_seeds} seeds)"
    return [f"| quantity | {kit} | paper | {comparison_column(full)} |", "| --- | --- | --- | --- |"] + \
        [f"| {' | '.join(cells)} |" for cells in table_cells(rows, stats, full)]


def terminal_table(title: str, rows: list[Row], stats: dict, n_seeds: int, full: bool = False) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("quantity", "kit" if n_seeds == 1 else f"kit ({n_seeds} seeds)", "paper", comparison_column(full)):
        table.add_column(column, justify="left" if column == "quantity" else "right")
    for cells in table_cells(rows, stats, full):
        table.add_row(*cells)
    return table


def stats_cell(s: dict, signed: bool = False) -> str:
    if s.get("diverged"):
        return f"diverged ({diverged_text(s)})" if not s["n"] else \
            f"{stats_cell({**s, 'diverged': 0}, signed)} ({diverged_text(s)})"
    mean = f"{s['mean']:+.4f}" if signed else f"{s['mean']:.4f}"
    if not s.get("ci95"):
        return mean
    lo, hi = s["ci95"]
    return f"{mean} [{lo:+.4f}, {hi:+.4f}]" if signed else f"{mean} [{lo:.4f}, {hi:.4f}]"


def per_seed_text(values: list) -> str:
    """A difference's value on every seed, signed; n/a where a seed has none (a diverged run, a null)."""
    return ", ".join("n/a" if v is None or not math.isfinite(v) else f"{v:+.4f}" for v in values)


def seeds_text(seeds: list[int]) -> str:
    return f"mean [95% t-interval] over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0]}"


def finite(value):
    """A report's numbers as strict JSON holds them: a number that is not one (n/a, never) is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return [finite(v) for v in value] if isinstance(value, (list, tuple)) else value


def row_numbers(rows: dict[str, dict]) -> dict[str, list]:
    """A report's `numbers` ({name: row}): every number over seeds of a row as "<name>: <quantity>": its per-seed
    values (null: n/a)."""
    return {f"{name}: {quantity}": finite(value["values"]) for name, row in rows.items()
            for quantity, value in row.items() if isinstance(value, dict) and "values" in value}


def write(folder: Path, name: str, out: dict, lines: list[str], echo: bool = False) -> dict:
    """A report as folder/<name>.json (the numbers) and folder/<name>.md (the table, printed if `echo`); returns `out`."""
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint.write_json(folder / f"{name}.json", finite(out), default=str)
    checkpoint.write_atomic(folder / f"{name}.md", "\n".join(lines) + "\n")
    if echo:
        console.print("\n".join(lines), markup=False)
    return out

