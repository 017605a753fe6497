"""Does a change alter any result? Runs the smoke suite (`repro.py --scale smoke`, every experiment) at
a base commit and at the working tree, one after the other in the same folders, and compares every
results/smoke/*.json, leaving out what names the commit or hashes the configs. Exit 1 on a difference.

    python tests/same_results.py BASE_COMMIT      # e.g. the commit before a reorganisation

Not a pytest file: it takes two smoke suites (minutes); `make same-results BASE=...` runs it.
"""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORED = {"git_commit", "runs_config_sha256"}


def smoke_results(tree: Path, work: Path) -> dict[str, object]:
    """{file name: parsed JSON} of a smoke suite run from `tree` in work/runs and work/results."""
    for folder in ("runs", "results"):
        shutil.rmtree(work / folder, ignore_errors=True)
    subprocess.run([sys.executable, "repro.py", "--scale", "smoke", "--runs-dir", str(work / "runs"),
                    "--results-dir", str(work / "results")], cwd=tree, check=True, capture_output=True)
    return {p.name: strip(json.loads(p.read_text())) for p in sorted((work / "results" / "smoke").glob("*.json"))}


def strip(value):
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in IGNORED}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def main(base: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run(["git", "worktree", "add", "--detach", str(tmp / "base"), base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            before = smoke_results(tmp / "base", tmp / "work")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "base")], cwd=ROOT, capture_output=True)
        after = smoke_results(ROOT, tmp / "work")
    differing = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    print(f"{len(before)} reports at {base}, {len(after)} now; " +
          (f"differing: {', '.join(differing)}" if differing else "identical (commit and config hashes aside)"))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
