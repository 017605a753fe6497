"""How near this CPU's matmul peak the kit's training steps run, and where the rest of their time goes.

    python repro.py bench                       # its first rows; results/bench.json's "utilization"
    OMP_NUM_THREADS=1 python repro.py bench     # on one thread (where another process holds the other cores)

The steps (distinct_steps): each scale's student and teacher step on one micro-batch whose documents all fill
max_len. A step's fraction of peak is its model FLOPs over its seconds against the best square matmul of
PEAK_SIZES, the two timed in turns; a bf16 step runs only where the precision probe picks bf16 (emulated, one
takes minutes). Every ratio the bench prints comes with its spread over paired rounds and processes.

For the dry run (tools/cpu_estimate.py) where the bench has not run: a few toy student steps timed now
(step_rate), and whether other processes hold the cores (busy_load).
"""

import os
import statistics
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from functools import partial
from typing import Callable
from unittest import mock

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

import config
import data
import grow
import model
import nets
from experiments import presets
from plumbing import devices
from plumbing.flops import forward_flops_per_token
from plumbing.hf_qwen3 import ModelConfig

SCALES = ("toy", "mini")
PEAK_SIZES = (1024, 2048)
MAX_MATMUL_S = 0.5  # a larger square matmul is timed only while the last one took less
# (group, names that place an operator in it, in its own name or an enclosing one's), tried in order: the loss's
# head matmuls belong to the loss.
GROUPS = (("vocabulary head and loss", ("_ChunkedLoss",)),
          ("optimizer", ("optimizer",)),
          ("attention", ("scaled_dot_product", "ScaledDotProduct")),
          ("linear layers", ("aten::linear", "aten::mm", "aten::addmm", "aten::matmul", "MmBackward")))
ELEMENTWISE = "norms, elementwise and other operators"
PYTHON = "Python outside operators"


def interleaved(variants: dict, repeats: int, pick=statistics.median, clock=time.perf_counter) -> dict:
    """Seconds of each variant (function, context factory; the context outside the clock) by `clock`, the median
    of `repeats` (or `pick`: `list` keeps every round's), timed in turns (A B C A B C ...) so that drift in a
    shared machine's speed lands on all alike, and round i of one pairs with round i of another."""
    times = {name: [] for name in variants}
    for round_ in range(repeats + 2):
        for name, (fn, context) in variants.items():
            with context():
                start = clock()
                fn()
                if round_ >= 2:  # two warm-up rounds
                    times[name].append(clock() - start)
    return {name: pick(t) for name, t in times.items()}


# A ratio whose rounds range further than this from their median either way is printed as unstable, not as a
# number: the bench's goals sit 15-30% apart, and a quiet machine's rounds agree within a few percent, so rounds
# 10% off can no longer place a ratio on the right side of its goal (the machine moved under the measurement).
UNSTABLE_SPREAD = 0.10


def spread(values_by_process: list[list[float]]) -> dict:
    """A measured value over all rounds of all processes: median, min, max, each process's median, and "stable"."""
    every = [v for values in values_by_process for v in values]
    middle = statistics.median(every)
    return {"median": middle, "min": min(every), "max": max(every),
            "per_process": [statistics.median(values) for values in values_by_process],
            "rounds": len(every), "processes": len(values_by_process),
            "stable": (1 - UNSTABLE_SPREAD) * middle <= min(every) and max(every) <= (1 + UNSTABLE_SPREAD) * middle}


def ratio_spread(pairs_by_process: list[tuple[list[float], list[float]]]) -> dict:
    """The spread of numerator / denominator round by round, over all processes."""
    return spread([[n / d for n, d in zip(numerators, denominators, strict=True)]
                   for numerators, denominators in pairs_by_process])


def spread_text(measured: dict, form=lambda v: f"{v:.2f}x") -> str:
    """"1.15x (1.12x-1.18x over 10 rounds in 2 processes)", or "unstable (0.90x-1.50x over ...)"."""
    where = f"{measured['rounds']} round{'s' * (measured['rounds'] != 1)} in {measured['processes']} " \
            f"process{'es' * (measured['processes'] != 1)}"
    extent = f"{form(measured['min'])}-{form(measured['max'])} over {where}"
    return f"{form(measured['median'])} ({extent})" if measured["stable"] else f"unstable ({extent})"


def timed_once(fn, clock=time.perf_counter) -> float:
    start = clock()
    fn()
    return clock() - start


def timed(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(timed_once(fn) for _ in range(repeats))


def step_clock() -> tuple[str, Callable[[], float]]:
    """(its name, the clock): on one thread the thread's CPU time, which counts what a step costs and not its wait
    for a core on a shared machine; on several, the wall clock."""
    if torch.get_num_threads() == 1:
        return "CPU time of the one thread", time.thread_time
    return "wall clock", time.perf_counter


# Model FLOPs and the fraction of peak

def student_step_flops(shape: ModelConfig, student_layers: int, tokens: float, seq: float, recompute: bool = False) -> float:
    """Model FLOPs of a student step, every block trained: teacher and both heads forward, the student forward and
    backward (3x); with `recompute`, its forward again under activation checkpointing (the rehearsal's compute)."""
    teacher_layers, head = forward_flops_per_token(shape, shape.num_hidden_layers, seq / 2)
    student, _ = forward_flops_per_token(shape, student_layers, seq / 2)
    return tokens * (teacher_layers + head + 3 * (student + head) + (student if recompute else 0.0))


def fraction_of_peak(flops: float, seconds: float, peak_flops: float) -> dict:
    """A step's row: its model GFLOP, seconds, GFLOP/s and that as a fraction of the matmul peak."""
    return {"gflop": flops / 1e9, "seconds": seconds, "gflops": flops / seconds / 1e9,
            "fraction_of_peak": flops / seconds / peak_flops}


# The steps, as grow takes them

class Step:
    """One optimizer step of `settings` on one full-length micro-batch, as Run.accumulate and Run.update take it."""

    def __init__(self, settings: config.RunConfig, shape: ModelConfig, seq: int, dtype: torch.dtype):
        self.settings, self.shape, self.dtype, self.ctx = settings, shape, dtype, devices.Dist()
        teacher = model.Qwen3(shape)
        teacher.init_weights(0)
        if settings.compile:  # as nets.load_teacher compiles a run's teacher
            devices.compile_layers(teacher)
        self.teacher = None if settings.protocol == "teacher" else nets.Teacher(teacher.eval().requires_grad_(False))
        self.net = nets.build_model(settings, self.teacher, self.ctx, dtype)
        self.phase = config.plan_phases(settings)[-1]
        self.params = grow.trainable_parameters(self.net, self.phase)
        self.optimizer = grow.build_optimizer(settings, self.params)
        self.batch = length_batch(settings.micro_batch, seq, seq, shape.vocab_size, fixed=False)
        self.tokens, self.seq = self.batch.n_targets, seq

    def flops(self) -> float:
        if self.teacher is None:  # a teacher pretraining step: its layers and head forward and backward
            layers, head = forward_flops_per_token(self.shape, self.shape.num_hidden_layers, self.seq / 2)
            return self.tokens * 3 * (layers + head)
        return student_step_flops(self.shape, len(self.net.layers), self.tokens, self.seq)

    def __call__(self, batch: data.Batch | None = None) -> float:
        """The step on `batch` (default: the full-length one); its loss."""
        batch = batch or self.batch
        with devices.autocast(self.dtype, self.ctx):
            hidden, head = (None, None) if self.teacher is None else \
                (self.teacher.hidden(batch.input_ids, doc_lengths=batch.doc_lengths), self.teacher.head_weight)
            loss, _, _ = nets.loss_fn(self.settings, batch, hidden, head, self.phase, batch.n_targets, self.net)
        loss.backward()
        with record_function("optimizer"):
            devices.clip_gradients(self.params, self.settings.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def length_batch(rows: int, length: int, max_len: int, vocab: int, fixed: bool) -> data.Batch:
    """`rows` documents of `length` random tokens, as wide as they are or (`fixed`) padded to their bucket."""
    ids = torch.randint(0, vocab, (rows, length + 1), generator=torch.Generator().manual_seed(length))
    width = data.bucket_width(length, max_len) if fixed else length
    inputs, targets = (F.pad(t, (0, width - length)) for t in (ids[:, :-1], ids[:, 1:]))
    lengths = torch.full((rows,), length)
    return data.Batch(inputs, targets, torch.arange(width)[None, :] < lengths[:, None], lengths, list(range(rows)),
                      rows * length)


def distinct_steps(scales=SCALES) -> dict[str, tuple[config.RunConfig, ModelConfig, int]]:
    """{"toy, mini student": (settings, teacher shape, length), ...}: one entry per step shape, named by the scales
    that share it; a scale's post-norm joint student or its teacher, with no data."""
    steps: dict[str, tuple] = {}
    for kind in ("student", "teacher"):
        shapes: dict[str, list] = {}
        for scale in scales:
            preset = presets.PRESETS[scale]
            run = {**preset.run, "protocol": "joint", "norm": "post"} if kind == "student" else \
                {**preset.run, **preset.teacher_run, "protocol": "teacher", "norm": "pre",
                 "teacher_config": asdict(presets.teacher_shape(preset))}
            settings = config.RunConfig(**{**run, "name": f"{scale} {kind}", "seed": 0, "train_data": "", "val_data": "",
                                           "replay_docs": run["global_batch"]})
            key = repr((asdict(settings) | {"name": "", "phase_steps": 0, "eval_interval": 0, "snapshot_interval": 0},
                        preset.teacher_model, preset.data["max_len"], preset.data["vocab_size"]))
            shapes.setdefault(key, []).append((scale, settings, presets.teacher_shape(preset), preset.data["max_len"]))
        for same in shapes.values():
            steps[f"{', '.join(s for s, *_ in same)} {kind}"] = same[0][1:]
    return steps


def step_rate(dtype: torch.dtype, scale: str = "toy", rows: int = 4, repeats: int = 2) -> float:
    """FLOP/s of a scale's student step on `rows` documents, timed now (a second or two): a few rows run at the
    whole micro-batch's rate (toy, one thread: 56 GFLOP/s on 4 rows, 49 on its 16) in a quarter of its time."""
    settings, shape, seq = distinct_steps((scale,))[f"{scale} student"]
    step = Step(replace(settings, micro_batch=rows, global_batch=rows), shape, seq, dtype)
    _, clock = step_clock()
    step()  # the first step allocates what the others reuse
    return step.flops() / min(timed_once(step, clock) for _ in range(repeats))


def busy_load() -> tuple[float, int] | None:
    """(the 1-minute load average, the cores) where the load is above the cores this process's threads leave
    (half a core's slack, for its own recent work); None on a quiet machine, or without a load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = os.cpu_count() or 1
    return (load, cores) if load > cores - torch.get_num_threads() + 0.5 else None


# Measured: the steps against the matmul peak, then where a step's time goes

def matmul_variants(precision: str, sizes=PEAK_SIZES, clock=time.perf_counter) -> tuple[dict, dict]:
    """(the matmul variants, seconds of a first call) for the square sizes up to one that takes MAX_MATMUL_S."""
    variants, first = {}, {}
    for n in sizes:
        a, b = (torch.randn(n, n).to(devices.DTYPES[precision]) for _ in range(2))
        name = f"matmul {n} {precision}"
        variants[name], first[name] = (partial(torch.mm, a, b), nullcontext), timed_once(partial(torch.mm, a, b), clock)
        if first[name] > MAX_MATMUL_S:
            break
    return variants, first


def peaks(seconds: dict) -> dict[str, dict]:
    """{precision: {"<n>": GFLOP/s of each timed size, "best": the best}} from interleaved's seconds."""
    out: dict[str, dict] = {}
    for name, s in seconds.items():
        if name.startswith("matmul "):
            _, n, precision = name.split()
            out.setdefault(precision, {})[n] = 2 * int(n) ** 3 / s / 1e9
    return {p: {**sizes, "best": max(sizes.values())} for p, sizes in out.items()}


def round_fractions(flops: float, step_rounds: list[float], matmul_rounds: dict[str, list[float]]) -> list[float]:
    """A step's fraction of peak in each round, against the same round's best matmul: the spread over rounds is
    the fraction's own, not the matmul's luck."""
    peak_rounds = [max(2 * int(name.split()[1]) ** 3 / s for name, s in zip(matmul_rounds, one_round))
                   for one_round in zip(*matmul_rounds.values())]
    return [flops / s / peak for s, peak in zip(step_rounds, peak_rounds, strict=True)]


def measure(repeats: int = 5, scales=SCALES, profiled_steps: int = 3) -> dict:
    """Every distinct step of `scales` against the matmul peak, and the profile of each in the kit's precision."""
    dtype, why = devices.precision_choice("auto", torch.device("cpu"))
    step_precisions = ["fp32"] + (["bf16"] if dtype == torch.bfloat16 else [])
    steps = {f"{label} {p}": Step(*spec, devices.DTYPES[p]) for label, spec in distinct_steps(scales).items()
             for p in step_precisions}
    variants = {name: (step, nullcontext) for name, step in steps.items()}
    for p in step_precisions:
        variants.update(matmul_variants(p)[0])
    clock_name, clock = step_clock()
    rounds = interleaved(variants, repeats, pick=list, clock=clock)
    seconds = {name: min(each) for name, each in rounds.items()}  # the peak: each size's best round
    if "bf16" not in step_precisions:  # emulated: one call of its smallest matmul, apart
        seconds.update(matmul_variants("bf16", clock=clock)[1])
    peak = peaks(seconds)
    rows = {}
    for name, step in steps.items():
        precision = name.rsplit(" ", 1)[1]
        matmuls = {m: each for m, each in rounds.items() if m.startswith("matmul ") and m.endswith(precision)}
        rows[name] = {**fraction_of_peak(step.flops(), statistics.median(rounds[name]), peak[precision]["best"] * 1e9),
                      "fraction_of_peak": spread([round_fractions(step.flops(), rounds[name], matmuls)])}
    profiles = {name.rsplit(" ", 1)[0]: profile_groups(step, profiled_steps) for name, step in steps.items()
                if name.endswith(step_precisions[-1])}  # in the precision the kit picks here
    return {"threads": torch.get_num_threads(), "clock": clock_name, "precision": why, "peak_gflops": peak,
            "steps": rows, "profile": profiles}


def profile_groups(step, steps: int = 3) -> dict[str, float]:
    """`steps` steps under torch.profiler (after two unprofiled), their time as fractions by group."""
    step()
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - start
    return grouped([(enclosing_names(e), e.self_cpu_time_total / 1e6) for e in prof.events()], wall)


def enclosing_names(event) -> tuple[str, ...]:
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    return tuple(names)


def grouped(operators: list[tuple[tuple[str, ...], float]], wall_s: float) -> dict[str, float]:
    """{group: fraction of the whole}: each operator's own seconds to the first group of GROUPS one of its names (innermost
    first) matches, else ELEMENTWISE; the wall time no operator accounts for to PYTHON. The fractions sum to 1."""
    seconds = dict.fromkeys([*(group for group, _ in GROUPS), ELEMENTWISE], 0.0)
    for names, own in operators:
        group = next((g for g, keys in GROUPS if any(key in name for name in names for key in keys)), ELEMENTWISE)
        seconds[group] += own
    whole = max(wall_s, sum(seconds.values()))
    seconds[PYTHON] = whole - sum(seconds.values())
    return {group: s / whole for group, s in seconds.items()}


# The compiled step against eager (bench's "compile" row)

# Documents' lengths in the compiled step's micro-batches, as fractions of max_len (toy: 128, 116, 96, 128, 101,
# 88): varied, as micro-batches of fewer or shorter documents than the toy's are.
LENGTH_FRACTIONS = (1.0, 0.91, 0.75, 1.0, 0.79, 0.69)


def bench_compile(repeats: int, cold: bool = True, scale: str = "toy") -> dict:
    """A scale's student step (bf16 where native) over micro-batches of LENGTH_FRACTIONS, eager as wide as their
    documents, eager and compiled padded to their buckets: compile time, step times and their speed-ups, the loss
    difference. Inductor compiles into an empty cache (`cold`): what a first run pays."""
    if cold:
        with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}):
            torch._dynamo.reset()
            return bench_compile(repeats, False, scale)
    dtype, _ = devices.precision_choice("auto", torch.device("cpu"))
    settings, shape, seq = distinct_steps((scale,))[f"{scale} student"]
    lengths = [max(1, round(f * seq)) for f in LENGTH_FRACTIONS]
    ways = {"eager": False, "eager at fixed shapes": False, "compiled": True}
    steps = {way: Step(replace(settings, compile=compiled), shape, seq, dtype) for way, compiled in ways.items()}
    batches = {way: [length_batch(settings.micro_batch, n, seq, shape.vocab_size, fixed=way != "eager") for n in lengths]
               for way in ways}
    losses, first = {way: [] for way in ways}, {}
    for way, step in steps.items():  # the first pass over every length: the compile, for the compiled one
        start = time.perf_counter()
        losses[way] = [step(batch) for batch in batches[way]]
        first[way] = time.perf_counter() - start
    loss_diff = max(abs(a - b) / abs(a) for a, b in zip(losses["eager"], losses["compiled"]))
    rounds = interleaved({way: (lambda way=way: [steps[way](b) for b in batches[way]], nullcontext) for way in ways},
                         repeats, pick=list, clock=step_clock()[1])
    per_step = {way: statistics.median(each) / len(lengths) for way, each in rounds.items()}
    saving = per_step["eager"] - per_step["compiled"]
    compile_s = first["compiled"] - first["eager at fixed shapes"]
    return {"precision": str(dtype).removeprefix("torch."), "lengths": lengths,
            "widths": [b.input_ids.shape[1] for b in batches["compiled"]], "eager_step_s": per_step["eager"],
            "eager_fixed_step_s": per_step["eager at fixed shapes"], "compiled_step_s": per_step["compiled"],
            "speedup": ratio_spread([(rounds["eager"], rounds["compiled"])]),
            "speedup_at_fixed_shapes": ratio_spread([(rounds["eager at fixed shapes"], rounds["compiled"])]),
            "compile_s": compile_s, "break_even_steps": compile_s / saving if saving > 0 else None,
            "max_relative_loss_difference": loss_diff}


# Issue 38's goals for the toy student step, of the peak of the precision the CPU runs fast.
STUDENT_GOALS = {"fp32": 0.60, "bf16": 0.35}


def summary(measured: dict) -> list[str]:
    """measure()'s results as the lines bench prints."""
    lines = [f"precision here: {measured['precision']}; {measured['threads']} thread(s), timed by {measured['clock']}"]
    for precision, sizes in measured["peak_gflops"].items():
        each = ", ".join(f"{n}: {g:,.1f}" for n, g in sizes.items() if n != "best")
        lines.append(f"{precision} matmul peak {sizes['best']:,.1f} GFLOP/s (square sizes {each})")
    for name, row in measured["steps"].items():
        precision = name.rsplit(" ", 1)[1]
        goal = f" (goal >= {STUDENT_GOALS[precision]:.0%})" if "student" in name else ""
        lines.append(f"{name}: {row['gflop']:.1f} GFLOP in {row['seconds']:.3f} s (median) = {row['gflops']:.1f} "
                     f"GFLOP/s, {spread_text(row['fraction_of_peak'], '{:.1%}'.format)} of the {precision} peak{goal}")
    for name, groups in measured["profile"].items():
        lines.append(f"{name}, where the time goes: " + ", ".join(f"{g} {f:.0%}" for g, f in groups.items()))
    return lines
