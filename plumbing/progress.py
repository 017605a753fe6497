"""What a command shows while it trains (grow.train_together): a bar for each run training ("run 3 of 12", its
loss, tokens/s and time left) and, for several runs, one for all of them, counted across the command's lockstep
groups and seeds by one `Runs` on its Workspace. A number shows only once a step has measured it: "--" before.
"""

import time
from pathlib import Path


class Runs:
    """The runs one command trains: which is which of how many, the steps each has left, and their pace (or ALL's)."""
    ALL = None

    def __init__(self, clock=time.monotonic):
        self.left: dict[Path, int] = {}     # run folder -> steps it has left
        self.numbers: dict[Path, int] = {}  # run folder -> its place in the command, from 1
        self.clock = clock
        self.first: dict[Path | None, tuple[float, int]] = {}  # the time and count of the first step measured
        self.last: dict[Path | None, tuple[float, int]] = {}   # ... and of the latest

    def plan(self, jobs):
        """[(config, run folder)] this command trains, each counted once, with the steps it computes itself
        (config.RunConfig.own_steps)."""
        for config, run_dir in jobs:
            self.left.setdefault(Path(run_dir).absolute(), config.own_steps)

    def opened(self, run_dir, step: int, last_step: int):
        """A run resumed at `step` of `last_step`, numbered if it is not yet (in the order runs start)."""
        self.left[Path(run_dir).absolute()] = last_step - step
        self.label(run_dir)

    def ended(self, run_dir):
        self.left[Path(run_dir).absolute()] = 0

    def stepped(self, run_dir):
        run_dir, now = Path(run_dir).absolute(), self.clock()
        self.left[run_dir] = max(0, self.left.get(run_dir, 1) - 1)
        for key in (run_dir, self.ALL):
            count = self.last.get(key, (now, 0))[1] + 1
            self.first.setdefault(key, (now, count))
            self.last[key] = (now, count)

    def seconds_left(self, run_dir=ALL) -> float | None:
        """A run's steps left at its rate, or (ALL) every run's at the command's, measured from the first step (which
        pays the warm-up) to the latest: None until a second step."""
        key = run_dir if run_dir is self.ALL else Path(run_dir).absolute()
        if key not in self.first or self.last[key][1] == self.first[key][1]:
            return None
        (start, a), (end, b) = self.first[key], self.last[key]
        steps = sum(self.left.values()) if key is self.ALL else self.left.get(key, 0)
        return steps * ((end - start) / (b - a))

    def label(self, run_dir) -> str:
        """"run i of n": its number is the next one the first time it is asked for."""
        number = self.numbers.setdefault(Path(run_dir).absolute(), len(self.numbers) + 1)
        return f"run {number} of {len(self.left)}"

    def finished(self) -> int:
        return sum(1 for n in self.left.values() if n == 0)


def stats_text(loss: float | None, tok_s: float | None, seconds_left: float | None) -> str:
    """A bar's numbers; "--" for one not measured yet (before the first step: no loss, no rate, no time left)."""
    return (f"loss {'--' if loss is None else f'{loss:.4f}'}  {'--' if tok_s is None else f'{tok_s:,.0f}'} tok/s  "
            f"{clock_text(seconds_left)} left")


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Bars:
    """The bars of one train_together call: rich's on an interactive rank-0 terminal (else none), counted anyway."""

    def __init__(self, ctx, runs: Runs, jobs):
        from rich.console import Console
        runs.plan(jobs)
        self.runs, self.tasks, self.all = runs, {}, None
        self.rich = rich_progress() if ctx.is_main and Console().is_terminal else None

    def __enter__(self):
        if self.rich:
            self.rich.start()
            if len(self.runs.left) > 1:
                self.all = self.rich.add_task("all runs", total=len(self.runs.left), stats="")
                self.update_all()
        return self

    def __exit__(self, *exc):
        if self.rich:
            self.rich.stop()

    def add(self, run_dir, name: str, step: int, last_step: int):
        """A run opened at `step`: its bar, with nothing measured yet."""
        self.runs.opened(run_dir, step, last_step)
        if self.rich:
            self.tasks[run_dir] = self.rich.add_task(f"{self.runs.label(run_dir)}: {name}", total=last_step,
                                                     completed=step, stats=stats_text(None, None, None))
            self.update_all()

    def describe(self, run_dir, what: str):
        if self.rich:
            self.rich.update(self.tasks[run_dir], description=f"{self.runs.label(run_dir)}: {what}")

    def step(self, run_dir, loss: float, tok_s: float):
        self.runs.stepped(run_dir)
        if self.rich:
            self.rich.update(self.tasks[run_dir], advance=1,
                             stats=stats_text(loss, tok_s, self.runs.seconds_left(run_dir)))
            self.update_all()

    def end(self, run_dir):
        self.runs.ended(run_dir)
        if self.rich:
            self.rich.update(self.tasks[run_dir], visible=False)
            self.update_all()

    def update_all(self):
        if self.all is not None:
            self.rich.update(self.all, total=len(self.runs.left), completed=self.runs.finished(),
                             stats=f"runs done; {clock_text(self.runs.seconds_left())} left at the rate so far")


def rich_progress():
    """Bars without rich's own time remaining (from the last 30 s of one bar): the time left is Runs'."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),  # labels: text
                    TextColumn("{task.fields[stats]}", markup=False))
