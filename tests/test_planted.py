"""The planted-mechanism 2x2 (`repro.py planted`): its interaction, its reading, and its runs at smoke scale."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import beyond, report

ROOT = Path(__file__).resolve().parents[1]


def ce_table(pre, post, pre_doses, post_doses) -> dict:
    """Per-seed CE lists under planted_variants' labels: pre_doses / post_doses one list per dose."""
    ce = {"pre-grow (suite)": pre, "post-grow (suite)": post}
    for (_, _, _, label), p, q in zip(beyond.DOSES, pre_doses, post_doses):
        ce[f"pre-grow + {label}"], ce[f"post-grow + {label}"] = p, q
    return ce


def test_the_interaction_is_the_difference_of_differences_paired_by_seed():
    # dose 1 costs pre-norm 0.10 more than post-norm on every seed up to a small spread; dose 2 costs both the same
    pre, post = [3.50, 3.52, 3.49], [3.47, 3.48, 3.46]
    pre_d = [[3.70, 3.73, 3.68], [3.60, 3.62, 3.59]]
    post_d = [[3.57, 3.58, 3.57], [3.57, 3.58, 3.56]]
    rows = beyond.planted_interactions(ce_table(pre, post, pre_d, post_d))
    first = rows[0]["interaction"]
    expected = [(a - b) - (c - d) for a, b, c, d in zip(pre_d[0], pre, post_d[0], post)]
    assert first["values"] == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx([0.10, 0.11, 0.08], abs=1e-12)
    assert first["mean"] == pytest.approx(0.29 / 3, abs=1e-12)
    # Holm over the two doses: the smaller p doubled, the larger one as is (but never below the first)
    raw = [report.p_two_sided(r["interaction"]) for r in rows]
    assert raw[0] < raw[1] and rows[0]["p_holm"] == pytest.approx(2 * raw[0], rel=1e-12)
    assert rows[1]["p_holm"] == pytest.approx(max(raw[1], 2 * raw[0]), rel=1e-12)
    assert rows[0]["reading"] == "above 0"
    assert rows[1]["interaction"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert rows[1]["reading"] in ("inconclusive", "a tie within ±0.01")


def test_one_seed_gives_no_adjusted_p_and_no_reading():
    rows = beyond.planted_interactions(ce_table([3.5], [3.4], [[3.7], [3.6]], [[3.45], [3.5]]))
    assert all(math.isnan(r["p_holm"]) and r["reading"] == "no reading: one seed" for r in rows)
    assert rows[0]["interaction"]["mean"] == pytest.approx((3.7 - 3.5) - (3.45 - 3.4))


def test_the_smallest_tie_margin_is_the_mean_plus_the_90_percent_half_width():
    s = report.across_seeds([0.01, 0.02, 0.03])  # mean 0.02, SD 0.01
    # t(0.95, df 2) = 2.919986, / sqrt(3): 1.685854 SDs
    assert report.smallest_tie_margin(s) == pytest.approx(0.02 + 2.919986 * 0.01 / math.sqrt(3), rel=1e-5)
    assert report.tie_or_inconclusive(s, report.smallest_tie_margin(s) * 1.0001).startswith("a tie")
    assert report.tie_or_inconclusive(s, report.smallest_tie_margin(s) * 0.9999) == "inconclusive"
    assert math.isnan(report.smallest_tie_margin(report.across_seeds([0.1])))


def test_planted_at_smoke_trains_each_cell_with_its_dose(tmp_path):
    """Each row is its run's done.json; the dosed runs carry their dose in config.json, the post-norm ones in the
    intervention's folders (one run, two experiments); the report's interaction is the rows' arithmetic."""
    done = subprocess.run([sys.executable, str(ROOT / "repro.py"), "planted", "--scale", "smoke", "--runs-dir",
                           str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads((tmp_path / "results" / "smoke" / "planted.json").read_text())
    assert out["diverged_runs"] == [] and len(out["rows"]) == 6
    # one renderer: the live report shows what the results page renders from the same numbers, shipped
    live = (tmp_path / "results" / "smoke" / "planted.md").read_text()
    assert "\n".join(beyond.planted_lines(out["numbers"], out["seeds"])) in live
    assert out["numbers"]["delta_grow: none"] == out["delta_grow"]["none"]["values"]  # Δgrow named as a row of doses
    assert out["numbers"][f"{beyond.DOSES[0][3]}: interaction"] == out["interactions"][0]["interaction"]["values"]
    ce = {}
    for row in out["rows"]:
        folder = tmp_path / "runs" / "smoke" / "s42" / row["run"]
        if row["settings"]:
            kind, ratio = row["settings"]["run"]["boundary"], row["settings"]["run"]["boundary_scale"]
            folder = tmp_path / "runs" / "smoke" / "beyond" / f"{kind}-{ratio:g}" / "s42" / row["run"]
            config = json.loads((folder / "config.json").read_text())
            assert (config["boundary"], config["boundary_scale"]) == (kind, ratio)
        ce[row["variant"]] = json.loads((folder / "done.json").read_text())["ce"]
        assert row["ce"]["mean"] == ce[row["variant"]]
    for _, _, _, label in beyond.DOSES:  # the dose changes what the appended blocks read, so the CE moves
        assert ce[f"pre-grow + {label}"] != ce["pre-grow (suite)"]
        assert ce[f"post-grow + {label}"] != ce["post-grow (suite)"]
    for r, (_, _, _, label) in zip(out["interactions"], beyond.DOSES):
        expected = ((ce[f"pre-grow + {label}"] - ce["pre-grow (suite)"])
                    - (ce[f"post-grow + {label}"] - ce["post-grow (suite)"]))
        assert r["interaction"]["mean"] == pytest.approx(expected, abs=1e-12)


def test_each_doses_parts_are_read_alone_beside_its_interaction():
    """Issue 57: I is pre-norm's dose effect minus post-norm's; the section reads each part by the rule (post hoc)
    beside I, so an I driven by one placement says which."""
    pre, post = [3.50, 3.52, 3.49], [3.47, 3.48, 3.46]
    pre_d = [[3.70, 3.73, 3.68], [3.501, 3.519, 3.49]]   # dose 1 costs pre-norm ~0.2; dose 2 nothing
    post_d = [[3.47, 3.481, 3.459], [3.57, 3.58, 3.56]]  # dose 1 nothing; dose 2 costs post-norm 0.1
    ce = ce_table(pre, post, pre_d, post_d)
    undosed = lambda run: ce["pre-grow (suite)" if run.startswith("pre") else "post-grow (suite)"]
    numbers = {f"{run}: {q}": values if q == "ce" else [a - b for a, b in zip(values, undosed(run))]
               for run, values in ce.items() for q in ("ce", "minus_undosed")}
    text = "\n".join(beyond.planted_lines(numbers, [42, 43, 44]))
    effect = report.across_seeds([a - b for a, b in zip(pre_d[0], pre)])
    assert f"| pre-grow + the boundary token at 37x | {report.stats_cell(report.across_seeds(pre_d[0]))} | " \
           f"{report.stats_cell(effect, True)} | above 0" in text
    assert "| pre-grow (suite) |" in text and text.split("| pre-grow (suite) |")[1].split("\n")[0].endswith("|  |")
    assert (f"- the boundary token at 37x: I reads above 0; pre-norm's {report.stats_cell(effect, True)} reads above 0; "
            "post-norm's") in text
    dose_2 = next(line for line in text.splitlines() if line.startswith("- one channel at 1000x: I reads"))
    assert "I reads below 0; pre-norm's" in dose_2 and dose_2.endswith("post-norm's +0.1000 [+0.1000, +0.1000] reads "
                                                                       "above 0")
