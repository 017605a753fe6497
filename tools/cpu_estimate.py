"""This machine: the dry run's estimate of how long a command's training takes on the CPU it runs on
(tools/preflight.py prints it beside the plan), in the precision the runs train in, at the speed of the kit's
toy train step: as `repro.py bench` measured it (bench_rate), else a few steps timed now (timed_rate). A
bench.json it cannot use is never an error: the estimate says in one clause why the file was not used.
"""
from pathlib import Path

import torch

from plumbing import checkpoint, devices
from tools import utilization
from tools.plan import duration_text

# What a bench.json's numbers may be (the toy step: 27 GFLOP in well under a minute; the tests' a few MFLOP): past
# these, or a rate above a petaFLOP/s or below a megaFLOP/s, the file was edited or damaged.
STEP_GFLOP_RANGE = (1e-6, 1e6)
STEP_SECONDS_RANGE = (1e-6, 1e5)
RATE_RANGE = (1e6, 1e15)  # FLOP/s


def bench_rate(bench_file: Path, dtype: str) -> tuple[float | None, str]:
    """(FLOP/s of the kit's toy step in `dtype`, "the kit's ... step as <file> measured it on <date>") from a
    bench.json this CPU measured, or (None, why it was not used; "" where there is no file)."""
    if not bench_file.is_file():
        return None, ""
    try:
        content = checkpoint.loads(bench_file.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None, "not readable JSON"
    environment, step = (content.get(key) if isinstance(content, dict) else None for key in ("environment", "train_step"))
    if not isinstance(environment, dict) or not isinstance(step, dict):
        return None, "no environment or train_step"
    here = (devices.cpu_model(), torch.get_num_threads())
    if (environment.get("cpu"), environment.get("threads")) != here:
        return None, (f"measured on another CPU or thread count ({str(environment.get('cpu'))[:60]}, "
                      f"{str(environment.get('threads'))[:10]} thread(s))")
    measured = dtype if f"kit_post_{dtype}_s" in step else "fp32"
    problem = number_problem(step, "step_gflop", STEP_GFLOP_RANGE) or \
        number_problem(step, f"kit_post_{measured}_s", STEP_SECONDS_RANGE)
    if problem:
        return None, problem
    rate = step["step_gflop"] * 1e9 / step[f"kit_post_{measured}_s"] * precision_factor(dtype, measured)
    if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
        return None, f"its step runs at {rate / 1e9:.3g} GFLOP/s"
    when = environment.get("date") if isinstance(environment.get("date"), str) else "an unknown date"
    return rate, f"the kit's {measured} toy step as {bench_file} measured it on {when[:20]}{factor_text(dtype, measured)}"


def number_problem(values: dict, key: str, bounds: tuple[float, float]) -> str:
    """"" where values[key] is a number within bounds, else what is wrong with it."""
    if key not in values:
        return f"no {key}"
    value = values[key]
    if not checkpoint.finite_number(value):
        return f"{key} is {str(value)[:20]!r}, not a number"
    return "" if bounds[0] <= value <= bounds[1] else f"{key} {value:.3g} is outside {bounds[0]:g}-{bounds[1]:g}"


def precision_factor(dtype: str, measured: str) -> float:
    """How much faster a `dtype` step runs than the `measured` one (bf16's matmul speed-up, or 1)."""
    return devices.cpu_bf16_speedup() if (dtype, measured) == ("bf16", "fp32") else 1.0


def factor_text(dtype: str, measured: str) -> str:
    return f", times bf16's {devices.cpu_bf16_speedup():.3g}x of fp32 in this CPU's matmul probe" \
        if (dtype, measured) == ("bf16", "fp32") else ""


def timed_rate(dtype: str) -> tuple[float, str]:
    """(FLOP/s, its source) of a few toy steps timed now, in bf16 only where bf16 is native."""
    native = dtype == "bf16" and devices.cpu_bf16_speedup() >= devices.BF16_MIN_SPEEDUP
    measured = dtype if dtype == "fp32" or native else "fp32"
    rate = utilization.step_rate(devices.DTYPES[measured]) * precision_factor(dtype, measured)
    return rate, f"the kit's {measured} toy step timed now{factor_text(dtype, measured)}"


def cpu_estimate(flops: float, precision: str, bench_file: Path) -> str:
    """How long `flops` of the kit's training take on this CPU in `precision`, at bench_file's speed or one timed
    now, for a quiet machine (which it says, and that the cores are busy where they are)."""
    chosen, _ = devices.precision_choice(precision, torch.device("cpu"))
    dtype = {v: k for k, v in devices.DTYPES.items()}[chosen]
    rate, source = bench_rate(bench_file, dtype)
    if rate is None:
        unused = f"; {bench_file} not used: {source}" if source else ""
        rate, source = timed_rate(dtype)
        source += unused
    busy = utilization.busy_load()
    seconds = flops / rate  # "about" a measured time, never "about under a second"
    time_taken = f"about {duration_text(seconds)}" if seconds >= 1 else duration_text(seconds)
    return (f"{time_taken} on this CPU ({rate / 1e9:,.1f} GFLOP/s: {source}), on a quiet machine"
            + (f"; busy now (load {busy[0]:.1f} on {busy[1]} cores), so longer" if busy else ""))
