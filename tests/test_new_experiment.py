"""Adding an experiment is one file and one registry line: in a copy of the repository, a planted experiment written
as a newcomer would write it (its variants, its runs, its report) and declared in experiments/registry.py is a
command with a dry run, trains, ships in `reference`, has a section on `results`' page and is checked by `compare`."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MINE = '''"""A planted experiment: pre-norm grow with one channel of the boundary token at 10x, against the suite's."""
from experiments import report, variants
from experiments.variants import Variant
from experiments.suite import RunName, Workspace

PRE_GROW = RunName("pre", "grow")
VARIANTS = [Variant("pre-grow (suite)", PRE_GROW),
            Variant("pre-grow + channel 10x", PRE_GROW, "mine-channel-10",
                    {"run": {"boundary": "dose-channel", "boundary_scale": 10.0}})]


def run_mine(ws: Workspace, seeds: list[int], force: bool = False) -> dict:
    """Pre-norm grow with a planted channel at 10x against the suite's pre-norm grow (results/<scale>/mine.md/.json)."""
    variants.train_variants(ws, VARIANTS, seeds, force)
    ce, diverged = variants.variant_outcomes(ws, VARIANTS, seeds)
    rows = [{"variant": v.label, "ce": report.across_seeds(ce[v.label])} for v in VARIANTS]
    out = {"experiment": "mine", "scale": ws.preset.name, "seeds": seeds, "rows": rows, "diverged_runs": diverged,
           "numbers": report.row_numbers({r["variant"]: r for r in rows})}
    return report.write(ws.results, "mine", out, [f"| {r['variant']} | {report.stats_cell(r['ce'])} |" for r in rows])
'''


def repository_copy(target: Path) -> Path:
    """The working tree's files as git lists them (tracked, and untracked but not ignored), without the records."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file() and not name.startswith("references/records/"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


@pytest.mark.slow
def test_a_planted_experiment_in_one_file_and_one_registry_line(tmp_path):
    repo = repository_copy(tmp_path / "repo")
    (repo / "experiments" / "mine.py").write_text(MINE)
    registry = repo / "experiments" / "registry.py"
    text = registry.read_text()
    entry = '    "mine": Experiment(variant_groups(mine.VARIANTS), run=mine.run_mine),\n'
    text = text.replace("from experiments import beyond,", "from experiments import mine\nfrom experiments import beyond,")
    registry.write_text(text.replace("\n}\nSTUDIES = ", "\n" + entry + "}\nSTUDIES = "))  # the dict's last entry
    assert entry in registry.read_text()  # the one line, placed
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    kit = lambda *args: subprocess.run([sys.executable, "repro.py", *args], cwd=repo, capture_output=True, text=True,
                                       env=env, timeout=1200)

    planned = kit("mine", "--scale", "smoke", "--seeds", "42,43", "--dry-run")
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "pre-grow + channel 10x" in planned.stdout  # its variant's group, planned and priced beside the suite's
    assert not (repo / "runs").exists()  # a dry run trains and writes nothing

    trained = kit("mine", "--scale", "smoke", "--seeds", "42,43")
    assert trained.returncode == 0, trained.stderr[-2000:]
    for seed in (42, 43):
        assert (repo / "runs" / "smoke" / "beyond" / "mine-channel-10" / f"s{seed}" / "pre-grow" / "done.json").is_file()
    report = json.loads((repo / "results" / "smoke" / "mine.json").read_text())
    assert [row["variant"] for row in report["rows"]] == ["pre-grow (suite)", "pre-grow + channel 10x"]

    shipped = kit("reference", "--scale", "smoke", "--seeds", "42,43", "--force")
    assert shipped.returncode == 0, shipped.stderr[-2000:]
    tables = json.loads((repo / "references" / "smoke.json").read_text())["tables"]
    assert tables["mine"]["pre-grow + channel 10x: ce"] == report["rows"][1]["ce"]["values"]

    page = kit("results", "--scale", "smoke")
    assert page.returncode == 0, page.stderr[-2000:]
    section = (repo / "docs" / "results" / "smoke.md").read_text().split("## mine", 1)[1]
    assert "pre-grow + channel 10x: ce" in section

    compared = kit("compare", "results/smoke", "--scale", "smoke")
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-2000:]
    assert "mine/pre-grow + channel 10x: ce/0" in compared.stdout.replace("\n", "")
