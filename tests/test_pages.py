"""The results pages are generated, never typed (experiments/pages.py): the committed docs/results pages and
the README's headline equal their render from references/*.json, and every reading sentence follows its
declared rule, so planted numbers that straddle 0 read "inconclusive" and the words change with the numbers."""
import copy
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from matplotlib.backends.backend_agg import FigureCanvasAgg

from experiments import figures, page_figures, pages, paper_reports, presets, readings, reference, registry, report
from plumbing import checkpoint
from plumbing.errors import UsageError

REGENERATE = "regenerate it: python repro.py results --scale {scale} (pages.main)"


@pytest.mark.parametrize("scale", ["toy", "mini"])
def test_the_committed_results_page_equals_its_render(scale):
    committed = (pages.PAGES / f"{scale}.md").read_text()
    assert committed == pages.render(scale), REGENERATE.format(scale=scale)


def test_the_readmes_headline_is_table_1_at_toy_and_mini_as_rendered():
    readme = pages.README.read_text()
    assert pages.with_headline(readme) == readme, REGENERATE.format(scale="toy")
    block = readme.split(pages.HEADLINE_START)[1].split(pages.HEADLINE_END)[0]
    assert "`toy`, 3 seeds" in block and "`mini`, 8 seeds" in block and "-0.0332" in block  # the paper's interaction
    # mini's eight pre-registered seeds (references/records/mini), their primary read by the rule
    mini = reference.load("mini")
    assert mini["table_seeds"]["table1"] == list(range(42, 50)) and len(mini["tables"]["table1"]["interaction"]) == 8
    primary = stats(mini["tables"]["table1"]["interaction"])
    assert f"| {report.stats_cell(primary, True)} | {readings.reading_cell(primary)} |" in block


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
    return readings.stats(values)


@pytest.mark.parametrize("values, verdict, why", [
    ([-0.02, 0.01, 0.03], "inconclusive", "its 95% t-interval includes 0, and its 90% interval is not inside ±0.01"),
    ([-0.30, -0.31, -0.29], "below 0", "its 95% t-interval excludes 0"),
    ([0.30, 0.32, 0.31], "above 0", "its 95% t-interval excludes 0"),
    ([0.001, -0.001, 0.0005], "a tie within ±0.01", "its 90% t-interval lies inside ±0.01"),
    ([0.001, 0.1, -0.05], "inconclusive", "its 95% t-interval includes 0"),
])
def test_a_reading_sentence_follows_the_declared_rule_on_planted_numbers(values, verdict, why):
    s = stats(values)
    text = readings.sentence("Δ", s)
    assert readings.read(s) == verdict and f"**{verdict}**: {why}" in text
    # The interval in the sentence is the one the verdict rests on, and its margin is the smallest the seeds allow.
    lo, hi = s["ci95"]
    assert f"[{lo:+.4f}, {hi:+.4f}]" in text
    assert f"±{report.smallest_tie_margin(s):.4f}." in text


def test_a_null_seed_gives_no_reading_and_a_diverged_run_is_counted():
    s = stats([-0.3, None, -0.31])
    assert readings.read(s).startswith("no reading: 1 of 3 seeds") and "**" not in readings.sentence("Δ", s)
    assert "diverged: 1 of the 6 runs (b s43)" in readings.diverged_line({"a": [1.0, 2.0, 3.0], "b": [1.0, None, 3.0]},
                                                                      [42, 43, 44], "runs")


def test_one_renderer_gives_a_null_number_no_mean_no_verdict_and_no_reading():
    """paper_reports.section, which the page and the live report both print: a diverged run (null) is named, a
    number it enters shows its seeds' values, and a claim or a reading that reads it gives none."""
    final = {"pre-joint": [4.0, 4.1], "post-joint": [3.8, None], "pre-grow": [3.5, 3.6], "post-grow": [3.4, 3.5]}
    numbers = {key.replace("-", "_"): ce for key, ce in final.items()} | \
        {"delta_joint": [-0.2, None], "delta_grow": [-0.1, -0.1], "interaction": [0.1, None]}
    text = "\n".join(paper_reports.section("table1", numbers, [42, 43], final, scale="toy"))
    assert "diverged: 1 of the 8 runs this table reads (post-joint s43)" in text
    assert "| delta joint | n/a (per seed: -0.2000, n/a) |" in text
    assert "- no verdict (a mean it reads is null): post-norm and pre-norm nearly tie" in text
    assert "- delta joint: no reading: 1 of 2 seeds have no value" in text and "- delta grow: -0.1000" in text


def test_in_a_family_holm_decides_the_sign_not_the_members_own_interval():
    """Two members each with p ~0.03 (their 95% intervals exclude 0): Holm doubles the smaller p past 0.05, so
    both read inconclusive in the family, and the sentence says why."""
    members = [stats([-0.10, -0.05, -0.08]), stats([-0.10, -0.05, -0.08])]
    p_holm = readings.holm_family(members)
    assert all(0.05 < p < 0.1 for p in p_holm)
    assert readings.read(members[0]) == "below 0"  # alone, by its interval
    text = readings.sentence("Δ", members[0], p_holm[0], 2)
    assert "**inconclusive**" in text and f"Holm-adjusted p, {p_holm[0]:.3g}, is not below 0.05 over the family's 2" in text


def test_minis_table1_reads_its_secondaries_as_the_family_its_preregistration_declared():
    """mini's eight-seed study declared Δjoint and Δgrow one Holm family of two (docs/preregistrations.md): its
    section reads them by the Holm-adjusted p of their one-sample t-tests (scipy here), the toy's alone."""
    final = {"pre-joint": [4.0, 4.1, 4.05], "post-joint": [3.98, 4.05, 4.04], "pre-grow": [3.5, 3.6, 3.55],
             "post-grow": [3.45, 3.57, 3.5]}
    deltas = {"delta_joint": [-0.02, -0.05, -0.01], "delta_grow": [-0.05, -0.03, -0.05]}
    numbers = {key.replace("-", "_"): ce for key, ce in final.items()} | deltas | \
        {"interaction": [g - j for g, j in zip(deltas["delta_grow"], deltas["delta_joint"])]}
    raw = {key: scipy.stats.ttest_1samp(values, 0).pvalue for key, values in deltas.items()}
    low, high = sorted(raw, key=raw.get)
    want = {low: 2 * raw[low], high: max(2 * raw[low], raw[high])}  # Holm over two
    assert readings.declared_p("mini", "table1", {k: stats(v) for k, v in numbers.items()}) == pytest.approx(want)
    assert readings.declared_p("toy", "table1", {k: stats(v) for k, v in numbers.items()}) == {}
    mini = "\n".join(paper_reports.section("table1", numbers, [42, 43, 44], final, scale="mini"))
    toy = "\n".join(paper_reports.section("table1", numbers, [42, 43, 44], final, scale="toy"))
    for key, label in (("delta_joint", "delta joint"), ("delta_grow", "delta grow")):
        assert f"- {label}: " in mini and f"its Holm-adjusted p, {want[key]:.3g}, is" in mini
    assert "Holm" not in toy


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
    links = re.findall(r"\]\((smoke/\w+\.png)\)", page.read_text())  # its figures, beside it
    assert links and sorted(links) == sorted(f"smoke/{p.name}" for p in (tmp_path / "results" / "smoke").iterdir())
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


# ----------------------------------------------------------------------------------------------
# The figures on the pages (experiments/page_figures.py): linked, committed, and drawn from the reference's
# numbers (checked on what each Figure holds, not on PNG bytes, which vary with the font renderer).

def drawn_figures(scale: str, ref: dict | None = None) -> dict:
    """{name: the Figure page_figures.draw saved} for a scale's reference."""
    saved, original = {}, figures.save_png

    def capture(fig, path, caption=""):
        saved[Path(path).stem] = fig
        return original(fig, path, caption)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures, "save_png", capture)
        page_figures.draw(scale, ref or reference.load(scale))
    return saved


@pytest.fixture(scope="module", params=["toy", "mini"])
def shipped_figures(request):
    return request.param, reference.load(request.param), drawn_figures(request.param)


def mean(values):
    return sum(values) / len(values)


def ys(ax, label):
    return [float(y) for y in next(line for line in ax.get_lines() if line.get_label() == label).get_ydata()]


def test_the_committed_page_links_each_committed_figure_and_says_why_the_others_are_not_drawn(shipped_figures):
    scale, _, saved = shipped_figures
    page = (pages.PAGES / f"{scale}.md").read_text()
    links = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", page)
    assert links.pop() == page_figures.TREND_FILE  # the scale trend, last of the figures: drawn from every scale
    assert links == [f"{scale}/{name}.png" for name in ("fig3a", "fig3b", "fig4", "fig5b", "figA2")]
    assert sorted(p.name for p in (pages.PAGES / scale).iterdir()) == sorted(Path(link).name for link in links)
    assert "**Figure 5a: per-token RMS by token type across checkpoints**: not drawn" in page
    assert "**Figure A1: per-token RMS histograms at the final checkpoint**: not drawn" in page
    for link in links:
        png = (pages.PAGES / link).read_bytes()
        fig = saved[Path(link).stem]
        # The committed PNG has the size its figure is drawn at now, and carries no software version or date.
        width, height = struct.unpack(">II", png[16:24])
        assert (width, height) == tuple(round(x * 150) for x in fig.get_size_inches()), link
        assert b"Software" not in png and b"atplotlib" not in png


def test_figure_3_draws_table_1_and_the_grow_curves_means_beside_the_papers(shipped_figures):
    scale, ref, saved = shipped_figures
    t1 = {key: mean(v) for key, v in ref["tables"]["table1"].items()}
    (ax,) = saved["fig3a"].axes
    kit = [t1[f"post_{p}"] - t1[f"pre_{p}"] for p in ("joint", "grow")]
    assert ys(ax, "Δ post − pre (kit)") == pytest.approx(kit)
    assert ys(ax, "Δ post − pre (paper)") == pytest.approx([2.7607 - 2.7603, 2.7330 - 2.7658])
    S, K = presets.PRESETS[scale].run["phase_steps"], presets.PRESETS[scale].run["blocks"]
    curve = lambda norm, points: [mean(ref["curves"][f"{norm}-grow"][p]) for p in points]
    ends = {n: curve(n, [str((p + 1) * S) for p in range(K)]) for n in ("pre", "post")}
    starts = {n: curve(n, [f"{p * S} start" for p in range(K)]) for n in ("pre", "post")}
    ax, dax = saved["fig3b"].axes[:2]
    assert ys(ax, "pre-norm, phase end") == pytest.approx(ends["pre"]) and ys(ax, "post-norm, phase end") == \
        pytest.approx(ends["post"])
    assert ys(dax, "Δ kit, phase end") == pytest.approx([b - a for a, b in zip(ends["pre"], ends["post"])])
    assert ys(dax, "Δ kit, phase start") == pytest.approx([b - a for a, b in zip(starts["pre"], starts["post"])])
    assert ys(dax, "Δ paper (phase 0: Table 2; phase 2: Table 1)") == pytest.approx([2.9846 - 2.9802, 2.7330 - 2.7658])


def test_figures_4_5b_and_a2_draw_the_references_means_and_the_papers_values(shipped_figures):
    scale, ref, saved = shipped_figures
    fig4 = {key: mean(v) for key, v in ref["tables"]["fig4"].items()}
    kit, paper = saved["fig4"].axes
    for norm in ("pre", "post"):
        assert ys(kit, f"{norm}, after block 0") == pytest.approx([fig4[f"{norm}_std_first"], fig4[f"{norm}_std_end"]])
    assert ys(paper, "pre, after block 0 (5.81 → 19.98)") == [5.81, 19.98]
    (ax,) = saved["fig5b"].axes
    S = presets.PRESETS[scale].run["phase_steps"]
    for norm, paper_ce in (("pre", 2.7658), ("post", 2.7330)):
        curve = ref["curves"][f"{norm}-grow"]
        line = next(line for line in ax.get_lines() if line.get_label() == f"{norm}-norm, validation CE")
        assert list(line.get_xdata()) == [int(point.split()[0]) for point in curve]
        assert list(line.get_ydata()) == pytest.approx([mean(v) for v in curve.values()])
        assert ys(ax, f"paper: {norm}-grow at 150k, drawn at the kit's last step") == [paper_ce]
    assert [list(line.get_xdata()) for line in ax.get_lines() if line.get_linestyle() == ":"] == [[S, S], [2 * S, 2 * S]]
    t4 = ref["tables"]["table4"]
    kit_bars = [[p.get_height() for c in ax.containers for p in c] for ax in saved["figA2"].axes[:2]]
    runs = ("pre-grow", "post-grow", "pre-joint", "post-joint")
    assert kit_bars == [pytest.approx([mean(t4[f"{run}_{m}_{b}"]) for run in runs for b in range(3)])
                        for m in ("dce", "angular")]
    paper_bars = [p.get_height() for ax in saved["figA2"].axes[2:4] for c in ax.containers for p in c]
    assert paper_bars[:3] == [8.13, 2.36, 0.02]  # Table 4's pre-grow ΔCE per block


def test_a_figure_whose_numbers_the_reference_lacks_or_nulls_is_not_drawn_and_the_page_says_so():
    toy = copy.deepcopy(reference.load("toy"))
    toy["tables"]["table1"]["post_grow"][1] = None      # a diverged seed: no mean to draw
    del toy["tables"]["fig4"]
    saved = drawn_figures("toy", toy)
    assert sorted(saved) == ["fig3b", "fig5b", "figA2"]
    page = "\n".join(page_figures.section("toy", toy))
    assert "**Figure 3a: post − pre per protocol, and the interaction**: not drawn: this reference holds no numbers" \
        in page and "toy/fig3a.png" not in page and "toy/fig4.png" not in page and "toy/fig3b.png" in page


def test_figure_3b_draws_every_marker_whole_and_its_caption_clear_of_the_axes_and_legend(shipped_figures):
    """The layout issue 47 found: the caption on the x label, start markers cut at the top edge, a start
    marker sitting by the legend. Every marker lies inside its axes by its own radius; the caption's box meets
    no axes' (labels included) nor the legend's."""
    fig = shipped_figures[2]["fig3b"]
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_marker() in ("o", "s"):
                radius = line.get_markersize() / 72 * fig.dpi / 2
                points = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
                assert all(ax.bbox.y0 + radius <= y <= ax.bbox.y1 - radius for _, y in points), line.get_label()
    (caption,) = fig.texts
    box = caption.get_window_extent(renderer)
    assert not any(box.overlaps(artist.get_tightbbox(renderer)) for artist in [*fig.axes, *fig.legends])


def test_the_plain_words_follow_each_claims_reading():
    """The headline's words on the paper's Table 1 claims are chosen by the declared reading, never stronger."""
    assert pages.claim_words("X", "below 0", "below 0") == "reproduces X"
    assert pages.claim_words("X", "below 0", "above 0") == "finds the opposite of X (it reads above 0)"
    assert pages.claim_words("X", "a tie", "below 0") == "does not reproduce X (it reads below 0)"
    assert pages.claim_words("X", "below 0", "a tie within ±0.01") == "does not reproduce X (it reads a tie within ±0.01)"
    assert pages.claim_words("X", "a tie", "a tie within ±0.01") == "reproduces X"
    assert pages.claim_words("X", "below 0", "inconclusive") == "is inconclusive on X"
    toy = pages.claims({"toy": pages.shipped("toy")})[0]
    assert "finds the opposite of the primary endpoint" in toy and "+0.1871 [+0.0805, +0.2937]" in toy


def test_each_section_names_what_trained_its_runs_from_their_provenance():
    """Issue 48: a table rerun in a runs folder of its own (the planted 2 x 2, in bf16) says so in its section, from
    the reference's table_provenance, and the page's header gives the machines of the scale's own runs, from
    run_machines; a precision or machine changed in the reference changes what the page says."""
    ref = copy.deepcopy(reference.load("toy"))
    page = pages.render_reference("toy", ref)
    planted = page.split("## planted", 1)[1].split("\n## ", 1)[0]
    assert "18 run folders in bfloat16 on AMD EPYC (AVX512 + AVX512-BF16)" in planted and "`b77bac2` (3)" in planted
    assert "- Machine of the runs (from each run's `provenance.json`): AMD EPYC (AVX2), 69 run folders" in page
    assert "beyond/dose-channel-1000/s*/post-grow" not in page.split("## ", 1)[0]  # planted's, not the scale's
    made = ref["table_provenance"]["planted"]
    made["run_precisions"] = dict.fromkeys(made["run_precisions"], "float32")
    ref["run_machines"]["s42/pre-grow"] = "Intel Xeon (AMX)"
    changed = pages.render_reference("toy", ref)
    assert "18 run folders in float32 on AMD EPYC" in changed and "Intel Xeon (AMX), 1 run folder" in changed
    # the machine line follows run_machines alone, whether or not a table was rerun apart
    del ref["table_provenance"]
    header = pages.render_reference("toy", ref).split("## ", 1)[0]
    assert "- Machine of the runs" in header and "- Machine: not recorded" not in header and "Rerun in" not in header
    del ref["run_machines"]
    assert "- Machine: not recorded" in pages.render_reference("toy", ref).split("## ", 1)[0]


def test_a_paper_tables_section_names_what_trained_the_runs_it_reads():
    """Issue 48: every section whose runs are the scale's names their precision, machine and commits from the
    reference's provenance of exactly the folders it reads (registry.section_folders: Table 2 reads the two grow
    runs of each seed, not the joint runs the header also counts), and the folders that had no provenance.json."""
    ref = copy.deepcopy(reference.load("toy"))
    section = lambda page, name: page.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
    assert registry.section_folders("table2", "toy", [42, 43]) == ["s42/pre-grow", "s42/post-grow", "s43/pre-grow",
                                                                  "s43/post-grow"]
    ref["run_machines"]["s43/post-grow"] = "NVIDIA H200"
    ref["run_precisions"]["s43/post-grow"] = "bfloat16"
    page = pages.render_reference("toy", ref)
    table2 = section(page, "table2")
    assert "Its runs: 1 run folder in bfloat16 on NVIDIA H200; 5 run folders in float32 on AMD EPYC (AVX2)" in table2
    assert "had no provenance.json" not in table2  # its six grow runs all have one
    table1 = section(page, "table1")  # its joint runs were trained before runs wrote provenance.json
    assert "6 more (s*/post-joint, s*/pre-joint) had no provenance.json when the reference was collected" in table1
    assert "NVIDIA H200" in section(page, "intervention")  # a study's section reads the suite's post-grow too
    assert "NVIDIA H200" not in section(page, "ideas")  # which names its machines from its records itself
    # a reference that kept no run's provenance (mini's): no line in the sections; its header says where to look
    for key in ("run_commits", "run_precisions", "run_machines", "table_provenance"):
        del ref[key]
    assert "Its runs" not in pages.render_reference("toy", ref)


def drawn_trend(references: dict):
    saved, original = {}, figures.save_png

    def capture(fig, path, caption=""):
        saved["trend"] = fig
        return original(fig, path, caption)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures, "save_png", capture)
        png = page_figures.draw_trend(references)
    return saved.get("trend"), png


def test_the_scale_trend_draws_each_scales_table_1_differences_with_their_intervals_beside_the_papers():
    """Issue 57: one figure, on the README and on every results page, generated from the references and paper.py:
    Δjoint, Δgrow and the interaction at toy and mini (mean and 95% t-interval over seeds) and the paper's."""
    references = pages.trend_references()
    fig, png = drawn_trend(references)
    committed = (pages.PAGES / page_figures.TREND_FILE).read_bytes()
    width, height = struct.unpack(">II", committed[16:24])
    assert (width, height) == tuple(round(x * 150) for x in fig.get_size_inches()) == struct.unpack(">II", png[16:24])
    assert b"Software" not in committed
    scales = [scale for scale, ref in references.items() if ref is not None]
    assert scales == ["toy", "mini"]
    for ax, (key, _) in zip(fig.axes, figures.TREND):
        kit = [reference.load(scale)["tables"]["table1"][key] for scale in scales]
        means = [float(line.get_ydata()[0]) for line in ax.get_lines() if line.get_marker() == "o"
                 and line.get_label() != "paper: one run, no interval"]
        assert means == pytest.approx([mean(v) for v in kit])
        bars = [seg for c in ax.collections if hasattr(c, "get_segments") for seg in c.get_segments()]
        intervals = [float(y) for seg in bars for y in (seg[0][1], seg[1][1])]  # each errorbar's segment, low to high
        assert intervals == pytest.approx([y for v in kit for y in report.across_seeds(v)["ci95"]])
        assert ys(ax, "paper: one run, no interval") == [pages.DELTAS[key]]
        assert [t.get_text() for t in ax.get_xticklabels()] == \
            [f"{scale}\n{len(reference.load(scale)['tables']['table1'][key])} seeds" for scale in scales] + ["paper"]
    readme = pages.README.read_text().split(pages.HEADLINE_START)[1]
    for page, link in ((readme, f"docs/results/{page_figures.TREND_FILE}"),
                       *(((pages.PAGES / f"{scale}.md").read_text(), page_figures.TREND_FILE) for scale in scales)):
        sources = "`references/toy.json`, seeds 42, 43, 44; `references/mini.json`"
        assert f"![Scale trend]({link})" in page and sources in page


def test_the_scale_trend_leaves_out_a_scale_whose_table_1_has_a_null_and_says_when_none_is_left():
    toy = copy.deepcopy(reference.load("toy"))
    toy["tables"]["table1"]["interaction"][1] = None
    assert list(page_figures.trend_args({"toy": toy, "mini": reference.load("mini")})["kit"]) == ["mini"]
    assert page_figures.trend_args({"toy": toy, "small": None}) is None and drawn_trend({"toy": toy}) == (None, None)
    assert "not drawn: no shipped reference holds" in page_figures.trend_lines({"toy": toy}, "x.png")[0]
