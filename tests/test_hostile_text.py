"""Issue 59 §3, §7, §8: what the kit prints is text, whatever a user named; a command that cannot start says so
in one line. A folder or value holding rich markup ("copy [v2]", "exp [/v2]"), an emoji code or an ESC sequence
reaches the terminal as written (escaped where it is a control character); gpucheck without CUDA and a Ctrl-C
while repro.py imports each end in one line, never a traceback."""
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments import suite
from plumbing import progress

ROOT = Path(__file__).resolve().parents[1]


def test_the_kits_console_prints_user_text_as_text(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(suite.console, "file", out)
    for text in ("copy [v2]/pre-grow/phase-2", "exported to exp [/v2]", "run :bug: [bold]x[/]"):
        suite.console.print(text)
    suite.console.print("a\x1b[2Jb\nsecond line")
    assert out.getvalue().splitlines() == ["copy [v2]/pre-grow/phase-2", "exported to exp [/v2]",
                                           "run :bug: [bold]x[/]", "a\\x1b[2Jb", "second line"]


def test_a_progress_bars_label_is_text():
    texts = [column for column in progress.rich_progress().columns if hasattr(column, "text_format")]
    assert len(texts) == 2 and all(column.markup is False for column in texts)


def test_a_one_line_error_stays_one_line_whatever_a_path_holds():
    import repro
    assert repro.OneLineError("folder a\nb\x1b[2J: not a run").message == "folder a\\nb\\x1b[2J: not a run"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_gpucheck_without_cuda_is_one_line():
    out = subprocess.run([sys.executable, "-m", "tools.gpucheck"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr, out.stderr[-2000:]
    line, = out.stderr.strip().splitlines()
    assert line.startswith("Error: no CUDA device here") and "--device cpu" in line


def test_a_ctrl_c_while_repro_imports_is_one_line(tmp_path):
    """The interrupt arrives in the first import (a click that raises KeyboardInterrupt as it loads stands in for
    the Ctrl-C: deterministic, where a signal's timing is not)."""
    (tmp_path / "click").mkdir()
    (tmp_path / "click" / "__init__.py").write_text("raise KeyboardInterrupt\n")
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), "--scale", "toy", "--dry-run"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 130 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == ["Error: interrupted: repro.py stopped while it loaded, before it started "
                                               "anything"]
