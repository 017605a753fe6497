"""The toy's student step with its layers compiled for the fixed shapes of its padded batches (data.fixed_shape),
against eager on the same padded batches and on batches as wide as their documents: compile time, step time, and
how many steps pay the compile back. `repro.py bench` runs it (results/bench.json's "compile").
"""

import os
import statistics
import tempfile
import time
from contextlib import nullcontext
from dataclasses import replace
from unittest import mock

import torch

from plumbing import devices
from tools import utilization
from tools.utilization import interleaved, length_batch

# Documents' lengths in the compiled step's micro-batches, as fractions of max_len (toy: 128, 116, 96, 128, 101,
# 88): varied, as micro-batches of fewer or shorter documents than the toy's are (the toy's own are all 128
# wide: one document in four fills max_len).
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
    settings, shape, seq = utilization.distinct_steps((scale,))[f"{scale} student"]
    lengths = [max(1, round(f * seq)) for f in LENGTH_FRACTIONS]
    ways = {"eager": False, "eager at fixed shapes": False, "compiled": True}
    steps = {way: utilization.Step(replace(settings, compile=compiled), shape, seq, dtype) for way, compiled in ways.items()}
    batches = {way: [length_batch(settings.micro_batch, n, seq, shape.vocab_size, fixed=way != "eager") for n in lengths]
               for way in ways}
    losses, first = {way: [] for way in ways}, {}
    for way, step in steps.items():  # the first pass over every length: the compile, for the compiled one
        start = time.perf_counter()
        losses[way] = [step(batch) for batch in batches[way]]
        first[way] = time.perf_counter() - start
    loss_diff = max(abs(a - b) / abs(a) for a, b in zip(losses["eager"], losses["compiled"]))
    rounds = interleaved({way: (lambda way=way: [steps[way](b) for b in batches[way]], nullcontext) for way in ways},
                         repeats, pick=list, clock=utilization.step_clock()[1])
    per_step = {way: statistics.median(each) / len(lengths) for way, each in rounds.items()}
    saving = per_step["eager"] - per_step["compiled"]
    compile_s = first["compiled"] - first["eager at fixed shapes"]
    return {"precision": str(dtype).removeprefix("torch."), "lengths": lengths,
            "widths": [b.input_ids.shape[1] for b in batches["compiled"]], "eager_step_s": per_step["eager"],
            "eager_fixed_step_s": per_step["eager at fixed shapes"], "compiled_step_s": per_step["compiled"],
            "speedup": utilization.ratio_spread([(rounds["eager"], rounds["compiled"])]),
            "speedup_at_fixed_shapes": utilization.ratio_spread([(rounds["eager at fixed shapes"], rounds["compiled"])]),
            "compile_s": compile_s, "break_even_steps": compile_s / saving if saving > 0 else None,
            "max_relative_loss_difference": loss_diff}
