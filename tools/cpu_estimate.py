"""This machine: the dry run's estimate of how long a command's training takes on the CPU it runs on
(tools/preflight.py prints it beside the plan).
"""
from pathlib import Path

import rundir
from plumbing import devices
from tools import utilization
from tools.plan import duration_text


def cpu_estimate(flops: float, precision: str, bench_file: Path) -> str:
    """How long `flops` of the kit's training take on this CPU, one estimate: at the speed `repro.py bench`
    measured for the kit's toy train step (bench_file), else at a few toy student steps timed now
    (utilization.step_rate), in the precision the runs would use; for a quiet machine, which it says, and where
    other processes hold the cores now (utilization.busy_load), that too."""
    step = rundir.read_json(bench_file, "train_step")["train_step"] if bench_file.is_file() else {}
    if "step_gflop" in step:  # a bench.json from before bench wrote it has none: timed now instead
        dtype = "bf16" if precision != "fp32" and "kit_post_bf16_s" in step else "fp32"
        rate = step["step_gflop"] * 1e9 / step[f"kit_post_{dtype}_s"]
        source = f"as {bench_file} measured it on {rundir.read_json(bench_file)['environment'].get('date')}"
    else:  # where bf16 is emulated a bf16 step takes minutes: fp32's rate (bf16 runs are slower still)
        dtype = "bf16" if precision != "fp32" and devices.cpu_bf16_speedup() >= devices.BF16_MIN_SPEEDUP else "fp32"
        rate, source = utilization.step_rate(devices.DTYPES[dtype]), "timed now"
    busy = utilization.busy_load()
    seconds = flops / rate  # "about" a measured time, never "about under a second"
    time_taken = f"about {duration_text(seconds)}" if seconds >= 1 else duration_text(seconds)
    return (f"{time_taken} on this CPU ({rate / 1e9:,.1f} GFLOP/s: the kit's {dtype} toy step "
            f"{source}), on a quiet machine" + (f"; busy now (load {busy[0]:.1f} on {busy[1]} cores), so longer"
                                                if busy else ""))
