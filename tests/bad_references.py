"""The bad-input table's cases (run by tests/test_bad_inputs.py) of the shipped references that `results`
and `compare` read (issue 40): a value of the wrong type (a string; `true`, which Python would add as 1),
NaN, seeds that are not a list, a row longer than its seeds, a missing table or an emptied `curves`, each
one line naming the file and the JSON path of the first bad value, with no page or headline written; and
`compare` given runs or reports of another scale."""
import shutil
from pathlib import Path

from conftest import RUNS, case, edit_json, write

from experiments import pages

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ["results", "--scale", "smoke"]
COMPARE = lambda target, scale="smoke": ["compare", target, "--scale", scale]


def shipped(case: Path):
    """The repository's references and README in the case folder, where the case reads and writes them
    (test_bad_inputs points reference.REFERENCES there; `pages_here` the page and the README)."""
    shutil.copytree(ROOT / "references", case / "references")
    shutil.copy(ROOT / "README.md", case / "README.md")


def pages_here(case: Path, monkeypatch):
    monkeypatch.setattr(pages, "PAGES", case / "docs" / "results")
    monkeypatch.setattr(pages, "README", case / "README.md")


def edit(scale: str, change):
    """The case's references/<scale>.json with change(content) applied (edited in place, or returned)."""
    return edit_json(f"{{C}}/references/{scale}.json", change)


def put(*keys, value):
    def change(content):
        target = content
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return change


def both(*changes):
    def change(content):
        for one in changes:
            one(content)
    return change


def pop(*keys):
    def change(content):
        target = content
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
    return change


def bad(id, scale, change, names, args=RESULTS, *more):
    """`args` (results --scale smoke) with references/<scale>.json damaged by `change`; the line names the file
    and the JSON path (`names`)."""
    return case(id, args, (f"{scale}.json", *names), shipped, edit(scale, change), *more, setup=pages_here)


REFERENCES = [
    bad("results: a final CE a string", "smoke", put("final_ce", "post-grow", 0, value="5.3"),
        ("final_ce.post-grow[0]", "a string")),
    bad("results: a table's value true", "smoke", put("tables", "table1", "pre_grow", 0, value=True),
        ("tables.table1.pre_grow[0]", "a boolean")),
    bad("results: a curve's value a list", "smoke", put("curves", "pre-grow", "4", 1, value=[5.9]), ("curves.pre-grow",)),
    bad("results: seeds a string", "smoke", put("seeds", value="42,43"), ("seeds", "a string")),
    bad("results: seeds a number", "smoke", put("seeds", value=42), ("seeds", "not a list")),
    bad("results: a seed true", "smoke", put("seeds", 0, value=True), ("seeds[0]",)),
    bad("results: seeds repeated", "smoke", put("seeds", value=[42, 42]), ("seeds", "repeats")),
    bad("results: a row longer than its seeds", "smoke", lambda c: c["tables"]["table1"]["pre_grow"].append(5.0),
        ("tables.table1.pre_grow", "3 values for 2 seeds")),
    bad("results: a final CE shorter than its seeds", "smoke", put("final_ce", "pre-grow", value=[5.38]),
        ("final_ce.pre-grow", "1 value for 2 seeds")),
    bad("results: a negative CE", "smoke", put("final_ce", "pre-grow", 0, value=-3.0), ("final_ce.pre-grow[0]", "below 0")),
    bad("results: tables missing", "smoke", pop("tables"), ("tables", "missing")),
    bad("results: a table a list", "smoke", put("tables", "table1", value=[5.3]), ("tables.table1", "not an object")),
    bad("results: curves emptied", "smoke", put("curves", value={}), ("curves", "empty")),
    bad("results: a run's curve missing", "smoke", pop("curves", "pre-grow"), ('curves.pre-grow', "missing")),
    bad("results: a curve's point not a step", "smoke", lambda c: c["curves"]["pre-grow"].update(end=[5.0, 5.0]),
        ("curves.pre-grow.end", "evaluation point")),
    bad("results: git_commit a number", "smoke", put("git_commit", value=5), ("git_commit", "not a string")),
    bad("results: a key the kit never writes", "smoke", put("final CE", value={}), ("final CE",)),
    bad("results: table_seeds of a missing table", "toy", pop("tables", "table1"), ("table_seeds.table1",)),
    bad("results: table_seeds outside the seeds", "toy", put("table_seeds", "table1", value=[42, 43, 45]),
        ("table_seeds.table1", "45")),
    # The headline reads Table 1 at toy and mini: the smoke page was written before this one failed.
    bad("results: mini's table1 missing (the headline)", "mini", both(pop("tables", "table1"), pop("table_seeds", "table1")),
        ("headline", "table1")),
    bad("results: a placements row missing", "toy", pop("tables", "placements", "post: delta_grow"),
        ("placements", "post: delta_grow"), ["results", "--scale", "toy"]),
    bad("results: a curve point Table 2 reads missing", "smoke", pop("curves", "post-grow", "8"), ("table2", "'8'")),
    case("results: a NaN", RESULTS, ("smoke.json", "NaN"), shipped, write("{C}/references/smoke.json",
         (ROOT / "references" / "smoke.json").read_text().replace("5.3068895359270964", "NaN", 1)), setup=pages_here),
    # issue 50 §3: a key given twice (the second would win silently), an integer no float holds
    case("results: a key given twice", RESULTS, ("smoke.json", "git_commit", "given twice"), shipped,
         write("{C}/references/smoke.json", (ROOT / "references" / "smoke.json").read_text().replace(
             "{", '{"git_commit": "mine", ', 1)), setup=pages_here),
    case("results: a key given twice in a table", RESULTS, ("smoke.json", "pre_grow", "given twice"), shipped,
         write("{C}/references/smoke.json", (ROOT / "references" / "smoke.json").read_text().replace(
             '"pre_grow": [', '"pre_grow": [5.0, 5.0], "pre_grow": [', 1)), setup=pages_here),
    bad("results: a 401-digit final CE", "smoke", put("final_ce", "post-grow", 0, value=10**400),
        ("final_ce.post-grow[0]", "not a number")),
    bad("results: a 401-digit table value", "smoke", put("tables", "table1", "pre_grow", 0, value=-10**400),
        ("tables.table1.pre_grow[0]",)),
    # issue 59 §4: values no CE, difference of CEs, count or text the kit writes can be (before: 1e200 rewrote the
    # README and the figures with an 827-character cell, 1e308 was an OverflowError in fsum, 200 MB went into a page)
    bad("results: a table1 CE 1e200", "smoke", put("tables", "table1", "pre_grow", 0, value=1e200),
        ("tables.table1.pre_grow[0]", "a CE or a difference of CEs")),
    bad("results: table1's interaction -1e308", "smoke", put("tables", "table1", "interaction", 0, value=-1e308),
        ("tables.table1.interaction[0]",)),
    bad("results: a final CE 1e308", "smoke", put("final_ce", "post-grow", 0, value=1e308),
        ("final_ce.post-grow[0]", "a CE")),
    bad("results: a token count 1e200", "smoke", put("tables", "tableA2", "post-joint_total", 0, value=1e200),
        ("tables.tableA2.post-joint_total[0]",)),
    bad("results: a 5,000-character commit", "smoke", put("git_commit", value="0" * 5000), ("git_commit", "5,000")),
    bad("results: a 300-character run name", "smoke", lambda c: c["final_ce"].update({"x" * 300: [5.0]}), ("final_ce",)),
    bad("compare runs: a final CE 1e200", "smoke", put("final_ce", "post-grow", 0, value=1e200), ("final_ce.post-grow[0]",),
        COMPARE(RUNS)),
    bad("compare runs: a final CE a string", "smoke", put("final_ce", "post-grow", 0, value="5.3"),
        ("final_ce.post-grow[0]",), COMPARE(RUNS)),
    bad("compare results: a row longer than its seeds", "smoke", lambda c: c["tables"]["table1"]["pre_grow"].append(5.0),
        ("tables.table1.pre_grow",), COMPARE("{S}/smoke")),
    bad("compare results: a value true", "smoke", put("tables", "table1", "pre_grow", 0, value=True),
        ("tables.table1.pre_grow[0]",), COMPARE("{S}/smoke")),
    bad("compare runs: seeds a string", "smoke", put("seeds", value="42,43"), ("seeds",), COMPARE(RUNS)),
    bad("compare runs: curves emptied", "smoke", put("curves", value={}), ("curves",), COMPARE(RUNS)),
]

# `reference` reads every *.json of the results folder: one that is not the kit's report is named, and no
# reference that `compare` would refuse is written (issue 50 §3)
REFERENCE = ["reference", "--scale", "smoke", "--seeds", "42", "--runs-dir", "{R}", "--results-dir", "{S}", "--force"]
WRITING = [case(f"reference: {what} in the results folder", REFERENCE, ("notes.json", *names),
                write("{S}/smoke/notes.json", content))
           for what, content, names in (
               ("a notes.json of nested lists", '{"seeds": [42], "numbers": {"x": [[1.0]]}}',
                ("numbers.x[0]", "a list", "move it out")),
               ("a notes.json of a 401-digit number", '{"seeds": [42], "numbers": {"x": [1%s]}}' % ("0" * 400),
                ("not a number",)),
               ("a notes.json whose numbers are text", '{"seeds": [42], "numbers": "mine"}', ("numbers", "not an object")),
               ("an older kit's report (its rows, no numbers)", '{"seeds": [42], "rows": []}',
                ("older kit", "repro.py notes --scale smoke", "move it out")),
               ("a notes.json whose seeds are text", '{"seeds": "42", "rows": []}', ("seeds",)))]
# `compare` reads the same files: a number no float holds is named, never math.isfinite'd (an OverflowError)
WRITING += [case("compare results: a notes.json of a 401-digit number in the results folder", COMPARE("{S}/smoke"),
                    ("notes.json", "not a number"), shipped,
                    write("{S}/smoke/notes.json", '{"seeds": [42], "numbers": {"x": [1%s]}}' % ("0" * 400)))]

OTHER_SCALE = [
    case("compare smoke's results against toy's", COMPARE("{S}/smoke", "toy"),
         ("table1.json", "scale smoke", "--scale smoke"), shipped),
    case("compare smoke's runs against toy's", COMPARE(RUNS, "toy"), ("config.json", "scale smoke", "--scale smoke"),
         shipped),
    case("compare a smoke run against mini's", COMPARE(f"{RUNS}/s42/pre-grow", "mini"), ("pre-grow", "scale smoke"),
         shipped),
]
