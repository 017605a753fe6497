"""Fault injection: a process killed at a named point, so that the tests can check what a kill at any moment
leaves behind and that every run resumes from it.

    NORMGROW_KILL_AT=saved:post-grow:4 python repro.py train ...   # SIGKILLed after step 4's checkpoints
"""

import os
import signal


def kill_point(event: str, name: str, step: int = 0):
    """NORMGROW_KILL_AT=<event>:<name>:<step> SIGKILLs this process right here. Events of a run: opened, stepped
    (before evaluation and checkpoints), evaluated (before its log line), writing-kept / writing-latest (midway
    through a checkpoint), swapping-kept / swapping-latest (midway through the folder swap), saved, done; of a
    suite: prepared:data, reported:<experiment>."""
    if armed(event, name, step):
        os.kill(os.getpid(), signal.SIGKILL)


def armed(event: str, name: str, step: int = 0) -> bool:
    """Whether kill_point(event, name, step) will kill: a point whose meaning needs work done first asks."""
    return os.environ.get("NORMGROW_KILL_AT") == f"{event}:{name}:{step}"
