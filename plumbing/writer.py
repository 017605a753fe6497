"""Checkpoint writes in the background: a checkpoint's tensors are copied to host memory while training waits; its
files are then written, hashed and renamed into place on one writer thread while training goes on (DCP's async_save
writes no checksums and pickles: docs/benchmarks/2026-12-04-epyc-2core-checkpoint-writes.md).

    writer.writes().submit(run_dir, write)         # a checkpoint's files written while training goes on
    writer.wait_for_writes(run_dir)                # ...finished (or their error raised) before it is read
"""

import threading
from collections import Counter, deque
from pathlib import Path
from typing import Callable

import torch.distributed as dist


class BackgroundWrites:
    """One writer thread, its jobs in order, each tagged with its folder: waiting on a folder waits for its jobs and
    raises the first error one met (a later job of that folder is dropped: the rerun writes it). Not a daemon: a
    process that exits finishes its writes first. `inline`: each job runs at once on the submitting thread."""

    def __init__(self, inline: bool = False):
        self.inline = inline
        self.changed = threading.Condition()
        self.jobs: deque = deque()
        self.pending: Counter = Counter()
        self.errors: dict[str, BaseException] = {}
        self.thread: threading.Thread | None = None

    def submit(self, folder, work: Callable[[], None]):
        key = str(Path(folder).resolve())
        with self.changed:
            self.jobs.append((key, work))
            self.pending[key] += 1
            if self.thread is None and not self.inline:
                self.thread = threading.Thread(target=self.run, name="checkpoint-writer")
                self.thread.start()
        if self.inline:
            self.run()
            self.wait(folder)

    def run(self):
        while True:
            with self.changed:
                if not self.jobs:
                    self.thread = None
                    return
                key, work = self.jobs.popleft()
                failed = key in self.errors
            try:
                if not failed:
                    work()
            except BaseException as e:  # noqa: BLE001 - raised on the training thread, by wait()
                with self.changed:
                    self.errors.setdefault(key, e)
            with self.changed:
                self.pending[key] -= 1
                self.changed.notify_all()

    def wait(self, folder):
        """Until `folder`'s writes have finished; then the first error one met. On the writer thread itself, at once."""
        if self.thread is not None and threading.current_thread() is self.thread:
            return
        key = str(Path(folder).resolve())
        with self.changed:
            self.changed.wait_for(lambda: not self.pending[key])
            error = self.errors.pop(key, None)
        if error is not None:
            raise error


WRITES = BackgroundWrites()
_RANK_WRITES = threading.local()


def writes() -> BackgroundWrites:
    """This process's writer; an inline one of its own for a rank that is a thread of torch's threaded group (one
    writer thread could not stand for each rank at its barriers) or a process on the fake group (no real ranks to
    make the writer's gloo group with)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_backend() in ("threaded", "fake")):
        return WRITES
    if not hasattr(_RANK_WRITES, "writes"):
        _RANK_WRITES.writes = BackgroundWrites(inline=True)
    return _RANK_WRITES.writes


def wait_for_writes(folder):
    """A run's checkpoint writes finished (their error raised here), before anything reads its checkpoints."""
    writes().wait(folder)


class WriterRanks:
    """The ranks as a checkpoint's writer sees them: rank 0, and a barrier on `group` (the writer thread's own:
    two threads' collectives on one group could pair up wrongly; None: the default group)."""

    def __init__(self, rank: int, world: int, group=None):
        self.rank, self.world, self.group = rank, world, group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.world > 1:
            dist.barrier(group=self.group)


_WRITER_GROUP: list = [None, None]  # [the default group it was made beside, the writer's gloo group]


def writer_group():
    """The writer thread's gloo group, made once per default group on the training thread (at the first checkpoint)."""
    world_group = dist.group.WORLD
    if _WRITER_GROUP[0] is not world_group:
        _WRITER_GROUP[:] = [world_group, dist.new_group(backend="gloo")]
    return _WRITER_GROUP[1]
