"""`repro.py reference --tables`: an experiment rerun in a runs folder of its own joins the shipped reference."""
import json
import shutil

import pytest
from conftest import repro_cli, suite_config

from experiments import comparison, reference
from plumbing import errors


def shipped() -> dict:
    return {"seeds": [42, 43, 44], "git_commit": "c" * 40, "curves": {"pre-grow": {"250": [4.0, 4.1, 4.2]}},
            "final_ce": {"pre-grow": [3.5, 3.51, 3.52]}, "tables": {"table1": {"pre_grow": [3.5, 3.51, 3.52]},
                                                                   "scratch": {}},
            "table_seeds": {"table1": [42, 43, 44], "scratch": [42, 43, 44]}, "run_commits": {"s42/pre-grow": "a" * 40}}


def test_named_tables_are_replaced_and_the_rest_stays_as_shipped(tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    results.mkdir()
    scratch = {"seeds": [42, 43, 44], "numbers": {"interaction": [0.28, 0.29, 0.27]}}
    (results / "scratch.json").write_text(json.dumps(scratch))
    run = runs / "beyond" / "scratch" / "s43" / "pre-joint"
    run.mkdir(parents=True)
    (run / "provenance.json").write_text(json.dumps({"git_commit": "b" * 40}))
    before = shipped()
    after = reference.with_tables(before, runs, results, ["scratch"])
    assert after["tables"]["scratch"] == {"interaction": [0.28, 0.29, 0.27]}
    assert after["tables"]["table1"] == before["tables"]["table1"] and after["curves"] == before["curves"]
    # the table's runs are its own runs folder's, kept apart: a folder of the same name in the scale's runs is another run
    assert after["run_commits"] == {"s42/pre-grow": "a" * 40}
    assert after["table_provenance"]["scratch"] == {"run_commits": {"beyond/scratch/s43/pre-joint": "b" * 40},
                                                    "run_precisions": {"beyond/scratch/s43/pre-joint": None},
                                                    "run_machines": {"beyond/scratch/s43/pre-joint": None}}
    reference.check_reference(after, tmp_path / "toy.json")
    assert before["tables"]["scratch"] == {}  # the shipped content is not changed in place
    # compare then checks the new table's per-seed values against their band
    rows = {r["name"]: r for r in comparison.compare(results, after)}
    assert rows["scratch/interaction/1"]["value"] == 0.29 and all(r["within"] for r in rows.values())


@pytest.mark.parametrize("seeds", [[42], [42, 45]])
def test_a_report_of_one_seed_or_of_other_seeds_is_refused(tmp_path, seeds):
    (tmp_path / "planted.json").write_text(json.dumps({"seeds": seeds, "numbers": {}}))
    with pytest.raises(errors.UsageError, match="planted.json: its seeds"):
        reference.with_tables(shipped(), tmp_path, tmp_path, ["planted"])


def test_a_missing_report_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(errors.UsageError, match="repro.py planted"):
        reference.with_tables(shipped(), tmp_path, tmp_path, ["planted"])


# ---- issue 47: compare on unfinished runs, and the scale its runs' settings name (issue 58) -------

def logged_run(run, evaluations, done: bool, seed: int = 42):
    """Smoke's pre-grow of `seed` as its folder holds it: its settings, these (step, ce) evaluations, done.json if it
    finished."""
    run.mkdir(parents=True)
    (run / "config.json").write_text(suite_config("smoke", "pre", "grow", seed))
    rows = [{"step": step, "ce": ce, "kd": ce, "ppl": 2.718 ** ce, "eval": True} for step, ce in evaluations]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if done:
        (run / "done.json").write_text(json.dumps({k: rows[-1][k] for k in ("step", "ce", "kd", "ppl")}))


@pytest.fixture
def smoke_reference(tmp_path, monkeypatch):
    """references/smoke.json (only smoke's) from two finished seeds of pre-grow, evaluated at steps 4 and 8."""
    shipped_runs = tmp_path / "shipped"
    for seed, ce in ((42, 5.50), (43, 5.52)):
        logged_run(shipped_runs / f"s{seed}" / "pre-grow", [(4, ce + 0.5), (8, ce)], done=True, seed=seed)
    (tmp_path / "refs").mkdir()
    content = reference.collect(shipped_runs, tmp_path / "refs", [42, 43])
    (tmp_path / "refs" / "smoke.json").write_text(json.dumps(content))
    monkeypatch.setattr(reference, "REFERENCES", tmp_path / "refs")
    return tmp_path


def test_compare_names_unfinished_runs_and_fails_on_the_numbers_they_lack(smoke_reference):
    """Before: "1 of 1 numbers within the band", exit 0, for a run that had evaluated once. Now the unfinished
    runs by name and how far they are, the numbers of the reference they lack, exit 1; the scale is the one
    its runs' settings name (no --scale, which defaulted to toy)."""
    runs = smoke_reference / "runs" / "smoke"
    logged_run(runs / "s42" / "pre-grow", [(4, 6.0)], done=False)
    (runs / "s42" / "pre-joint").mkdir(parents=True)  # set up, not started: no number, nothing in the reference
    (runs / "s42" / "pre-joint" / "config.json").write_text(suite_config("smoke", "pre", "joint", 42))
    out = repro_cli("compare", runs, check=False)
    assert out.returncode == 1 and "1 of 1 numbers within the band" in out.stdout
    assert out.stderr.strip().splitlines() == [
        "Error: unfinished: s42/pre-grow partial (step 4); 2 numbers smoke.json has for them do not exist yet (first: "
        "s42/pre-grow/ce at 8): finish the runs (rerun the command that trains them: it resumes) and compare again"]
    one = repro_cli("compare", runs / "s42" / "pre-grow", check=False)
    assert one.returncode == 1 and "unfinished: pre-grow partial (step 4)" in one.stderr
    logged_run(runs / "s43" / "pre-grow", [(4, 6.02), (8, 5.51)], done=True, seed=43)
    shutil.rmtree(runs / "s42")
    done = repro_cli("compare", runs)
    assert "3 of 3 numbers within the band" in done.stdout and done.stderr == ""


def test_compare_without_scale_takes_the_scale_its_runs_settings_name(smoke_reference):
    """Issue 58: the scale is read from what the runs are, never from a folder's name: smoke's runs in a folder
    named for nothing are smoke's; a folder whose runs or reports name no scale asks for --scale in one line."""
    logged_run(smoke_reference / "mine" / "s42" / "pre-grow", [(4, 6.0), (8, 5.5)], done=True)
    assert "3 of 3 numbers within the band" in repro_cli("compare", smoke_reference / "mine").stdout
    (smoke_reference / "toy" / "s42").mkdir(parents=True)  # a folder named for a scale, of no run
    out = repro_cli("compare", smoke_reference / "toy", check=False)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"Error: Invalid value for --scale: {smoke_reference / 'toy'} names no scale (by its runs' settings or its "
        "reports' \"scale\"); pass --scale")
