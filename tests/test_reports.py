"""Reports and references: statistics over seeds (t intervals, readings, Holm), the comparison with the
paper, the tables' and the regime map's numbers, references collected, shipped and compared."""
import json
import math
import statistics
from pathlib import Path

import pytest

from experiments import comparison, report, tables
from plumbing import errors

ROOT = Path(__file__).resolve().parents[1]


def test_numbers_that_are_not_applicable_or_never_reached_on_some_seed():
    """A recovery that never came (inf) or never applied (NaN) on one seed: no spread, every seed shown."""
    s = report.across_seeds([11.0, math.inf, 5.0])
    assert s["mean"] == math.inf and s["ci95"] is None
    assert report.kit_cell(s, 0) == "inf (per seed: 11, inf, 5)"
    assert report.kit_cell(report.across_seeds([math.nan, 3.0]), 0) == "n/a (per seed: n/a, 3)"


def test_comparison_with_the_paper_by_scale():
    stats = lambda mean, lo, hi: {"mean": mean, "std": 0.1, "ci95": [lo, hi], "n": 3}
    delta = report.Row("delta grow", "delta_grow", -0.0328, sign=True)
    assert report.comparison(delta, stats(-0.05, -0.08, -0.02), full=True) == "-0.0172"
    assert report.comparison(delta, stats(-0.05, -0.08, -0.02), full=False) == "same sign, interval excludes 0"
    assert report.comparison(delta, stats(0.01, -0.02, 0.04), full=False) == "OPPOSITE sign, interval includes 0"
    tokens = report.Row("tokens", "t", 3.11e9, report.TOKENS, compare=False)
    assert report.comparison(tokens, stats(1e6, 1e6, 1e6), full=True) == ""  # other units: no difference
    level = report.Row("pre-norm, grow", "pre_grow", 2.7658)
    assert report.comparison(level, stats(3.2, 3.1, 3.3), full=False) == ""  # an absolute value below full


def test_t_quantile_is_exact_for_any_number_of_seeds():
    # Published two-sided 95% critical values of Student's t.
    known = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 9: 2.2622, 31: 2.0395, 45: 2.0141, 120: 1.9799}
    for df, value in known.items():
        assert report.t_quantile(df, 0.975) == pytest.approx(value, abs=1e-4), df
    s = report.across_seeds([1.0, 2.0, 4.0])
    half = 4.30265 * statistics.stdev([1.0, 2.0, 4.0]) / math.sqrt(3)
    assert s["ci95"] == pytest.approx([7 / 3 - half, 7 / 3 + half], abs=1e-4)
    # One-sided 95% critical values (a 90% two-sided interval, for TOST), and the t-test's p-value back at them.
    for df, value in {1: 6.3138, 2: 2.9200, 4: 2.1318, 10: 1.8125}.items():
        t = report.t_quantile(df, 0.95)
        assert t == pytest.approx(value, abs=1e-4), df
        at_t = {"mean": t, "std": math.sqrt(df + 1), "n": df + 1}  # a mean t standard errors from 0
        assert report.p_two_sided(at_t) == pytest.approx(0.10, abs=1e-9), df


def test_readings_by_the_pre_declared_rule_and_holms_correction():
    """Below 0 by a 95% interval; a tie when the 90% interval lies inside +-0.01 (TOST); else inconclusive;
    a diverged seed or a single seed is no reading. Holm's adjustment by hand."""
    read = lambda values: report.reading(report.across_seeds(values), 0.01)
    assert read([-0.030, -0.031, -0.029]) == "below 0"
    assert read([0.030, 0.031, 0.029]) == "above 0"
    # mean 0, sd 0.005, n 3: 95% half-width 0.0124 (includes 0), 90% half-width 2.92 x 0.005 / sqrt(3) = 0.0084
    assert read([-0.005, 0.0, 0.005]) == "a tie within ±0.01"
    assert read([-0.02, 0.0, 0.02]) == "inconclusive"  # 90% half-width 0.034
    assert read([-0.02, report.DIVERGED, 0.01]).startswith("no reading: 1 of 3 diverged")
    assert read([0.001]) == "no reading: one seed"
    assert report.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert report.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    # The one-sample t-test: mean 1, sd 1, n 4 -> t = 2, df 3 -> two-sided p = 0.1393
    assert report.p_two_sided(report.across_seeds([0.0, 1.0, 1.0, 2.0]) | {"std": 1.0}) == pytest.approx(0.1393, abs=1e-4)
    # In a family the sign needs the adjusted p: an interval that excludes 0 alone is not enough
    clear = report.across_seeds([-0.030, -0.031, -0.029])
    assert report.reading(clear, 0.01, 0.049) == "below 0"
    assert report.reading(clear, 0.01, 0.06) == "inconclusive"  # 90% interval [-0.032, -0.028]: no tie
    small = report.across_seeds([-0.004, -0.005, -0.006])  # excludes 0 by its interval, and inside +-0.01
    assert report.reading(small, 0.01) == "below 0" and report.reading(small, 0.01, 0.2) == "a tie within ±0.01"
    assert report.reading(report.across_seeds([-0.02, report.DIVERGED, 0.01]), 0.01, 0.01).startswith("no reading")


def test_references_hold_the_numbers_of_every_experiment_beyond_the_paper_too():
    """A placements-, intervention- or regime-shaped report names every quantity over seeds of a row by the name its
    writer gives the row (report.row_numbers), so `reference` ships it and `compare` checks it, as it does a paper
    table's rows; a number that is not one on a seed (n/a, diverged) is null, as in the JSON."""
    stats = lambda *v: report.across_seeds(list(v))
    rows = {"peri": {"placement": "peri", "joint": stats(3.39, 3.38), "delta_grow": stats(0.007, math.nan),
                     "settings": {"boundary": "none"}, "after_block_0": {"mean": [1.0, 2.0]}},
            "pre-grow + boundary-norm": {"variant": "pre-grow + boundary-norm", "ce": stats(3.25, report.DIVERGED)},
            "budget=2": {"point": "budget=2", "interaction": stats(-0.1, -0.2), "lr": 3e-3}}
    assert report.row_numbers(rows) == {
        "peri: joint": [3.39, 3.38], "peri: delta_grow": [0.007, None], "pre-grow + boundary-norm: ce": [3.25, None],
        "budget=2: interaction": [-0.1, -0.2]}


def test_boundary_numbers_read_block0_at_the_first_and_last_snapshot(monkeypatch):
    """The figures' mechanism over seeds: block 0's boundary (index 1; index 0 is the embedding) at the
    first and the last grow snapshot, planted values that differ everywhere else."""
    def snapshot(std, kurtosis, ratio):
        stats = lambda v: {"std": v, "kurtosis": v + 100, "kurtosis_distinct": v + 200}
        return {"boundary_stats": [stats(-1.0), {"std": std, "kurtosis": kurtosis, "kurtosis_distinct": kurtosis / 2},
                                   stats(-2.0)],
                "token_type_rms": [{"boundary_over_regular": -3.0}, {"boundary_over_regular": ratio}]}
    planted = {"pre": [snapshot(2.0, 9.0, 1.5), snapshot(3.0, 7.0, 1.2), snapshot(5.0, 60.0, 37.0)],
               "post": [snapshot(0.1, 3.0, 1.0), snapshot(0.2, 1.8, 0.98)]}
    monkeypatch.setattr(tables, "boundary_series", lambda ws, seed: planted)
    assert tables.boundary_numbers(None, 42) == {
        "pre_std_first": 2.0, "pre_std_end": 5.0, "pre_boundary_over_regular": 37.0, "pre_kurtosis": 60.0,
        "pre_kurtosis_distinct": 30.0, "post_std_first": 0.1, "post_std_end": 0.2, "post_boundary_over_regular": 0.98,
        "post_kurtosis": 1.8, "post_kurtosis_distinct": 0.9}
    keys = {row.key for name in ("fig4", "fig5", "figA1") for row in tables.TABLES[name].rows}
    assert keys == set(tables.boundary_numbers(None, 42))


def test_table3_numbers_put_both_placements_controls_into_the_interaction(monkeypatch):
    """grow − joint-longer per placement, and the interaction against each control, written out from the
    ten runs' CEs (arbitrary, distinct values; a diverged one stays diverged through the arithmetic)."""
    ce = {run.name: 3.0 + 0.01 * i * i for i, run in enumerate(tables.TABLE3_RUNS)}
    monkeypatch.setattr(report, "final_ce", lambda ws, run, seed: ce[run.name])
    out = tables.table3_numbers(None, 42)
    assert out["pre_grow_minus_longer"] == ce["pre-grow"] - ce["pre-joint-longer"]
    assert out["interaction"] == pytest.approx((ce["post-grow"] - ce["pre-grow"]) - (ce["post-joint"] - ce["pre-joint"]))
    for control in ("longer", "replay"):
        want = (ce["post-grow"] - ce["pre-grow"]) - (ce[f"post-joint-{control}"] - ce[f"pre-joint-{control}"])
        assert out[f"interaction_{control}"] == pytest.approx(want, abs=1e-12)
    ce["pre-joint-replay"] = report.DIVERGED
    out = tables.table3_numbers(None, 42)
    assert isinstance(out["interaction_replay"], report.Diverged) and not isinstance(out["interaction_longer"],
                                                                                     report.Diverged)


def test_a_reference_leaves_out_a_run_not_yet_finished_for_every_seed(tmp_path):
    """An experiment still training has finished some seeds' runs: the reference keeps only runs done
    for every seed, so no band is made from fewer seeds than it names."""
    from experiments import reference
    for seed, names in ((42, ("pre-grow", "peri-joint")), (43, ("pre-grow",))):
        for name in names:
            run = tmp_path / "runs" / f"s{seed}" / name
            run.mkdir(parents=True)
            done = {"ce": 3.0 + seed / 100, "ppl": math.exp(3.0 + seed / 100), "kd": 0.0, "step": 9}
            extra = json.dumps({**done, "step": 5, "eval": True}) + "\n" if seed == 42 else ""  # a point seed 43 lacks
            (run / "metrics.jsonl").write_text(extra + json.dumps({**done, "eval": True}) + "\n")
            (run / "done.json").write_text(json.dumps(done))
    (tmp_path / "results").mkdir()
    # reports over the reference's seeds, or two or more of them, ship, each with its seeds; one over a
    # single seed of several (no spread for a band) or over another seed does not
    for name, seeds in (("table1", [42, 43, 44]), ("regime", [42, 43]), ("scratch", [42]), ("placements", [42, 45])):
        numbers = {"peri: delta_grow": [0.01 * s for s in seeds]}
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps({"seeds": seeds, "numbers": numbers}))
    (tmp_path / "runs" / "s44").mkdir()
    ref = reference.collect(tmp_path / "runs", tmp_path / "results", [42, 43, 44])
    assert ref["final_ce"] == {} and ref["curves"] == {}  # seed 44 has no runs: nothing finished for every seed
    assert ref["table_seeds"] == {"regime": [42, 43], "table1": [42, 43, 44]}
    assert ref["tables"]["regime"] == {"peri: delta_grow": [0.42, 0.43]}
    ref = reference.collect(tmp_path / "runs", tmp_path / "results", [42, 43])
    assert ref["final_ce"] == {"pre-grow": [3.42, 3.43]} and ref["curves"] == {"pre-grow": {"9": [3.42, 3.43]}}
    assert ref["table_seeds"] == {"regime": [42, 43]}  # table1's seed 44 is not among these
    reference.check_reference(ref, tmp_path / "toy.json")  # what `reference` writes, `results` and `compare` read


def test_references_ship_and_compare_the_per_seed_values_of_every_report_shape(tmp_path):
    """Each report's `numbers` (scratch's quantities, planted's rows, interactions and Δgrow) ship as per-seed
    values, and `compare` checks a results folder's per-seed values against them: the shipped seeds' own values
    lie in their bands, a perturbed one does not."""
    from experiments import reference
    scratch = {"seeds": [42, 43, 44], "numbers": {"pre_joint": [4.60, 4.61, 4.62], "interaction": [0.281, 0.283, 0.285]}}
    planted = {"seeds": [42, 43, 44], "numbers": {"pre-grow (suite): ce": [3.50, 3.51, 3.52],
                                                  "the boundary token at 37x: interaction": [0.01, 0.02, 0.03],
                                                  "delta_grow: none": [-0.02, -0.03, -0.04]}}
    results = tmp_path / "results"
    results.mkdir()
    for name, content in (("scratch", scratch), ("planted", planted)):
        (results / f"{name}.json").write_text(json.dumps(content))
    for seed in (42, 43, 44):
        (tmp_path / "runs" / f"s{seed}").mkdir(parents=True)
    ref = reference.collect(tmp_path / "runs", results, [42, 43, 44])
    assert ref["tables"]["scratch"]["interaction"] == [0.281, 0.283, 0.285]
    rows = {r["name"]: r for r in comparison.compare(results, ref)}
    assert rows["scratch/interaction/2"]["value"] == 0.285 and all(r["within"] for r in rows.values())
    assert len(rows) == 2 * 3 + 3 * 3  # every per-seed value of both reports was checked
    scratch["numbers"]["interaction"] = [0.281, 0.283, 0.385]  # seed 44's interaction off by 0.1
    (results / "scratch.json").write_text(json.dumps(scratch))
    rows = {r["name"]: r for r in comparison.compare(results, ref)}
    assert not rows["scratch/interaction/2"]["within"] and rows["scratch/interaction/1"]["within"]


def test_a_report_over_seeds_that_names_no_numbers_is_refused_with_its_command(tmp_path):
    """An older kit's report (its rows, no `numbers`) is one line naming the file and the command that writes it
    anew, for `reference` and `compare` alike: no name of its numbers is guessed from its rows."""
    from experiments import reference
    results = tmp_path / "results" / "toy"
    results.mkdir(parents=True)
    rows = [{"variant": "pre-grow (suite)", "ce": report.across_seeds([3.50, 3.51, 3.52])}]
    (results / "planted.json").write_text(json.dumps({"seeds": [42, 43, 44], "rows": rows}))
    for seed in (42, 43, 44):
        (tmp_path / "runs" / f"s{seed}").mkdir(parents=True)
    for read in (lambda: reference.collect(tmp_path / "runs", results, [42, 43, 44]),
                 lambda: comparison.measured(results)):
        with pytest.raises(errors.UsageError, match=r"planted.json: .*older kit's\); rerun its command \(e.g. `repro.py "
                                                    r"planted --scale toy`\)"):
            read()


def test_a_reference_records_the_commit_that_trained_each_run(tmp_path):
    """Correction 12: each run's provenance commit (the suite's, beyond/'s and the teacher's) ships in the
    reference, so when a run ran relative to the rule that governs it can be checked."""
    from experiments import reference
    runs = tmp_path / "runs"
    for folder, commit in (("s42/pre-grow", "a" * 40), ("beyond/scratch/s42/pre-joint", "b" * 40),
                           ("teacher", "c" * 40), ("s45/pre-grow", "d" * 40)):
        (runs / folder).mkdir(parents=True)
        (runs / folder / "provenance.json").write_text(json.dumps({"git_commit": commit, "precision": "float32",
                                                                   "device": "cpu", "cpu": "AMD EPYC",
                                                                   "cpu_capability": "AVX2"}))
    (runs / "teacher" / "provenance.json").write_text(json.dumps({"git_commit": "c" * 40, "device": "NVIDIA H200"}))
    (tmp_path / "results").mkdir()
    ref = reference.collect(runs, tmp_path / "results", [42])
    assert ref["run_commits"] == {"s42/pre-grow": "a" * 40, "beyond/scratch/s42/pre-joint": "b" * 40,
                                  "teacher": "c" * 40}
    assert ref["run_precisions"] == {"s42/pre-grow": "float32", "beyond/scratch/s42/pre-joint": "float32", "teacher": None}
    # the machine as provenance.json says it: the CPU with the instructions torch used, or the GPU's name
    assert ref["run_machines"] == {"s42/pre-grow": "AMD EPYC (AVX2)", "beyond/scratch/s42/pre-joint": "AMD EPYC (AVX2)",
                                   "teacher": "NVIDIA H200"}


def test_compare_names_the_precision_its_bands_come_from(tmp_path, monkeypatch, capsys):
    """Issue 38: a band is the seeds' spread in the precision they ran in; compare's title says which, and a run
    of another precision is told so (its numbers are still compared)."""
    from conftest import suite_config

    from experiments import reference
    runs = tmp_path / "runs"
    for seed, ce in ((42, 3.50), (43, 3.52)):
        run = runs / f"s{seed}" / "pre-grow"
        run.mkdir(parents=True)
        (run / "config.json").write_text(suite_config("toy", "pre", "grow", seed))  # what the run is: toy's pre-grow
        evaluation = {"step": 250, "ce": ce, "kd": ce, "ppl": 2.718 ** ce}
        (run / "metrics.jsonl").write_text(json.dumps({**evaluation, "eval": True}) + "\n")
        (run / "done.json").write_text(json.dumps(evaluation))
        (run / "provenance.json").write_text(json.dumps({"git_commit": "a" * 40, "precision": "float32"}))
    (tmp_path / "results").mkdir()
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "toy.json").write_text(json.dumps(reference.collect(runs, tmp_path / "results", [42, 43])))
    monkeypatch.setattr(reference, "REFERENCES", tmp_path / "refs")
    comparison.print_comparison(runs / "s42" / "pre-grow", "toy")
    said = " ".join(capsys.readouterr().out.split())
    assert "its runs in float32" in said and "note:" not in said
    (runs / "s42" / "pre-grow" / "provenance.json").write_text(json.dumps({"precision": "bfloat16"}))
    rows = comparison.print_comparison(runs / "s42" / "pre-grow", "toy")
    said = " ".join(capsys.readouterr().out.split())
    assert "note: the bands come from float32 runs and these ran in bfloat16" in said and all(r["within"] for r in rows)


# A report that shows numbers over seeds must ship them per seed in references/toy.json. fig3 and figA2 are
# figures of one seed (their numbers are seed 42's plots), so they have no per-seed table.
SHIPPED_TOY = json.loads((ROOT / "references" / "toy.json").read_text())
ONE_SEED_FIGURES = {"fig3", "figA2"}


@pytest.mark.parametrize("table", sorted(set(SHIPPED_TOY["table_seeds"]) - ONE_SEED_FIGURES))
def test_the_shipped_toy_reference_holds_per_seed_values_for_every_table(table):
    seeds = SHIPPED_TOY["table_seeds"][table]
    numbers = SHIPPED_TOY["tables"][table]
    assert numbers, f"{table}: no per-seed values shipped"
    assert all(isinstance(v, list) and len(v) == len(seeds) for v in numbers.values())


def test_compare_tells_runs_of_another_scale_from_runs_of_other_settings(tmp_path):
    """A run whose settings are one scale's run section was made at that scale (compare refuses it against
    another's reference); one trained with --set run.lr matches no scale's and is compared as before."""
    from experiments import presets
    for name, lr in (("toy-run", presets.PRESETS["toy"].run["lr"]), ("toy-lr", 0.5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("")
        (tmp_path / name / "config.json").write_text(json.dumps({**presets.PRESETS["toy"].run, "lr": lr, "seed": 7}))
    assert comparison.made_at(tmp_path / "toy-run") == [(tmp_path / "toy-run" / "config.json", "toy")]
    assert comparison.made_at(tmp_path / "toy-lr") == []
    with pytest.raises(errors.UsageError, match="toy-run/config.json: of scale toy, and .*mini.json holds scale mini's"):
        comparison.check_scale(tmp_path / "toy-run", "mini", tmp_path / "mini.json")
    comparison.check_scale(tmp_path / "toy-run", "toy", tmp_path / "toy.json")


def restored(record: Path, runs: Path) -> Path:
    """A recorded run written at its record's place under `runs` as compare reads it: its settings, evaluations, end."""
    content = json.loads(record.read_text())
    run = runs / content["run"]
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(content["config"]))
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in content["metrics"]))
    (run / "done.json").write_text(json.dumps(content["done"]))
    return run


def test_a_variants_runs_are_compared_against_the_variants_own_band(tmp_path):
    """`compare runs/toy/beyond/idea2-matched`: the variant's pre-freeze shares the suite's run name, never its band
    (the plain pre-freeze's, which its CE lies outside). Its band is its records over seeds, found by its settings but
    the seed (its start_from names its own seed's s42/pre-grow), not by a folder's name: the same run in a folder of
    another name is compared alike; one of other settings has no band, said in one line naming the fix."""
    from conftest import repro_cli
    records = ROOT / "references" / "records" / "toy"
    run = restored(records / "beyond" / "idea2-matched" / "s42" / "pre-freeze.json", tmp_path / "runs" / "toy")
    shipped = json.loads((ROOT / "references" / "toy.json").read_text())
    final = json.loads((run / "done.json").read_text())["ce"]
    plain = comparison.band(shipped["final_ce"]["pre-freeze"])
    assert not plain[0] <= final <= plain[1]  # so matched to the plain run's band, it would read NO
    own = [json.loads((records / "beyond" / "idea2-matched" / f"s{s}" / "pre-freeze.json").read_text())["done"]["ce"]
           for s in (42, 43, 44)]
    renamed = tmp_path / "runs" / "toy" / "beyond" / "renamed" / "s42"
    renamed.parent.mkdir()
    run.parent.rename(renamed)
    for target in (renamed.parent, renamed / "pre-freeze"):
        rows = {r["name"].rsplit("/", 1)[1]: r for r in comparison.compare(target, shipped, records)}
        assert rows["final ce"]["band"] == list(comparison.band(own)) and all(r["within"] for r in rows.values())
        out = repro_cli("compare", target)
        assert f"{len(rows)} of {len(rows)} numbers within the band" in out.stdout and "NO" not in out.stdout
    config = json.loads((renamed / "pre-freeze" / "config.json").read_text())
    (renamed / "pre-freeze" / "config.json").write_text(json.dumps({**config, "lr": config["lr"] / 2}))
    out = repro_cli("compare", renamed.parent, "--scale", "toy", check=False)  # its lr is no scale's: --scale says which
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1 and "a variant's run (its settings are not the suite's pre-freeze)" \
        in lines[0], out.stderr
    assert "holds 0 records of its settings" in lines[0] and "`repro.py <study> --seeds" in lines[0]
    suite_run = tmp_path / "runs" / "toy" / "s42" / "pre-freeze"  # the suite's own run: the reference's band
    restored(records / "s42" / "pre-freeze.json", tmp_path / "runs" / "toy")
    rows = comparison.compare(suite_run, shipped, records)
    assert comparison.suite_run(comparison.settings(suite_run)) and all(r["within"] for r in rows)
    assert rows[-1]["band"] == list(comparison.band(shipped["final_ce"]["pre-freeze"]))


def test_what_a_run_is_comes_from_its_settings_never_from_its_folder(tmp_path, capsys):
    """Issue 58: the variant's pre-freeze restored where a suite run sits (runs/toy/s42/, no beyond/ in its path)
    still gets its own band, and the suite's pre-freeze moved into a beyond/x/ folder still gets the reference's;
    the scale comes from their settings (no runs/<scale>/ in the path). A path setting (start_from, teacher)
    differs by where a runs tree sits and is no difference; warmup_frac is."""
    from conftest import repro_cli, suite_config
    records = ROOT / "references" / "records" / "toy"
    shipped = json.loads((ROOT / "references" / "toy.json").read_text())
    variant = restored(records / "beyond" / "idea2-matched" / "s42" / "pre-freeze.json", tmp_path / "v")
    moved_variant = tmp_path / "plain" / "s42" / "pre-freeze"
    moved_variant.parent.mkdir(parents=True)
    variant.rename(moved_variant)
    suite = restored(records / "s42" / "pre-freeze.json", tmp_path / "s")
    moved_suite = tmp_path / "runs" / "toy" / "beyond" / "x" / "s42" / "pre-freeze"
    moved_suite.parent.mkdir(parents=True)
    suite.rename(moved_suite)
    own = [json.loads((records / "beyond" / "idea2-matched" / f"s{s}" / "pre-freeze.json").read_text())["done"]["ce"]
           for s in (42, 43, 44)]
    for run, final_band, title in ((moved_variant, comparison.band(own), "the variant's records"),
                                   (moved_suite, comparison.band(shipped["final_ce"]["pre-freeze"]), "toy.json")):
        rows = {r["name"].rsplit("/", 1)[1]: r for r in comparison.compare(run.parent.parent, shipped, records)}
        assert rows["final ce"]["band"] == list(final_band) and all(r["within"] for r in rows.values())
        out = repro_cli("compare", run)  # no --scale: toy, from its settings
        assert f"{len(rows)} of {len(rows)} numbers within the band" in out.stdout and title in " ".join(out.stdout.split())
    plain = comparison.band(shipped["final_ce"]["pre-freeze"])
    assert not plain[0] <= own[0] <= plain[1]  # so had the path decided, the variant would have read NO
    settings = json.loads(suite_config("toy", "pre", "freeze", 42))
    assert comparison.suite_run({**settings, "start_from": "../../../../s42/pre-grow/phase-0", "teacher": "/t/phase-0"})
    assert not comparison.suite_run({**settings, "warmup_frac": settings["warmup_frac"] * 2})
    assert not comparison.suite_run({**settings, "name": "post-freeze"})
    assert comparison.suite_run(json.loads(suite_config("mini", "post", "joint-replay", 43)))
