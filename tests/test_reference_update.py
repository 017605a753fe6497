"""`repro.py reference --tables`: an experiment rerun in a runs folder of its own joins the shipped reference."""
import json

import pytest

from experiments import reference
from plumbing import errors


def stats(*values):
    return {"mean": sum(values) / len(values), "values": list(values)}


def shipped() -> dict:
    return {"seeds": [42, 43, 44], "git_commit": "c" * 40, "curves": {"pre-grow": {"250": [4.0, 4.1, 4.2]}},
            "final_ce": {"pre-grow": [3.5, 3.51, 3.52]}, "tables": {"table1": {"pre_grow": [3.5, 3.51, 3.52]},
                                                                   "scratch": {}},
            "table_seeds": {"table1": [42, 43, 44], "scratch": [42, 43, 44]}, "run_commits": {"s42/pre-grow": "a" * 40}}


def test_named_tables_are_replaced_and_the_rest_stays_as_shipped(tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    results.mkdir()
    scratch = {"seeds": [42, 43, 44], "numbers": {"interaction": stats(0.28, 0.29, 0.27)}}
    (results / "scratch.json").write_text(json.dumps(scratch))
    run = runs / "beyond" / "scratch" / "s43" / "pre-joint"
    run.mkdir(parents=True)
    (run / "provenance.json").write_text(json.dumps({"git_commit": "b" * 40}))
    before = shipped()
    after = reference.with_tables(before, runs, results, ["scratch"])
    assert after["tables"]["scratch"] == {"interaction": [0.28, 0.29, 0.27]}
    assert after["tables"]["table1"] == before["tables"]["table1"] and after["curves"] == before["curves"]
    assert after["run_commits"] == {"s42/pre-grow": "a" * 40, "beyond/scratch/s43/pre-joint": "b" * 40}
    assert before["tables"]["scratch"] == {}  # the shipped content is not changed in place
    # compare then checks the new table's per-seed values against their band
    rows = {r["name"]: r for r in reference.compare(results, after)}
    assert rows["scratch/interaction/1"]["value"] == 0.29 and all(r["within"] for r in rows.values())


@pytest.mark.parametrize("seeds", [[42], [42, 45]])
def test_a_report_of_one_seed_or_of_other_seeds_is_refused(tmp_path, seeds):
    (tmp_path / "planted.json").write_text(json.dumps({"seeds": seeds, "interactions": []}))
    with pytest.raises(errors.UsageError, match="planted.json: its seeds"):
        reference.with_tables(shipped(), tmp_path, tmp_path, ["planted"])


def test_a_missing_report_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(errors.UsageError, match="repro.py planted"):
        reference.with_tables(shipped(), tmp_path, tmp_path, ["planted"])
