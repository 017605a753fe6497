"""Where a run executes and what a training step does there (docs/design.md's row for plumbing/devices.py).

    ctx = devices.setup_distributed("auto")        # rank, world size and device (torchrun sets RANK etc.)
    dtype, why = devices.precision_choice("auto", ctx.device)
    net = devices.built_on_meta(lambda: model.Qwen3(config), devices.shard_fn(ctx, dtype))
    with devices.autocast(dtype, ctx): ...
"""

import os
import platform
import time
import timeit
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from plumbing.checkpoint import finite_number, loads, write_json
from plumbing.errors import TrainingError, UsageError
from plumbing.hf_qwen3 import ModelConfig

# Distributed helpers. Every rank takes part in evaluation and in every logged reduction.

# A training step's collectives (NCCL's default would be 10 minutes); and the long wait of ranks whose
# rank 0 prepares data or fetches a teacher, on a gloo group of its own so no NCCL watchdog fires.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
PREPARATION_TIMEOUT = timedelta(hours=48)
WAIT_REPORT_SECONDS = 60  # a waiting node prints a line this often


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    local_world: int = 1       # ranks on this node (torchrun's LOCAL_WORLD_SIZE)
    mesh: object = None        # the FSDP2 DeviceMesh: ("shard",), or ("replicate", "shard") over several nodes
    waiting_group: object = None  # a gloo group with PREPARATION_TIMEOUT, for waits on rank 0
    # "auto" for this command where a study fixed it (studies.settle_precision): (fp32 | bf16, why); None: the machine's
    auto_precision: tuple[str, str] | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        return self.world // self.local_world

    @property
    def shard_writers(self) -> int:
        """The ranks that hold distinct shards of a sharded model: all, or under HSDP one node's."""
        return self.local_world if self.nodes > 1 else self.world

    @property
    def shard_group(self) -> tuple[int, int] | None:
        """(this rank's place, their number) among the ranks holding distinct shards; None for a copy (HSDP)."""
        return (self.rank, self.shard_writers) if self.rank < self.shard_writers else None

    def sum(self, values: list[float]) -> list[float]:
        """All-reduce a few Python numbers in float64 (logged losses and counts are global)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()

    def barrier(self):
        if self.world > 1:
            dist.barrier()

    def agree_on(self, value: float) -> bool:
        """True on every rank if every rank holds the same `value` (one all-reduce of max(v) and max(-v))."""
        if self.world == 1:
            return True
        t = torch.tensor([value, -value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0]) == -float(t[1])

    def agree(self, flag: bool) -> bool:
        """True on every rank only if `flag` is true on every rank (one all-reduce)."""
        return flag if self.world == 1 else self.sum([0.0 if flag else 1.0]) == [0.0]

    def on_main(self, work: Callable, what: str):
        """work() on rank 0 while the others wait (on the gloo group whose timeout is hours, one rank a node saying
        once a minute that it still waits for `what`); rank 0's result. If it fails, every rank fails: rank 0 with
        its error, the others with a line pointing at it."""
        result, error = None, None
        if self.is_main:
            try:
                result = work()
            except Exception as e:  # re-raised below, once the other ranks know to stop too
                error = e
        if self.world > 1:
            met = dist.barrier(group=self.waiting_group, async_op=True)
            started, said = time.time(), time.time()
            speaks = self.rank % self.local_world == (1 if self.rank < self.local_world else 0)  # one rank a node
            while not met.is_completed():
                time.sleep(0.5)
                if speaks and time.time() - said >= WAIT_REPORT_SECONDS:
                    print(f"rank {self.rank}: waiting for rank 0 to finish {what} ({(time.time() - started) / 60:.0f} min; "
                          "`repro.py prepare` before torchrun does it ahead)", flush=True)
                    said = time.time()
            met.wait()
        if not self.agree(error is None):
            raise error or TrainingError(f"rank 0 failed while {what}; its message is in its output")
        return result

    def check_shared(self, path: Path, what: str):
        """Every rank sees `path` (rank 0 made it), or every rank stops with one line saying so."""
        seen = Path(path).exists()
        if not self.agree(seen):
            where = f"rank {self.rank}" if not seen else "every rank"  # the advice, on the ranks that lack it too
            raise TrainingError(f"{path}: {what} is not there on {where}; the runs folder (and the teacher's cache) "
                                "must be on a filesystem every node shares, or be copied to each node before the launch")


DEVICES = ("auto", "cpu", "cuda", "mps")


def choose_device(name: str = "auto") -> torch.device:
    """auto: a CUDA GPU, else Apple silicon's MPS, else the CPU. A device this machine lacks is an error."""
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if name == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if name not in DEVICES or (name == "cuda" and not cuda) or (name == "mps" and not mps):
        raise TrainingError(f"--device {name}: this machine has no such device; use --device auto or cpu")
    return torch.device(name)


# Any of the first: a rank of a launch, which needs all of the second (env:// and its GPU); torchrun sets them.
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_rank() -> int | None:
    """This process's rank under torchrun; None for one process. Some of torchrun's variables without the rest,
    or ranks that are not integers: one line, not torch's error from inside init_process_group."""
    if not (present := [name for name in RANK_VARIABLES if name in os.environ]):
        return None
    fix = (f"launch with torchrun (torchrun --nproc_per_node=N repro.py ...), or unset {' '.join(present)} to "
           "run as one process")
    if missing := [name for name in TORCHRUN_VARIABLES if name not in os.environ]:
        raise UsageError(f"{', '.join(present)} set in the environment without {', '.join(missing)}, which "
                         f"torchrun sets with it: {fix}")
    rank, world, local = (os.environ[name] for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if not (rank.isdecimal() and world.isdecimal() and local.isdecimal() and int(rank) < int(world)):
        raise UsageError(f"RANK={rank[:20]!r}, WORLD_SIZE={world[:20]!r}, LOCAL_RANK={local[:20]!r} are not a "
                         f"rank of a launch (integers, 0 <= RANK < WORLD_SIZE): {fix}")
    return int(rank)


def prints_errors() -> bool:
    """Whether this process says why the command stopped: one process or rank 0, or one whose torchrun variables
    make no launch."""
    try:
        return not torchrun_rank()
    except UsageError:
        return True


def setup_distributed(device: str = "auto") -> Dist:
    """One process on `device`, or under torchrun the local rank's GPU (modulo the GPUs this process sees: one GPU
    per task under SLURM works) bound to the process group, a gloo group for long waits and the FSDP2 mesh."""
    launched = torchrun_rank() is not None
    chosen = choose_device(device)
    if not launched:
        return Dist(device=chosen)
    if chosen.type == "mps":
        raise TrainingError("--device mps: runs under torchrun need CUDA GPUs or CPU ranks; use --device cpu")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    device = torch.device("cpu")
    if chosen.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=COLLECTIVE_TIMEOUT,
                                device_id=device if device.type == "cuda" else None)
    world = dist.get_world_size()
    return Dist(dist.get_rank(), world, device, local_world, mesh_for(device.type, world, local_world),
                dist.new_group(backend="gloo", timeout=PREPARATION_TIMEOUT))


def mesh_for(device_type: str, world: int, local_world: int):
    """FSDP2's mesh: shard over all ranks on one node; over several nodes HSDP, sharded within a node
    (NVLink) and replicated across nodes, so only the gradient all-reduce crosses the slower network."""
    from torch.distributed.device_mesh import init_device_mesh
    nodes = world // local_world
    if nodes > 1 and world == nodes * local_world:
        return init_device_mesh(device_type, (nodes, local_world), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))


def print0(ctx: Dist, *args):
    if ctx.is_main:
        print(*args, flush=True)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # config.PRECISIONS
BF16_MIN_SPEEDUP = 1.5  # bf16 autocast only where its matmuls are clearly faster than fp32's


def matmul_speedup_bf16(n: int = 512, repeats: int = 5) -> float:
    """fp32 time / bf16 time of an n x n matmul on this CPU (below 1 where bf16 is emulated)."""
    def best(dtype):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        a @ b  # warm-up, not timed
        return min(timeit.repeat(lambda: a @ b, number=1, repeat=repeats))  # timeit's clock: time.perf_counter
    return best(torch.float32) / best(torch.bfloat16)


@cache
def cpu_bf16_speedup() -> float:
    """The probe's answer, cached per CPU, torch build and thread count: every run on a machine chooses alike."""
    key = f"{platform.machine()} {cpu_model()} torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()} " \
          f"threads {torch.get_num_threads()}"
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "normgrow" / "cpu-precision.json"
    try:  # read as strictly as it is written: a cache with NaN (or any damage) is probed again and rewritten
        cached = loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    cached = cached if isinstance(cached, dict) else {}
    if not (finite_number(cached.get(key)) and cached[key] > 0):
        cached[key] = matmul_speedup_bf16()
        with suppress(OSError):  # a read-only home: probe again next time
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, cached)
    return float(cached[key])


def cpu_model() -> str:
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown cpu"


def cpu_instructions() -> str:
    """The instructions torch's CPU kernels use here: torch's capability (AVX2, AVX512), then the bf16 matmul
    units oneDNN reaches where the CPU has them and ONEDNN_MAX_CPU_ISA allows: AVX512-BF16 (about 4x fp32's
    matmul rate), AMX (about 14x: the rate that makes bf16 the probe's choice)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return capability
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()  # oneDNN's ISA names: AVX512_CORE_BF16, ..._AMX
    allowed = lambda levels: limit in ("ALL", "DEFAULT") or any(level in limit for level in levels)
    extras = [name for name, has, levels in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported, ("BF16", "AMX", "AVX10")),
                                             ("AMX", torch.cpu._is_amx_tile_supported, ("AMX",)))
              if has() and allowed(levels)]
    return " + ".join([capability, *extras])


def precision_choice(precision: str, device: torch.device, pinned: tuple[str, str] | None = None
                     ) -> tuple[torch.dtype, str]:
    """(compute dtype, why). "auto" is `pinned` where a study fixed it, else bf16 on a CUDA GPU that supports it,
    and on a CPU only where a matmul probe measures bf16 >= BF16_MIN_SPEEDUP x fp32."""
    if precision != "auto":
        return DTYPES[precision], f"{precision} (set by the preset)"
    if pinned is not None:
        return DTYPES[pinned[0]], f"auto: {pinned[0]} ({pinned[1]})"
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


def fused_attention_problem(config: ModelConfig, length: int, device) -> str:
    """"" if causal grouped-query attention over `length` tokens runs forward and backward on a fused SDPA kernel
    on `device`, else why not (SDPA's silent fallback holds every head's T x T scores: 8 GiB a layer at 8,192)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    shape = lambda heads: (1, heads, length, config.head_dim)
    q = torch.randn(shape(config.num_attention_heads), device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(shape(config.num_key_value_heads), device=device, dtype=dtype, requires_grad=True)
            for _ in range(2))
    try:
        gqa = config.num_key_value_heads != config.num_attention_heads
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).sum().backward()
    except RuntimeError as e:
        return " ".join(str(e).split())[:300]
    return ""


def shard_fn(ctx: Dist, compute_dtype: torch.dtype, replicated: tuple[str, ...] = ()):
    """FSDP2 (torchtitan's recipe): one unit per decoder layer, then the root; None in one process. The layers'
    weights are gathered in the compute dtype, the root's (and the residual stream) stay fp32, as under one GPU's
    autocast. The root's submodules named in `replicated` stay whole on every rank."""
    if ctx.world == 1:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    layers = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    root = MixedPrecisionPolicy(reduce_dtype=torch.float32, cast_forward_inputs=False)

    def apply(net):
        for layer in net.layers:
            fully_shard(layer, mesh=ctx.mesh, mp_policy=layers)
        ignored = {p for name in replicated if getattr(net, name, None) is not None
                   for p in getattr(net, name).parameters()}
        fully_shard(net, mesh=ctx.mesh, mp_policy=root, ignored_params=ignored or None)
    return apply


def settle_fsdp_dtypes(net: torch.nn.Module):
    """Fix FSDP2's gradient dtypes now, while every layer of `net` requires grad (no-op without FSDP2). FSDP2
    decides each unit's reduce dtype at its lazy init from the parameters that require grad then
    (_fsdp_param_group.py:273-294, _init_mp_dtypes): a unit frozen then (grow's blocks not yet appended) would
    later reduce its bf16 gradients in bf16 and assign them to its fp32 parameters, which torch refuses
    (_fsdp_collectives.py:754). fp32 runs never noticed: there the reduce dtype is the parameters' own."""
    if hasattr(net, "_get_fsdp_state"):
        net._get_fsdp_state()._lazy_init()


# Building and filling modules whose parameters are sharded (DTensor) or not yet allocated (meta)

@contextmanager
def on_meta_device():
    """Build on the meta device, a real one even inside a FakeTensorMode (the full-size rehearsal)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily(), torch.device("meta"):
        yield


def built_on_meta(build: Callable[[], torch.nn.Module], shard_fn: Callable | None = None) -> torch.nn.Module:
    """`build()` on the meta device, then sharded by `shard_fn` if given, before any memory is allocated."""
    with on_meta_device():
        module = build()
        if shard_fn is not None:
            shard_fn(module)
    return module


def fill_parameter(param: torch.Tensor, full: torch.Tensor):
    """Copy a full-size tensor into a parameter, taking only this rank's slice if it is a DTensor."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor
        full = distribute_tensor(full.to(param.device, param.dtype), param.device_mesh, param.placements,
                                 src_data_rank=None)
    param.copy_(full)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from all ranks if it is a sharded DTensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# A training step on these devices: the compute precision, compiled layers, and FSDP2's gradients

def autocast(dtype: torch.dtype, ctx: Dist):
    """bf16 autocast, in one process and under FSDP2 alike: the residual stream stays fp32 in both."""
    return torch.autocast(ctx.device.type, dtype=torch.bfloat16) if dtype == torch.bfloat16 else nullcontext()


# The shapes one compiled decoder layer may be specialised to: a few widths (data.fixed_shape) and two row counts,
# in training and evaluation, with and without the boundary monitor, for the teacher's placement and the student's.
COMPILED_SHAPES = 64


def compile_layers(net: torch.nn.Module):
    """torch.compile each decoder layer for the fixed shapes of a compiled run's batches (data.fixed_shape)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILED_SHAPES)
    for layer in net.layers:
        layer.compile(dynamic=False)


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global L2 norm of at most `max_norm` (clip_grad_norm_'s rule); the norm before
    clipping, a float64 tensor the caller reads with the step's other numbers (one host sync a step). The norm
    is summed in float64 from each rank's own shard (under HSDP over the "shard" dimension only), so one process
    and FSDP2 ranks get norms that differ by float64 rounding only and the same float32 coefficient (a float32
    norm's rounding AdamW would turn into weight differences far above it, where it divides by sqrt(v) ~ eps)."""
    if not (grads := [p.grad for p in params if p.grad is not None]):
        return torch.zeros((), dtype=torch.float64)
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    squares = torch.zeros((), dtype=torch.float64, device=local[0].device)
    for grad in local:  # in parameter order, one at a time: the sum's rounding does not depend on the device
        squares = squares + grad.double().pow(2).sum()
    if isinstance(grads[0], DTensor):
        for dim, placement in enumerate(grads[0].placements):
            if placement.is_shard():
                dist.all_reduce(squares, group=grads[0].device_mesh.get_group(dim))
    norm = squares.sqrt()  # (torch's CPU float64 sqrt can differ from math.sqrt in the last bit: the logged norm)
    # The coefficient rounded to float32 (the same product on every rank) and at most 1 (a product with 1.0 is
    # exact); a tensor divided by a tensor: Python's number / tensor multiplies by a reciprocal, two roundings.
    coefficient = (torch.full_like(norm, max_norm) / (norm + 1e-6)).float().clamp(max=1.0)
    with torch.no_grad():
        torch._foreach_mul_(local, coefficient)
    return norm


def set_gradient_sync(net: torch.nn.Module, sync: bool, active_layers: int):
    """FSDP2: whether this backward reduce-scatters the gradients (the step's last micro-batch) or adds them up
    unsharded, set on the units that run forward only: the root and the first `active_layers` layers. With sync
    off, a unit that never ran (grow's blocks not yet appended) would raise AttributeError '_unsharded_param'
    under bf16 (_fsdp_param.py:807); with sync left on, FSDP2 passes over it (_fsdp_param_group.py:619)."""
    for unit in (net, *net.layers[:active_layers]):
        unit.set_requires_gradient_sync(sync, recurse=False)
