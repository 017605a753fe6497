"""Where a run executes: one process or torchrun ranks (FSDP2), the device, and the compute precision,
chosen by measuring what the machine does.

    ctx = devices.setup_distributed("auto")        # rank, world size and device (torchrun sets RANK etc.)
    dtype, why = devices.precision_choice("auto", ctx.device, ctx.world)
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch
import torch.distributed as dist

from checkpoint import write_atomic
from errors import TrainingError

# ----------------------------------------------------------------------------------------------
# Distributed helpers. Every rank takes part in evaluation and in every logged reduction.

@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float]) -> list[float]:
        """All-reduce a few Python numbers in float64 (logged losses and counts are global)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()

    def barrier(self):
        if self.world > 1:
            dist.barrier()


DEVICES = ("auto", "cpu", "cuda", "mps")


def choose_device(name: str = "auto") -> torch.device:
    """auto: a CUDA GPU, else Apple silicon's MPS, else the CPU. A device this machine lacks is an error."""
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if name == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if name not in DEVICES or (name == "cuda" and not cuda) or (name == "mps" and not mps):
        raise TrainingError(f"--device {name}: this machine has no such device; use --device auto or cpu")
    return torch.device(name)


def setup_distributed(device: str = "auto") -> Dist:
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; without them this is one process on `device`."""
    chosen = choose_device(device)
    if "RANK" not in os.environ:
        return Dist(device=chosen)
    if chosen.type == "mps":
        raise TrainingError("--device mps: runs under torchrun need CUDA GPUs or CPU ranks; use --device cpu")
    cuda = chosen.type == "cuda"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    return Dist(dist.get_rank(), dist.get_world_size(), device)


def print0(ctx: Dist, *args):
    if ctx.is_main:
        print(*args, flush=True)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # config.PRECISIONS
BF16_MIN_SPEEDUP = 1.5  # bf16 autocast only where its matmuls are clearly faster than fp32's


def precision_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "normgrow" / "cpu-precision.json"


def matmul_speedup_bf16(n: int = 512, repeats: int = 5) -> float:
    """fp32 time / bf16 time of an n x n matmul on this CPU, best of `repeats` each (a fraction of a
    second). Below 1 where bf16 is emulated (no AVX-512-BF16/AMX): there it runs tens of times slower."""
    def best(dtype):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)
    return best(torch.float32) / best(torch.bfloat16)


@cache
def cpu_bf16_speedup() -> float:
    """The probe's answer, cached per machine (CPU model, torch build and thread count) so that every
    run and every resume on one machine makes the same choice."""
    key = f"{platform.machine()} {cpu_model()} torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()} " \
          f"threads {torch.get_num_threads()}"
    path = precision_cache()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict) or not isinstance(cached.get(key), (int, float)):
        cached = cached if isinstance(cached, dict) else {}
        cached[key] = matmul_speedup_bf16()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(cached, indent=2) + "\n")
        except OSError:
            pass  # a read-only home: probe again next time
    return float(cached[key])


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def precision_choice(precision: str, device: torch.device, world: int = 1) -> tuple[torch.dtype, str]:
    """(compute dtype, why). "auto" decides by what the machine does: bf16 on a CUDA GPU that supports
    it; on a CPU, bf16 autocast only where a matmul probe measures it >= BF16_MIN_SPEEDUP x fp32, and
    in one process (FSDP2's bf16 mixed precision is for GPUs; on CPU ranks its gradients fail)."""
    if precision != "auto":
        return DTYPES[precision], f"{precision} (set by the preset)"
    if device.type == "cpu" and world > 1:
        return torch.float32, "auto: fp32 (several CPU ranks: FSDP2 mixed precision is for GPUs)"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "auto: bf16 (CUDA GPU with bf16)"
        return torch.float32, "auto: fp32 (this CUDA GPU has no bf16)"
    if device.type != "cpu":
        return torch.float32, f"auto: fp32 (bf16 autocast is not used on {device.type})"
    speedup = cpu_bf16_speedup()
    if speedup >= BF16_MIN_SPEEDUP:
        return torch.bfloat16, f"auto: bf16 (a bf16 matmul ran {speedup:.1f}x as fast as fp32 on this CPU)"
    return torch.float32, (f"auto: fp32 (a bf16 matmul ran {speedup:.2f}x as fast as fp32 on this CPU, below "
                           f"{BF16_MIN_SPEEDUP}x; bf16 is emulated or slow here)")


def shard_fn(ctx: Dist, compute_dtype: torch.dtype, shard_root: bool):
    """FSDP2: one unit per decoder layer, then the root (torchtitan's recipe). None in one process."""
    if ctx.world == 1:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)

    def apply(net):
        for layer in net.layers:
            fully_shard(layer, mp_policy=mp)
        if shard_root:
            fully_shard(net, mp_policy=mp)
    return apply
