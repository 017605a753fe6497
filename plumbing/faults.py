"""Fault injection: a process killed at a named point, so that the tests can check what a kill at any
moment leaves behind and that every run resumes from it (tests/test_resume.py, test_faults.py, test_lockstep.py).

    NORMGROW_KILL_AT=saved:post-grow:4 python repro.py train ...   # SIGKILLed after step 4's checkpoints
"""
from __future__ import annotations

import os
import signal


def kill_point(event: str, name: str, step: int = 0):
    """Fault injection for the resume tests: NORMGROW_KILL_AT=<event>:<name>:<step> SIGKILLs this
    process right there. Events of a run <name>: opened (model built, checkpoint or prefix loaded),
    stepped (after the update and its log line, before evaluation and checkpoints), evaluated (after
    an evaluation, before its log line), writing-kept / writing-latest (a checkpoint's weights written
    to its temporary folder, the rest not yet), swapping-kept / swapping-latest (the old folder moved
    away, the new one not yet in place), saved (after the step's checkpoints), done (after done.json).
    Of a suite: prepared:data (shards written), reported:<experiment> (its report written)."""
    if armed(event, name, step):
        os.kill(os.getpid(), signal.SIGKILL)


def armed(event: str, name: str, step: int = 0) -> bool:
    """Whether kill_point(event, name, step) will kill: a point whose meaning needs work done first asks."""
    return os.environ.get("NORMGROW_KILL_AT") == f"{event}:{name}:{step}"
