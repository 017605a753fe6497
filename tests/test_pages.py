"""The results pages are generated, never typed (experiments/pages.py): the committed docs/results pages and
the README's headline equal their render from references/*.json, and every reading sentence follows its
declared rule, so planted numbers that straddle 0 read "inconclusive" and the words change with the numbers."""
import copy
import math

import pytest

from experiments import pages, reference, report
from plumbing import checkpoint
from plumbing.errors import UsageError

REGENERATE = "regenerate it: python repro.py results --scale {scale} (pages.main)"


@pytest.mark.parametrize("scale", ["toy", "mini", "mechanism"])
def test_the_committed_results_page_equals_its_render(scale):
    committed = (pages.PAGES / f"{scale}.md").read_text()
    assert committed == pages.render(scale), REGENERATE.format(scale=scale)


def test_the_readmes_headline_is_table_1_at_toy_and_mini_as_rendered():
    readme = pages.README.read_text()
    assert pages.with_headline(readme) == readme, REGENERATE.format(scale="toy")
    block = readme.split(pages.HEADLINE_START)[1].split(pages.HEADLINE_END)[0]
    assert "`toy`, 3 seeds" in block and "`mini`, 3 seeds" in block and "-0.0332" in block  # the paper's interaction


@pytest.mark.parametrize("path", sorted((pages.ROOT / "references").glob("*.json")), ids=lambda path: path.name)
def test_every_shipped_reference_has_the_shape_results_and_compare_read(path):
    reference.check_reference(checkpoint.loads(path.read_text()), path)


def test_a_bad_reference_value_is_named_by_its_json_path(tmp_path):
    """The first bad value's place in the file, dotted where keys are plain names; `true` is not a number."""
    shipped = reference.load("toy")
    shipped["tables"]["placements"]["post: delta_grow"][1] = True
    with pytest.raises(UsageError, match=r'toy.json: tables.placements\["post: delta_grow"\]\[1\] is a boolean true, '
                                         "not a number"):
        reference.check_reference(shipped, tmp_path / "toy.json")


def stats(values):
    return pages.stats(values)


@pytest.mark.parametrize("values, verdict, why", [
    ([-0.02, 0.01, 0.03], "inconclusive", "its 95% t-interval includes 0, and its 90% interval is not inside ±0.01"),
    ([-0.30, -0.31, -0.29], "below 0", "its 95% t-interval excludes 0"),
    ([0.30, 0.32, 0.31], "above 0", "its 95% t-interval excludes 0"),
    ([0.001, -0.001, 0.0005], "a tie within ±0.01", "its 90% t-interval lies inside ±0.01"),
    ([0.001, 0.1, -0.05], "inconclusive", "its 95% t-interval includes 0"),
])
def test_a_reading_sentence_follows_the_declared_rule_on_planted_numbers(values, verdict, why):
    s = stats(values)
    text = pages.sentence("Δ", s)
    assert pages.read(s) == verdict and f"**{verdict}**: {why}" in text
    # The interval in the sentence is the one the verdict rests on, and its margin is the smallest the seeds allow.
    lo, hi = s["ci95"]
    assert f"[{lo:+.4f}, {hi:+.4f}]" in text
    assert f"±{report.smallest_tie_margin(s):.4f}." in text


def test_a_null_seed_gives_no_reading_and_a_diverged_run_is_counted():
    s = stats([-0.3, None, -0.31])
    assert pages.read(s).startswith("no reading: 1 of 3 seeds") and "**" not in pages.sentence("Δ", s)
    assert "diverged: 1 of the 6 runs (b s43)" in pages.diverged_line({"a": [1.0, 2.0, 3.0], "b": [1.0, None, 3.0]},
                                                                      [42, 43, 44], "runs")


def test_in_a_family_holm_decides_the_sign_not_the_members_own_interval():
    """Two members each with p ~0.03 (their 95% intervals exclude 0): Holm doubles the smaller p past 0.05, so
    both read inconclusive in the family, and the sentence says why."""
    members = [stats([-0.10, -0.05, -0.08]), stats([-0.10, -0.05, -0.08])]
    p_holm = pages.holm_family(members)
    assert all(0.05 < p < 0.1 for p in p_holm)
    assert pages.read(members[0]) == "below 0"  # alone, by its interval
    text = pages.sentence("Δ", members[0], p_holm[0], 2)
    assert "**inconclusive**" in text and f"Holm-adjusted p, {p_holm[0]:.3g}, is not below 0.05 over the family's 2" in text


def table1_reference(interaction_shift: float, diverged: bool = False) -> dict:
    """A reference holding Table 1 only, its post-grow runs moved by `interaction_shift` on every seed."""
    ce = {"pre_joint": [4.00, 4.01, 3.99], "pre_grow": [3.51, 3.50, 3.52], "post_joint": [3.79, 3.76, 3.81],
          "post_grow": [3.48 + interaction_shift, 3.49 + interaction_shift, 3.47 + interaction_shift]}
    delta = lambda a, b: [None if x is None or y is None else x - y for x, y in zip(a, b)]
    if diverged:
        ce["post_grow"][1] = None
    numbers = {**ce, "delta_joint": delta(ce["post_joint"], ce["pre_joint"]),
               "delta_grow": delta(ce["post_grow"], ce["pre_grow"])}
    numbers["interaction"] = delta(numbers["delta_grow"], numbers["delta_joint"])
    return {"seeds": [42, 43, 44], "git_commit": "0" * 40, "curves": {},
            "final_ce": {f"{n}-{p}": ce[f"{n}_{p}"] for n in ("pre", "post") for p in ("joint", "grow")},
            "tables": {"table1": numbers}}


def test_the_page_and_the_headline_change_when_the_numbers_do():
    above = pages.render_reference("x", table1_reference(0.0))
    straddling = pages.render_reference("x", table1_reference(-0.2))
    primary = lambda page: next(line for line in page.splitlines() if "(the primary endpoint)" in line)
    assert "**above 0**" in primary(above) and "**inconclusive**" in primary(straddling)
    assert "none of the 12 runs" in above
    diverged = pages.render_reference("x", table1_reference(0.0, diverged=True))
    assert "diverged: 1 of the 12 runs this table reads (post-grow s43)" in diverged
    assert "no reading: 1 of 3 seeds" in primary(diverged)
    rows = lambda ref: [line for line in pages.headline({"x": ref}) if line.startswith("| interaction")][0]
    assert "above 0" in rows(table1_reference(0.0)) and "inconclusive" in rows(table1_reference(-0.2))


def test_a_declared_family_reads_the_shipped_planted_numbers_and_follows_a_change():
    """The planted 2x2 as shipped reads inconclusive for both doses; raising the dosed pre-norm runs by 0.1 nats
    on every seed makes that dose's interaction read above 0 under Holm, and the page says so."""
    toy = reference.load("toy")
    shipped = {**toy, "tables": {"planted": toy["tables"]["planted"]}}
    lines = [line for line in pages.render_reference("toy", shipped).splitlines() if line.startswith("- I, ")]
    assert len(lines) == 2 and all("**inconclusive**" in line for line in lines)
    moved = copy.deepcopy(shipped)
    key = "pre-grow + one channel at 1000x: ce"
    moved["tables"]["planted"][key] = [v + 0.1 for v in moved["tables"]["planted"][key]]
    line = next(line for line in pages.render_reference("toy", moved).splitlines() if line.startswith("- I, one channel"))
    assert "**above 0**" in line and "is below 0.05 over the family's 2 comparisons" in line


def test_main_writes_the_page_and_refreshes_only_the_headline(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# kit\n\n{pages.HEADLINE_START}\nstale\n{pages.HEADLINE_END}\n\nthe rest\n")
    page = pages.main("smoke", tmp_path / "results", readme)
    assert page.read_text() == pages.render("smoke")
    text = readme.read_text()
    assert "stale" not in text and text.endswith(f"{pages.HEADLINE_END}\n\nthe rest\n") and "| interaction" in text
    readme.write_text("# kit without markers\n")
    with pytest.raises(UsageError, match="headline markers are missing"):
        pages.main("smoke", tmp_path / "results", readme)
    assert readme.read_text() == "# kit without markers\n"


def test_every_number_of_a_table_is_the_reference_over_seeds():
    """Table 1's interaction cell at toy is report.across_seeds of the shipped per-seed values, nothing else."""
    values = reference.load("toy")["tables"]["table1"]["interaction"]
    s = report.across_seeds(values)
    assert math.isclose(s["mean"], sum(values) / 3)
    assert report.kit_cell(s, 4) in pages.render("toy")
