"""Bad inputs (issue 14): every one fails with exactly one line of output, "Error: ..." naming the file
or option at fault, exits non-zero, and leaves everything the user had exactly as it was (the whole
case folder, a copy of a finished smoke runs tree and its results, is hashed before and after).

Each case copies one smoke tree (`table1 --scale smoke`, built once per module), damages the copy,
and invokes the CLI in this process with click's CliRunner. A case passes only if the kit itself turned
the fault into its one-line error (an exception that escapes the kit counts as a traceback). The cases,
by command family: bad_options.py, bad_checkpoints.py, bad_run_folders.py; the paths, commands and
damage they share are in conftest.py."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Callable

import pytest
from bad_checkpoints import CHECKPOINTS, EXPORTS, RUN_FOLDERS
from bad_options import CLI_OPTIONS, FOLDERS, ISSUE34, LAUNCH_ENVIRONMENT, LAUNCH_SHAPES, OVERRIDES
from bad_records import RECORDS
from bad_references import OTHER_SCALE, REFERENCES, WRITING
from bad_run_folders import RELIABILITY, REPORTS, RERUNS, SHIPPING
from click.testing import CliRunner
from conftest import EVAL, EXPORT, GOOD_REFERENCE, POST, PRE, RUN, RUNS, SAMPLE, TABLE1, TEACHER, Case, at, case

import repro
from experiments import presets, reference, registry, set_values, suite
from plumbing import errors

smoke_set = lambda *items: presets.parse_overrides(presets.PRESETS["smoke"], items)  # --set items, as the CLI parses them

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A finished smoke table1 (data, teacher, the four runs of seed 42) in R/ and its results in S/."""
    base = tmp_path_factory.mktemp("tree")
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), "table1", "--scale", "smoke", "--runs-dir",
                          str(base / "R"), "--results-dir", str(base / "S")], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return base


def tree_hash(root: Path) -> str:
    """sha256 over every path under root (folders too: a stub folder is a change) and every file's bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
        digest.update(b"\1")
    return digest.hexdigest()


DAMAGED_LOG = lambda keep: edit_metrics(f"{RUNS}/s42/pre-grow/metrics.jsonl", keep)


def edit_metrics(template: str, keep: Callable[[dict], bool]):
    """A metrics.jsonl with only the rows `keep` accepts (an edited or cut log)."""
    def apply(case):
        path = at(case, template)
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows if keep(r)))
    return apply


def edited_row(picked: Callable[[dict], bool], **values):
    """pre-grow's metrics.jsonl with `values` written into the rows `picked` accepts (a number edited by hand)."""
    def apply(case):
        path = at(case, f"{RUNS}/s42/pre-grow/metrics.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, **values} if picked(r) else r) + "\n" for r in rows))
    return apply


# Logs damaged where only a report reads them: the finished runs are reused (a line each), then one error line.
DAMAGED_LOGS = [
    case("fig3, a log missing a phase-end evaluation", ["fig3", *RUN], ("metrics.jsonl", "end of phase 1", "missing"),
         DAMAGED_LOG(lambda r: not (r.get("eval") and r["step"] == 16 and not r.get("phase_start")))),
    case("fig3, a log missing a phase-start evaluation", ["fig3", *RUN], ("metrics.jsonl", "start of phase 2"),
         DAMAGED_LOG(lambda r: not (r.get("phase_start") and r.get("phase") == 2))),
    case("fig3, a log with no phase-start evaluations", ["fig3", *RUN], ("metrics.jsonl", "start of phase 0"),
         DAMAGED_LOG(lambda r: not r.get("phase_start"))),
    # Issue 34 §7's last: a number edited, no row cut (before: "ValueError: Axis limits cannot be NaN or Inf" for
    # 1e308; -1.0 and 5.0 were plotted, exit 0). A logged CE is at least 0 and its PPL is exp(CE).
    case("fig3, a phase-start CE edited to 1e308", ["fig3", *RUN], ("metrics.jsonl", "start of phase 1", "1e+308"),
         edited_row(lambda r: r.get("phase_start") and r.get("phase") == 1, ce=1e308)),
    case("fig3, a phase-end CE edited below 0", ["fig3", *RUN], ("metrics.jsonl", "end of phase 0", "-1.0"),
         edited_row(lambda r: r.get("eval") and r["step"] == 8 and not r.get("phase_start"), ce=-1.0)),
    case("fig3, a phase-start CE edited without its PPL", ["fig3", *RUN], ("start of phase 2", "5.0", "exp(CE)"),
         edited_row(lambda r: r.get("phase_start") and r.get("phase") == 2, ce=5.0)),
]


CASES = CLI_OPTIONS + OVERRIDES + FOLDERS + CHECKPOINTS + RERUNS + REPORTS + RELIABILITY + ISSUE34 + REFERENCES + \
    OTHER_SCALE + SHIPPING + EXPORTS + LAUNCH_ENVIRONMENT + LAUNCH_SHAPES + RUN_FOLDERS + RECORDS + WRITING


def test_the_table_has_at_least_100_distinct_cases():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 100


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_is_one_line_and_changes_nothing(bad: Case, tree, tmp_path, monkeypatch):
    # A case that damages nothing reads the shared tree itself (hashed like a copy); one that damages a
    # file, or passes --force (which may replace folders), works on its own copy.
    case_dir = tmp_path / "case"
    own_copy = bool(bad.damage or bad.setup or "--force" in bad.args)
    if own_copy:
        shutil.copytree(tree, case_dir)
    else:
        case_dir.mkdir()
    runs, results = (case_dir if own_copy else tree) / "R", (case_dir if own_copy else tree) / "S"
    monkeypatch.chdir(case_dir)  # a default path (runs/, results/) lands here, inside a hashed folder
    monkeypatch.setattr(reference, "REFERENCES", case_dir / "references")
    for damage in bad.damage:
        damage(case_dir)
    if bad.setup:
        bad.setup(case_dir, monkeypatch)
    hashed = (case_dir,) if own_copy else (case_dir, tree)
    before = [tree_hash(folder) for folder in hashed]
    fill = lambda text: text.format(R=runs, S=results, C=case_dir)
    result = CliRunner().invoke(repro.cli, [fill(a) for a in bad.args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail("a traceback escaped the kit:\n" + "".join(traceback.format_exception(result.exception)))
    out = result.output.strip()
    lines = out.splitlines()
    assert result.exit_code != 0, out
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in out, out
    for name in (bad.names,) if isinstance(bad.names, str) else bad.names:
        assert fill(name) in lines[0], out
    assert [tree_hash(folder) for folder in hashed] == before, f"the command changed what was there: {out}"
    shutil.rmtree(case_dir)  # up to 5 MB a case: kept only where a case fails, to look at


def test_the_undamaged_tree_passes_every_command_the_table_breaks(tree, tmp_path, monkeypatch):
    """The cases fail because of their damage: the same commands succeed on the tree as it was built (the
    post-norm checkpoint without its checksums.json too: its label is its run's; a run folder, its newest
    phase checkpoint, named in one line)."""
    case_dir = tmp_path / "case"
    shutil.copytree(tree, case_dir)
    monkeypatch.chdir(case_dir)
    (Path(POST.format(R=case_dir / "R")) / "checksums.json").unlink()
    fill = lambda args: [a.format(R=case_dir / "R", S=case_dir / "S", C=case_dir) for a in args]
    for args in (EVAL(PRE), EVAL(POST), EVAL(TEACHER), SAMPLE(PRE), SAMPLE(POST), EXPORT(PRE, "{C}/out"),
                 ["data", "--scale", "smoke", "--runs-dir", "{R}"], TABLE1):
        result = CliRunner().invoke(repro.cli, fill(args))
        assert result.exit_code == 0, (args, result.output, result.exception)
    for run, args in ((POST, EVAL(f"{RUNS}/s42/post-grow")), (TEACHER, SAMPLE(f"{RUNS}/teacher")),
                      (PRE, EXPORT(f"{RUNS}/s42/pre-grow", "{C}/out-of-run"))):
        result = CliRunner().invoke(repro.cli, fill(args))
        folder, used = fill([args[1], run])
        assert result.exit_code == 0 and result.stderr == f"{folder}: a run folder; using its newest phase checkpoint, " \
            f"{used} (the run finished)\n", (args, result.output)


def test_a_run_folder_and_an_export_named_like_markup_print_as_named(tree, tmp_path, monkeypatch):
    """Issue 59 §3: a copied run folder "copy [v2]" was printed as "copy /pre-grow/phase-2" (rich read [v2] as a
    style), an export to "exp [/v2]" raised MarkupError after writing its files; both now print their names."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tree / "R" / "smoke" / "s42" / "pre-grow", tmp_path / "copy [v2]" / "pre-grow")
    checkpoint, out = tmp_path / "copy [v2]" / "pre-grow" / "phase-2", tmp_path / "exp [/v2]"
    result = CliRunner().invoke(repro.cli, ["eval", str(checkpoint), "--runs-dir", str(tree / "R")])
    assert result.exit_code == 0 and result.output.startswith(f"{checkpoint}: CE "), result.output
    result = CliRunner().invoke(repro.cli, ["export", str(checkpoint), str(out), "--runs-dir", str(tree / "R")])
    assert result.exit_code == 0 and f"tokenizer to {out}" in " ".join(result.output.split()), result.output
    assert (out / "model.safetensors").is_file()


def strict_json_files(root: Path) -> int:
    """Parse every .json and .jsonl file under root as strict JSON (NaN, Infinity refused); their count."""
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")
    count = 0
    for path in sorted(root.rglob("*.json*")):
        if path.suffix == ".json":
            json.loads(path.read_text(), parse_constant=refuse)
        elif path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                json.loads(line, parse_constant=refuse)
        else:
            continue
        count += 1
    return count


def test_every_json_of_a_smoke_tree_is_strict_diverged_runs_included(tree, tmp_path, monkeypatch):
    """Every JSON file of a finished smoke tree, and of one whose students all diverged (lr 50: their CE
    and PPL overflow), parses with a strict parser; the diverged table names its diverged runs, no number, no verdict."""
    shutil.copytree(tree, tmp_path / "t")
    monkeypatch.chdir(tmp_path / "t")
    result = CliRunner().invoke(repro.cli, [*[a.format(R="R", S="S") for a in TABLE1], "--set", "run.lr=50"])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "t" / "S" / "smoke+run.lr=50.0" / "table1.md").read_text()
    assert "diverged: 4 of the 4 runs this table reads (pre-joint s42, post-joint s42" in table
    assert "| pre-norm, grow | n/a |" in table and "reads **" not in table
    assert "same sign" not in table and "agrees" not in table.replace("no verdict", "")
    run_dir = tmp_path / "t" / "R" / "smoke" / "set" / "run.lr=50.0" / "s42" / "pre-grow"
    done = json.loads((run_dir / "done.json").read_text())
    assert done["ce"] is None and done["diverged"]["step"] >= 1
    assert strict_json_files(tmp_path / "t") >= 40


LIMITED = ("import resource, signal, sys; from pathlib import Path; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY)); "
           "from experiments import reference; import repro; "
           "reference.REFERENCES = Path(sys.argv[2]); repro.cli(sys.argv[3:])")


@pytest.mark.slow
def test_a_file_size_limit_during_each_kind_of_results_write_keeps_the_previous_files(tree, tmp_path, monkeypatch):
    """A real `ulimit -f` (RLIMIT_FSIZE) below the size of a report, a figure and a reference: each command
    stops with one line naming the file and the limit, and every previous file is byte-identical."""
    shutil.copytree(tree, tmp_path / "t")
    refs = tmp_path / "t" / "references"
    def run(limit, *args):
        return subprocess.run([sys.executable, "-c", LIMITED, str(limit), str(refs), *args], cwd=tmp_path / "t",
                              capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    run_args = ["--scale", "smoke", "--runs-dir", "R", "--results-dir", "S"]
    commands = {"report": ["table1", *run_args], "figure": ["fig3", *run_args],
                "reference": ["reference", *run_args, "--seeds", "42", "--force"]}
    for kind in ("figure", "reference"):  # the previous files, written without a limit (the tree has table1's)
        monkeypatch.chdir(tmp_path / "t")
        monkeypatch.setattr(reference, "REFERENCES", refs)
        result = CliRunner().invoke(repro.cli, commands[kind])
        assert result.exit_code == 0, result.output
    files = sorted(p for p in [*(tmp_path / "t" / "S").rglob("*"), *refs.rglob("*")] if p.is_file())
    before = {p: p.read_bytes() for p in files}
    assert min(len(b) for p, b in before.items() if p.suffix in (".json", ".png")) > 1000
    for kind, command in commands.items():
        limited = run(1000, *command)
        last = limited.stderr.strip().splitlines()[-1] if limited.stderr.strip() else limited.stdout
        assert limited.returncode == 1 and last.startswith("Error: ") and "Traceback" not in limited.stderr, \
            (kind, limited.stderr[-2000:])
        assert "a file-size limit (ulimit -f) was reached while writing it; the previous file is intact" in last, last
        assert {p: p.read_bytes() for p in files} == before, kind
        assert not [p for p in (tmp_path / "t").rglob("*.tmp")], kind


def test_force_with_student_overrides_never_rebuilds_the_shared_data_or_teacher(tree, tmp_path, monkeypatch):
    """`--set run.lr=... --force` in a finished workspace trains the overridden students beside the scale's
    data and teacher and leaves both byte for byte as they were, also with the data folder a symlink to
    another disk; `--set run.seed=43` is `--seeds 43`: the scale's own folders, no override folder."""
    shutil.copytree(tree, tmp_path / "t")
    smoke = tmp_path / "t" / "R" / "smoke"
    shutil.move(smoke / "data", tmp_path / "other-disk")
    (smoke / "data").symlink_to(tmp_path / "other-disk", target_is_directory=True)
    shared = {name: tree_hash(tmp_path / name) for name in ("other-disk", "t/R/smoke/teacher")}
    monkeypatch.chdir(tmp_path / "t")
    run = [a.format(R="R", S="S") for a in TABLE1]
    result = CliRunner().invoke(repro.cli, [*run, "--set", "run.lr=0.004", "--force"])
    assert result.exit_code == 0, result.output
    assert (smoke / "set" / "run.lr=0.004" / "s42" / "pre-grow" / "done.json").is_file()
    assert {name: tree_hash(tmp_path / name) for name in shared} == shared
    ws = suite.workspace("smoke", tmp_path / "t" / "R", overrides=smoke_set("run.seed=43"), dry_run=True)
    assert ws.runs == smoke and ws.student_runs == "" and ws.preset.run["seed"] == 43
    assert ws.run_dir(suite.RunName("pre", "grow"), 43) == smoke / "s43" / "pre-grow"


@pytest.mark.parametrize("bad", DAMAGED_LOGS)
def test_a_log_damaged_where_only_a_report_reads_it_ends_in_one_line(bad: Case, tree, tmp_path, monkeypatch):
    """fig3 reads each phase's start and end evaluation from the grow runs' metrics.jsonl: a row cut out
    of a finished run's log is one error line naming the file and the row (before: StopIteration), after
    the reuse lines, and nothing is written."""
    shutil.copytree(tree, tmp_path / "case")
    monkeypatch.chdir(tmp_path / "case")
    for damage in bad.damage:
        damage(tmp_path / "case")
    before = tree_hash(tmp_path / "case")
    fill = lambda text: text.format(R=tmp_path / "case" / "R", S=tmp_path / "case" / "S", C=tmp_path / "case")
    result = CliRunner().invoke(repro.cli, [fill(a) for a in bad.args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith("Error: ") and "Traceback" not in result.output
    assert all(line.endswith(("reusing " + str(tmp_path / "case" / "R" / "smoke" / "teacher"))) or ": done, reusing " in line
               for line in lines[:-1]), lines
    for name in bad.names:
        assert name in lines[-1], lines[-1]
    assert tree_hash(tmp_path / "case") == before


def test_a_set_value_with_a_control_character_never_reaches_a_folder_name_or_the_terminal():
    """Issue 50 §7: an ESC sequence in a --set text is refused, shown escaped (bad_options.py's cases: one line);
    a name made of such a value anyway (set_values.named) drops the characters and ends in the value's hash."""
    result = CliRunner().invoke(repro.cli, ["train", "--scale", "smoke", "--norm", "post", "--protocol", "grow", "--set",
                                            "data.path=corpus\x1b[2J.jsonl", "--dry-run"])
    assert result.exit_code == 2 and "\x1b" not in result.output and "corpus\\x1b[2J.jsonl" in result.output
    assert set_values.named("a\x1b[31mb").isprintable() and set_values.named("a\u202eb") != set_values.named("ab") == "ab"


# ---- issue 34: values by value -------------------------------------------------------------------

def test_bare_repro_py_prints_usage_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(repro.cli, [])
    assert result.exit_code == 0 and result.output.startswith("Usage: repro.py"), result.output
    assert "python repro.py --scale toy --dry-run" in result.output and "python repro.py --scale toy " in result.output
    assert list(tmp_path.iterdir()) == []  # no runs/, no results/


DRY_RUNS = {"run": ["table1"], "train": ["train", "--norm", "post", "--protocol", "grow"],
            "placements": ["placements"], "intervention": ["intervention"],
            "scratch": ["scratch"], "planted": ["planted"]}


@pytest.mark.parametrize("command", list(DRY_RUNS))
def test_every_experiment_command_has_a_dry_run_that_makes_nothing(command, tmp_path, monkeypatch):
    """Each prints its runs' plan and an estimate for this CPU; no folder is made."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(repro.cli, [*DRY_RUNS[command], "--scale", "smoke", "--dry-run", "--runs-dir",
                                            str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert re.search(r"this machine: (about \S+ \S+|under a second) on this CPU", result.output) and "GPU-h" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("study", list(registry.STUDIES))
def test_run_takes_every_study_by_name_as_its_own_command_does(study, tmp_path, monkeypatch):
    """`repro.py run <study> --dry-run` is `repro.py <study> --dry-run`: one Experiment type in one dict
    (registry.EXPERIMENTS), every one of its names a name `run` accepts; the same plan, nothing made."""
    monkeypatch.chdir(tmp_path)
    common = ["--scale", "smoke", "--dry-run", "--runs-dir", str(tmp_path / "runs")]
    by_run, by_command = (CliRunner().invoke(repro.cli, [*head, study, *common]) for head in (["run"], []))
    assert by_run.exit_code == 0 and "unknown experiment" not in by_run.output, by_run.output
    assert re.search(r"this machine: (about \S+ \S+|under a second) on this CPU", by_run.output) and "GPU-h" in by_run.output
    plan = lambda output: output.split("this machine:")[0]  # the estimate's load and timing vary between the two calls
    assert plan(by_run.output) == plan(by_command.output)
    assert list(tmp_path.iterdir()) == []


def test_the_dry_run_is_closed_form_at_the_largest_accepted_values(tmp_path):
    """The teacher passes of a lockstep seed are a union of step spans, merged without a set of steps: at
    a billion steps a phase and 128 blocks the numbers are the formula's. The paper's 3 blocks of S steps:
    grow covers steps 0..3S, joint 0..S inside it, freeze shares grow's phase 0 and adds 1..3S."""
    from tools import lockstep_plan, plan
    assert lockstep_plan.union_length([range(0, 10), range(5, 20), range(30, 31), range(0, 0), range(19, 25)]) == 26
    S, K = 10**9, 128
    ws = suite.workspace("smoke", tmp_path / "runs", overrides=smoke_set(f"run.phase_steps={S}", f"run.blocks={K}"),
                         dry_run=True)
    runs = plan.planned_runs(ws, [suite.RunName(*run) for run in (("pre", "joint"), ("pre", "grow"), ("pre", "freeze"),
                                                                  ("post", "joint-long"))], 42)
    assert [r.name for r in runs] == ["pre-joint", "pre-grow", "pre-freeze", "post-joint", "post-joint-long"]
    joint_long = 2 * S - S  # its own phase after post-joint's (with_prefixes adds post-joint, which it shares)
    assert lockstep_plan.teacher_passes(runs, lockstep=True) == K * S + joint_long   # grow's span holds every replay run's
    assert lockstep_plan.teacher_passes(runs, lockstep=False) == S + K * S + (K - 1) * S + S + joint_long
    result = CliRunner().invoke(repro.cli, ["all", "--scale", "smoke", "--set", f"run.phase_steps={S}", "--set",
                                            f"run.blocks={K}", "--set", "run.layers_per_block=128", "--dry-run",
                                            "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0 and "this machine: about " in result.output, result.output


def test_every_number_a_set_can_change_has_a_range():
    """Each numeric field of every --set section is bounded above and below: one past its upper end is a
    one-line error naming the key, its ends are accepted."""
    preset = presets.PRESETS["smoke"]
    numbers = {}
    for section, cls in set_values.OVERRIDABLE.items():
        known = {f.name: f.default for f in __import__("dataclasses").fields(cls)} if cls else {}
        known.update({**(set_values.DATA_OPTIONS if section == "data" else {}), **getattr(preset, section)})
        for name, value in known.items():
            if name in set_values.SET_BY_KIT.get(section, ()) or isinstance(value, (bool, str, dict)):
                continue
            if isinstance(value, (int, float, tuple)) or value is None:
                numbers[f"{section}.{name}"] = name
    assert len(numbers) >= 40
    missing = sorted(key for key, name in numbers.items() if name not in set_values.RANGES)
    assert not missing, f"no range for {missing}"
    for key, name in numbers.items():
        low, high = set_values.RANGES[name]
        too_big = high * 10 + 1 if isinstance(high, int) else high * 10
        value = ",".join([str(too_big)] * 2 if name == "betas" else [str(too_big)])
        with pytest.raises(errors.OptionError, match=f"{key.split('.')[1]}=.*expected"):
            presets.parse_overrides(preset, [f"{key}={value}"])
    assert presets.apply_overrides(preset, smoke_set("run.blocks=128", "run.phase_steps=1000000000"))[0].run["blocks"] == 128


def test_the_dry_runs_estimate_for_this_cpu_uses_the_benchs_measured_speed(tmp_path):
    """From results/bench.json: the kit's toy step of 2 GFLOP in 0.5 s is 4 GFLOP/s, so 360 GFLOP take
    90 s = 1.5 min; bf16 where the preset would use it and the bench measured it."""
    from tools import cpu_estimate, plan
    from tools.bench import environment  # this CPU's: a bench.json from another is not used (tests/bad_bench_files.py)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"environment": {**environment(), "date": "2026-12-02"}, "train_step": {
        "step_gflop": 2.0, "kit_post_fp32_s": 0.5, "kit_post_bf16_s": 0.25}}))
    assert cpu_estimate.cpu_estimate(360e9, "fp32", bench).startswith("about 1.5 min on this CPU (4.0 GFLOP/s")
    # "auto" is this machine's choice (bf16 where its probe measures it faster: AMX, AVX-512 bf16; AVX2: fp32)
    chosen, _ = cpu_estimate.devices.precision_choice("auto", cpu_estimate.torch.device("cpu"))
    auto_is_bf16 = str(chosen) == "torch.bfloat16"
    assert cpu_estimate.cpu_estimate(360e9, "auto", bench).startswith(
        "about 45 s on this CPU (8.0 GFLOP/s" if auto_is_bf16 else "about 1.5 min on this CPU (4.0 GFLOP/s")
    assert plan.duration_text(0.2) == "under a second" and plan.duration_text(7200) == "2.0 h"
    assert cpu_estimate.cpu_estimate(1e9, "fp32", bench).startswith("under a second on this CPU")  # not "about under"


def test_the_toy_dry_run_says_no_zero_durations_or_sizes(tmp_path):
    result = CliRunner().invoke(repro.cli, ["--scale", "toy", "--dry-run", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "about 0 s" not in text and "(0 GB" not in text and "about 0 min" not in text and "~0 of" not in text
    # one estimate, of what remains to train, in the precision it trains in (the toy's records: float32)
    assert text.count(" on this CPU") == 1 and re.search(r"remaining: \d+ runs in float32, [\d.,]+ TFLOPs: about ", text)


def test_sample_top_k_1_is_greedy_at_any_temperature(tree, monkeypatch):
    """1e300 is finite; in fp32 it is inf, and logits / inf made every token equally likely."""
    monkeypatch.chdir(tree)
    pre = PRE.format(R=tree / "R")
    def text(*more):
        result = CliRunner().invoke(repro.cli, ["sample", pre, "--prompt", "The", "--max-new-tokens", "12",
                                                "--runs-dir", str(tree / "R"), *more])
        assert result.exit_code == 0, result.output
        return result.output
    greedy = text()
    assert text("--temperature", "1e300", "--top-k", "1") == greedy
    assert text("--temperature", "1e-30", "--top-k", "1") == greedy


def test_sigterm_during_sample_does_not_promise_a_resume(tree, monkeypatch):
    from tools import sample
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(sample, "generate", interrupted)
    result = CliRunner().invoke(repro.cli, ["sample", PRE.format(R=tree / "R"), "--runs-dir", str(tree / "R")])
    assert result.exit_code == 130 and "sample stopped before it finished" in result.output
    assert "resume" not in result.output


def test_ratios_of_a_scale_whose_teacher_shares_the_students_batch():
    """smoke's teacher_run sets no global_batch (the students' 4): 20 teacher steps x 4 documents over
    the longest student's 3 x 8 x 4."""
    result = CliRunner().invoke(repro.cli, ["ratios", "--scale", "smoke"])
    assert result.exit_code == 0, result.output
    assert "| teacher documents / documents of the longest-trained student | ≫ 1 (a pretrained LLM) | 0.8333 |" \
        in result.output


def test_the_precision_cache_is_read_as_strictly_as_it_is_written(tmp_path, monkeypatch):
    from plumbing import devices
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "normgrow").mkdir()
    for damaged in ('{"another machine": NaN}', '{"x": 1e999}', "[1]", "{"):
        (tmp_path / "normgrow" / "cpu-precision.json").write_text(damaged)
        devices.cpu_bf16_speedup.cache_clear()
        speedup = devices.cpu_bf16_speedup()
        written = json.loads((tmp_path / "normgrow" / "cpu-precision.json").read_text(),
                             parse_constant=lambda c: pytest.fail(c))
        assert speedup > 0 and list(written.values()) == [speedup]
    devices.cpu_bf16_speedup.cache_clear()


def test_export_to_an_empty_folder_and_a_reference_over_a_shipped_one(tree, tmp_path, monkeypatch):
    """An empty folder holds nothing to lose: export uses it, with --force too, and --force replaces the kit's
    own export. `reference` over a shipped file says --force is missing, not that an absent --force is invalid."""
    shutil.copytree(tree, tmp_path / "t")
    monkeypatch.chdir(tmp_path / "t")
    pre = PRE.format(R=tmp_path / "t" / "R")
    for more in ((), ("--force",)):
        shutil.rmtree(tmp_path / "empty", ignore_errors=True)
        (tmp_path / "empty").mkdir()
        result = CliRunner().invoke(repro.cli, ["export", pre, str(tmp_path / "empty"), "--runs-dir",
                                                str(tmp_path / "t" / "R"), *more])
        assert result.exit_code == 0 and (tmp_path / "empty" / "model.safetensors").is_file(), result.output
    # --force over the kit's own export, beside what a killed export leaves (<out>.tmp, of its files only)
    shutil.copytree(tmp_path / "empty", tmp_path / "empty.tmp")
    (tmp_path / "empty.tmp" / "model.safetensors").unlink()
    result = CliRunner().invoke(repro.cli, ["export", pre, str(tmp_path / "empty"), "--runs-dir", str(tmp_path / "t" / "R"),
                                            "--force"])
    assert result.exit_code == 0 and not (tmp_path / "empty.tmp").exists(), result.output
    monkeypatch.setattr(reference, "REFERENCES", tmp_path / "refs")
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "smoke.json").write_text(GOOD_REFERENCE)
    result = CliRunner().invoke(repro.cli, ["reference", "--scale", "smoke", "--seeds", "42", "--runs-dir", "R",
                                            "--results-dir", "S"])
    assert result.exit_code == 2 and "Invalid value" not in result.output and "add --force" in result.output
    assert (tmp_path / "refs" / "smoke.json").read_text() == GOOD_REFERENCE


def test_the_teacher_summary_says_which_side_of_the_teacher_the_best_student_is(tree):
    ws = suite.workspace("smoke", tree / "R", dry_run=True)
    teacher = json.loads((tree / "R" / "smoke" / "teacher" / "done.json").read_text())["ce"]
    best = min(json.loads((tree / "R" / "smoke" / "s42" / n / "done.json").read_text())["ce"]
               for n in ("pre-grow", "post-grow", "pre-joint", "post-joint"))
    line = suite.teacher_summary(ws, [suite.RunName(n, p) for n, p in (("pre", "grow"), ("post", "grow"), ("pre", "joint"),
                                                                       ("post", "joint"))], [42])
    side = "above" if best >= teacher else "below"
    assert f"{abs(best - teacher):.4f} nats {side} the teacher's" in line and "leads by" not in line


def test_data_takes_set_and_prepares_where_those_runs_read(tmp_path):
    result = CliRunner().invoke(repro.cli, ["data", "--scale", "smoke", "--set", "data.val_docs=12", "--runs-dir",
                                            str(tmp_path)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "smoke+data.val_docs=12" / "data" / "val" / "manifest.json").read_text())
    assert manifest["n_docs"] == 12
    assert not (tmp_path / "smoke").exists()


def test_force_after_an_edited_corpus_never_reuses_what_the_old_one_trained(tmp_path):
    """--force over the shards of an edited local corpus with a teacher and runs trained on the old content (a
    stand-in folder here) is refused in one line naming them, before anything is rebuilt (rebuilt first, a plain
    rerun reused them with the new shards); once they are moved away, --force rebuilds."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} about the lazy fox"}) + "\n" for i in range(200)))
    local = smoke_set("data.source=local", f"data.path={corpus}")
    ws = suite.workspace("smoke", tmp_path / "runs", overrides=local, device="cpu")
    suite.prepare_data(ws)
    first = suite.shard_corpus(ws)["sha256"]
    (ws.runs / "teacher").mkdir()
    corpus.write_text(corpus.read_text().replace("lazy", "quick"))
    with pytest.raises(errors.DataError, match="another corpus"):  # unforced: the shards are refused
        suite.prepare_data(suite.workspace("smoke", tmp_path / "runs", overrides=local, device="cpu"))
    with pytest.raises(errors.DataError, match=r"data: the corpus changed since teacher .* move teacher out of"):
        suite.prepare_data(suite.workspace("smoke", tmp_path / "runs", overrides=local, device="cpu"), force=True)
    assert suite.shard_corpus(ws)["sha256"] == first  # refused before anything was rebuilt under the teacher
    shutil.rmtree(ws.runs / "teacher")  # moved away: --force now rebuilds from the corpus as it is
    suite.prepare_data(suite.workspace("smoke", tmp_path / "runs", overrides=local, device="cpu"), force=True)
    assert suite.shard_corpus(ws)["sha256"] != first


def test_two_data_paths_differing_only_by_slash_and_underscore_keep_two_workspaces(tmp_path):
    """Issue 40: data.path=<d>/x/c.jsonl and <d>/x_c.jsonl were one workspace (/ shown as _), and the --force its
    error suggested rebuilt the other corpus's shards under its finished runs. Now each has its own folder, and
    `data --force` on one leaves the other byte for byte (and data.path spelled without / keeps its old name)."""
    (tmp_path / "x").mkdir()
    docs = lambda word: "".join(json.dumps({"text": f"document {i} about the {word} fox"}) + "\n" for i in range(200))
    (tmp_path / "x" / "c.jsonl").write_text(docs("lazy"))
    (tmp_path / "x_c.jsonl").write_text(docs("quick"))
    runs = tmp_path / "runs"
    local = lambda path, *more: CliRunner().invoke(repro.cli, ["data", "--scale", "smoke", "--runs-dir", str(runs), "--set",
                                                               "data.source=local", "--set", f"data.path={path}", *more])
    assert local(tmp_path / "x" / "c.jsonl").exit_code == 0
    [first] = runs.iterdir()
    before = tree_hash(first)
    result = local(tmp_path / "x_c.jsonl", "--force")
    assert result.exit_code == 0, result.output
    assert tree_hash(first) == before and len(list(runs.iterdir())) == 2


def test_a_checkpoint_index_beside_weights_or_pointing_elsewhere_is_refused(tmp_path):
    """Issue 50's recheck: with checksums.json gone, an index added beside a kit checkpoint's model.safetensors (or
    naming a file outside the folder: another run's weights) was read instead of the folder's own weights."""
    import torch
    from safetensors.torch import save_file

    from plumbing import checkpoint
    folder, other = tmp_path / "phase-2", tmp_path / "other"
    for f in (folder, other):
        f.mkdir()
        save_file({"w": torch.zeros(2)}, str(f / "model.safetensors"))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model.safetensors"}}))
    with pytest.raises(errors.CheckpointError, match="holds both model.safetensors and model.safetensors.index.json"):
        checkpoint.tensor_files(folder)
    (folder / "model.safetensors").unlink()
    index.write_text(json.dumps({"weight_map": {"w": "../other/model.safetensors"}}))
    with pytest.raises(errors.CheckpointError, match=r"names '../other/model.safetensors', not a file of"):
        checkpoint.tensor_files(folder)
    index.write_text(json.dumps({"weight_map": {"w": "model-00001.safetensors"}}))  # a hub checkpoint's shape
    assert checkpoint.tensor_files(folder) == {"w": folder / "model-00001.safetensors"}
