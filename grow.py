"""One training run: a protocol's phases, each with a fresh AdamW and a restarted warmup + cosine.

Runs are normally started by repro.py, which fills a RunConfig from a preset:

    python repro.py train --scale toy --norm post --protocol grow           # one CPU or GPU
    torchrun --nproc_per_node=8 repro.py train --scale full --norm post --protocol grow
    torchrun --nnodes=4 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 \\
        repro.py train --scale full --norm post --protocol grow             # several nodes

Protocols (paper Sec. 4 and Appendix B): `joint` (all K blocks, one phase), `grow` (phase p runs
blocks 0..p, all of them trained), `freeze` (grow, but phase p>0 trains only block p), `joint-long`
(all blocks, several phases with LR restarts, fresh data) and `teacher` (plain CE pretraining of a
Qwen3 model, the toy preset's own teacher).

A run directory holds config.json, provenance.json, metrics.jsonl (one line per step and per
evaluation, including each phase's start, before its first update), phase-<p>/ (kept phase-end
checkpoints, safetensors, read by the diagnostics),
latest/ (the rolling resume checkpoint: weights, optimizer and trainer state) and done.json.
A run killed at any moment resumes from its newest checkpoint to the same result.
"""
from __future__ import annotations

import base64
import errno
import json
import math
import os
import platform
import shutil
import subprocess
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import cache, partial
from pathlib import Path

import torch
import torch.distributed as dist

import data
import kd
import model

# DCP warns on every single-process save that it assumes one process; that is the intent.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


class TrainingError(RuntimeError):
    """A run that cannot go on (a non-finite loss, a run directory that belongs to another config)."""


# ----------------------------------------------------------------------------------------------
# Config and phase plan

PROTOCOLS = ("joint", "grow", "freeze", "joint-long", "teacher")


@dataclass
class RunConfig:
    """Every setting of one run. No defaults for hyperparameters: presets (repro.py) own the numbers."""
    name: str
    protocol: str                  # one of PROTOCOLS
    norm: str                      # "pre" | "post" (student placement; ignored by `teacher`)
    seed: int
    blocks: int                    # K
    layers_per_block: int          # L
    phase_steps: int               # optimizer steps per phase
    global_batch: int              # documents per optimizer step, all ranks together
    micro_batch: int               # documents per forward pass on one rank
    lr: float
    min_lr: float
    warmup_frac: float             # of each phase
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    grad_clip: float               # global L2 norm
    alpha: float
    gamma: float
    tau: float
    loss_chunk: int                # tokens per chunk of the chunked loss
    train_data: str                # data.Shard directories
    val_data: str
    replay_docs: int               # documents in the one-phase shard that grow replays
    eval_interval: int
    eval_batch: int                # validation documents per forward pass on one rank
    checkpoint_interval: int       # steps between rolling resume checkpoints
    snapshot_interval: int = 0     # steps between kept weight snapshots step-<n>/ (diagnostics); 0: none
    teacher: str = ""              # HF checkpoint directory (distillation runs)
    teacher_config: dict | None = None   # model.ModelConfig fields (the `teacher` protocol)
    joint_phases: int = 1          # `joint-long`: phases of phase_steps, LR restart at each
    freeze_trains_head: bool = False     # `freeze`: also keep training the LM head and boundary norm
    reset_data_each_phase: bool = False  # paper Appendix B.3 (main runs: False)
    precision: str = "auto"        # "fp32" | "bf16" | "auto" (bf16 where measured faster: precision_choice)
    activation_checkpointing: bool = False
    compile: bool = False
    start_from: str = ""           # a phase-<p> directory of another run whose prefix equals ours
    post_output_gain: str = "ones"  # post-norm: each block's last RMSNorm starts at "ones" (paper) or "teacher" (g_T)

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol {self.protocol!r} is unknown; choose one of {', '.join(PROTOCOLS)}")
        if self.precision not in ("auto", *PRECISIONS):
            raise ValueError(f"precision {self.precision!r} is unknown; choose auto, {', '.join(PRECISIONS)}")
        if self.post_output_gain not in model.OUTPUT_GAINS:
            raise ValueError(f"post_output_gain {self.post_output_gain!r} is unknown; choose one of "
                             f"{', '.join(model.OUTPUT_GAINS)}")
        self.betas = tuple(self.betas)

    @property
    def data_mode(self) -> str:
        # Grow-like runs replay one fixed shard; the long joint controls continue onto fresh data.
        return "fresh" if self.protocol == "joint-long" else "replay"


@dataclass(frozen=True)
class Phase:
    index: int
    active_blocks: int
    trainable_blocks: tuple[int, ...]
    trains_head: bool              # LM head and boundary norm
    first_step: int                # global step index of the phase's first step
    steps: int


def plan_phases(config: RunConfig) -> list[Phase]:
    K, S = config.blocks, config.phase_steps
    if config.protocol == "teacher":
        return [Phase(0, 0, (), True, 0, S)]
    if config.protocol == "joint":
        return [Phase(0, K, tuple(range(K)), True, 0, S)]
    if config.protocol == "joint-long":
        return [Phase(p, K, tuple(range(K)), True, p * S, S) for p in range(config.joint_phases)]
    if config.protocol == "grow":
        return [Phase(p, p + 1, tuple(range(p + 1)), True, p * S, S) for p in range(K)]
    # freeze: phase 0 is grow's phase 0; afterwards only the newly appended block learns.
    return [Phase(p, p + 1, (p,) if p else (0,), p == 0 or config.freeze_trains_head, p * S, S) for p in range(K)]


def learning_rate(config: RunConfig, step_in_phase: int) -> float:
    """Linear warmup over warmup_frac of the phase, then cosine from lr to min_lr at the phase end."""
    warmup = max(1, round(config.warmup_frac * config.phase_steps))
    if step_in_phase < warmup:
        return config.lr * (step_in_phase + 1) / warmup
    progress = (step_in_phase - warmup) / max(1, config.phase_steps - warmup)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * progress))


def trainable_parameters(net: torch.nn.Module, phase: Phase) -> list[torch.nn.Parameter]:
    """Set requires_grad for the phase and return exactly the parameters the optimizer gets."""
    if isinstance(net, model.Qwen3):  # teacher pretraining: everything learns
        return list(net.requires_grad_(True).parameters())
    net.requires_grad_(False)  # the embedding stays frozen in every phase
    for b in phase.trainable_blocks:
        net.block_layers(b).requires_grad_(True)
    net.norm.requires_grad_(phase.trains_head)
    net.lm_head.requires_grad_(phase.trains_head)
    return [p for p in net.parameters() if p.requires_grad]


def build_optimizer(config: RunConfig, params: list) -> torch.optim.AdamW:
    # foreach=False: the single-tensor path is bit-identical across resumes and ranks' shards.
    return torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay, foreach=False)


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


PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
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
            path.write_text(json.dumps(cached, indent=2) + "\n")
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
        return PRECISIONS[precision], f"{precision} (set by the preset)"
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


def precision_of(config: RunConfig, ctx: Dist) -> torch.dtype:
    return precision_choice(config.precision, ctx.device, ctx.world)[0]


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


# ----------------------------------------------------------------------------------------------
# Models

def build_models(config: RunConfig, ctx: Dist):
    """(trained model, teacher or None). The teacher keeps its embedding, final norm and head
    replicated (its layers are sharded), so its head weight can be handed to the chunked loss."""
    dtype = precision_of(config, ctx)
    if config.protocol == "teacher":
        with torch.device("meta"):
            net = model.Qwen3(model.ModelConfig(**config.teacher_config))
        shard = shard_fn(ctx, dtype, shard_root=True)
        if shard:
            shard(net)
        net.to_empty(device=ctx.device)
        net.init_weights(config.seed)
        teacher = None
    else:
        teacher_dtype = dtype if ctx.device.type == "cuda" else torch.float32
        teacher = model.load_qwen3(config.teacher, dtype=teacher_dtype, device=ctx.device,
                                   shard_fn=shard_fn(ctx, dtype, shard_root=False))
        net = model.Student.from_teacher(teacher, config.blocks, config.layers_per_block, config.norm,
                                         config.seed, shard_fn=shard_fn(ctx, dtype, shard_root=True),
                                         output_gain=config.post_output_gain)
    net.checkpoint_layers = config.activation_checkpointing
    if config.compile:
        for layer in net.layers:
            layer.compile()
    return net, teacher


def autocast(config: RunConfig, ctx: Dist):
    """bf16 autocast in one process; under FSDP2 the MixedPrecisionPolicy casts instead."""
    if precision_of(config, ctx) == torch.bfloat16 and ctx.world == 1:
        return torch.autocast(ctx.device.type, dtype=torch.bfloat16)
    return nullcontext()


def hidden_only(hidden, head_weight):
    return hidden


def loss_fn(config, batch, teacher, phase, denominator, net):
    """Run one micro-batch through the model with the chunked loss as its output function."""
    if teacher is None:
        loss, ce_term = net(batch.input_ids, output_fn=partial(
            kd.ce_loss, targets=batch.targets, mask=batch.mask, chunk_size=config.loss_chunk,
            denominator=denominator))
        return loss, torch.zeros(()), ce_term
    with torch.no_grad():
        teacher_hidden = teacher(batch.input_ids, output_fn=hidden_only)
    head = teacher.head_weight
    return net(batch.input_ids, active_blocks=phase.active_blocks, output_fn=partial(
        kd.kd_loss, teacher_hidden=teacher_hidden, teacher_head_weight=head, targets=batch.targets,
        mask=batch.mask, alpha=config.alpha, gamma=config.gamma, tau=config.tau,
        chunk_size=config.loss_chunk, denominator=denominator))


# ----------------------------------------------------------------------------------------------
# Evaluation: the whole fixed validation set, token-weighted, on every rank

@torch.no_grad()
def evaluate(config: RunConfig, net, teacher, val: data.Shard, active_blocks: int | None, ctx: Dist) -> dict:
    """CE, PPL, KD (soft-target CE) and KL over every validation document, token-weighted and summed
    over ranks. Without a teacher, CE and PPL of `net` alone (a teacher run, or `repro.py eval`)."""
    net.eval()
    sums = [0.0, 0.0, 0.0, 0.0]  # kl, soft_ce, ce, targets
    for batch in data.eval_batches(val, config.eval_batch, ctx.rank, ctx.world):
        batch = batch.to(ctx.device)
        with autocast(config, ctx):
            if teacher is None:
                s = net(batch.input_ids, output_fn=partial(kd.kd_sums, teacher_hidden=None, teacher_head_weight=None,
                                                           targets=batch.targets, mask=batch.mask,
                                                           chunk_size=config.loss_chunk))
            else:
                teacher_hidden = teacher(batch.input_ids, output_fn=hidden_only)
                s = net(batch.input_ids, active_blocks=active_blocks, output_fn=partial(
                    kd.kd_sums, teacher_hidden=teacher_hidden, teacher_head_weight=teacher.head_weight,
                    targets=batch.targets, mask=batch.mask, tau=config.tau, chunk_size=config.loss_chunk))
        for i, key in enumerate(("kl", "soft_ce", "ce", "n")):
            sums[i] += float(s.get(key, 0.0))
    kl, soft_ce, ce, n = ctx.sum(sums)
    net.train()
    n = max(n, 1.0)
    return {"ce": ce / n, "ppl": perplexity(ce / n), "kd": soft_ce / n, "kl": kl / n, "val_tokens": int(n)}


# ----------------------------------------------------------------------------------------------
# Checkpoints. phase-<p>/: kept, safetensors weights + trainer state. latest/: rolling, DCP
# (weights + optimizer, sharded under FSDP2) + trainer state. Both written atomically.

def trainer_state(step, phase, batcher, totals, elapsed) -> dict:
    rng = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    return {"step": step, "phase": phase, "data": batcher.state_dict(), "totals": totals,
            "elapsed": elapsed, "torch_rng": rng}


def gathered_state(net) -> dict:
    """Full (unsharded) CPU state dict on every rank; plain state_dict in one process."""
    if not any(hasattr(p, "device_mesh") for p in net.parameters()):
        return net.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


@contextmanager
def disk_full_is_one_line(folder: Path, run_dir: Path):
    """A write that runs out of disk says so, names the folder, and says what is still intact."""
    try:
        yield
    except Exception as e:  # OSError, or safetensors' own error wrapping one
        if getattr(e, "errno", None) != errno.ENOSPC and "No space left on device" not in str(e):
            raise
        intact = newest_checkpoint(run_dir)
        raise TrainingError(f"no space left on device while writing {folder}; "
                            + (f"the previous checkpoint {intact[0]} is intact" if intact else "no checkpoint was lost")
                            + ": free some space and rerun to resume") from None


def save_kept_checkpoint(run_dir: Path, name: str, net, state: dict, ctx: Dist):
    """A kept checkpoint (phase-<p>/ or step-<n>/): safetensors weights any tool can load, plus the
    trainer state. It holds no optimizer state: phases restart theirs, so a phase end needs none."""
    with disk_full_is_one_line(run_dir / name, run_dir):
        write_kept_checkpoint(run_dir, name, net, state, ctx)


def write_kept_checkpoint(run_dir: Path, name: str, net, state: dict, ctx: Dist):
    full = gathered_state(net)
    if ctx.is_main:
        tmp = run_dir / f"{name}.tmp"
        if isinstance(net, model.Qwen3):  # the teacher run's checkpoints are plain HF Qwen3 folders
            model.save_qwen3(net, tmp, full)
        else:
            net.save(tmp, full)
        (tmp / "trainer_state.json").write_text(json.dumps(state))
        model.replace_folder(tmp, run_dir / name)
    ctx.barrier()


def save_latest_checkpoint(run_dir: Path, net, optimizer, state: dict, ctx: Dist):
    with disk_full_is_one_line(run_dir / "latest", run_dir):
        write_latest_checkpoint(run_dir, net, optimizer, state, ctx)


def write_latest_checkpoint(run_dir: Path, net, optimizer, state: dict, ctx: Dist):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optim_state = get_state_dict(net, optimizer)
    tmp = run_dir / "latest.tmp"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    ctx.barrier()
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp), no_dist=ctx.world == 1)
    if ctx.is_main:
        (tmp / "trainer_state.json").write_text(json.dumps(state))
        model.replace_folder(tmp, run_dir / "latest")
    ctx.barrier()


def newest_checkpoint(run_dir: Path) -> tuple[Path, dict] | None:
    """The checkpoint with the highest step: latest/ or the last phase-<p>/."""
    found = []
    phases = [d for d in run_dir.glob("phase-*") if d.name.removeprefix("phase-").isdigit()]  # not .tmp/.old
    for ckpt in [run_dir / "latest", *phases]:
        state_file = ckpt / "trainer_state.json"
        if ckpt.is_dir() and state_file.is_file():
            found.append((read_json(state_file, "step")["step"], ckpt.name == "latest", ckpt))
    if not found:
        return None
    _, _, ckpt = max(found)  # on a tie prefer latest/: it also holds the optimizer state
    return ckpt, read_json(ckpt / "trainer_state.json", "step", "phase", "data", "totals", "elapsed", "torch_rng")


def load_weights(net, ckpt: Path):
    name_in_file = model.hf_name if isinstance(net, model.Qwen3) else (lambda name: name)
    dtype = next(net.parameters()).dtype
    model.load_tensors(net, ckpt, dtype, next(net.parameters()).device, name_in_file)


def load_latest_checkpoint(ckpt: Path, net, optimizer, ctx: Dist):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_state, optim_state = get_state_dict(net, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(ckpt), no_dist=ctx.world == 1)
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


# ----------------------------------------------------------------------------------------------
# Run directory: config, metrics log, provenance

def prepare_run_dir(config: RunConfig, run_dir: Path, force: bool, ctx: Dist) -> bool:
    """Create or check the run directory. Returns True if the run is already done. A folder holding
    a run of another config is an error, or with `force` discarded; one of the same config is
    resumed (or reused when done), with or without force."""
    config_file = run_dir / "config.json"
    wanted = json.loads(json.dumps(asdict(config)))
    if config_file.is_file():
        # A field added to RunConfig after the run was made reads as its default: the same run.
        defaults = json.loads(json.dumps({f.name: f.default for f in fields(RunConfig) if f.default is not MISSING}))
        try:
            stored = {**{k: v for k, v in defaults.items() if k in wanted}, **read_json(config_file)}
        except TrainingError:
            if not force:
                raise
            stored = {}  # a damaged config the kit wrote: --force redoes the run
        if stored == wanted:
            if (run_dir / "done.json").is_file():
                return True
        elif not force:
            changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
            raise TrainingError(f"{run_dir}: holds a run with another config (differs in {', '.join(changed)}); "
                                "pass --force to discard it and start over, or choose another output folder")
        elif ctx.is_main:
            shutil.rmtree(run_dir)
    ctx.barrier()
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_file.write_text(json.dumps(wanted, indent=2) + "\n")
        (run_dir / "provenance.json").write_text(json.dumps(provenance(config, ctx), indent=2) + "\n")
    ctx.barrier()
    return False


def git_commit() -> str:
    """The kit's commit, with "+changes" when the working tree differs from it ("" outside git)."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        return commit + ("+changes" if commit and git("status", "--porcelain", "--untracked-files=no") else "")
    except OSError:
        return ""


def read_json(path: Path, *keys: str) -> dict:
    """A JSON object the kit wrote (config, trainer state, done.json), with `keys` present; anything
    else is one line naming the file."""
    try:
        value = json.loads(Path(path).read_text())
    except OSError as e:
        raise TrainingError(f"{path}: cannot be read ({e.strerror})") from None
    except ValueError as e:
        raise TrainingError(f"{path}: not valid JSON ({e}); the file is damaged: move it away (or rerun with "
                            "--force for a run's config) and rerun") from None
    missing = [k for k in keys if not isinstance(value, dict) or k not in value]
    if missing:
        raise TrainingError(f"{path}: lacks {', '.join(missing)}; the file is damaged or not the kit's: move it "
                            "away and rerun")
    return value


def perplexity(ce: float) -> float:
    """exp(CE), inf (not an overflow) for a CE past exp's range."""
    return math.exp(ce) if ce < 700 else math.inf


def provenance(config: RunConfig, ctx: Dist) -> dict:
    commit = git_commit()
    device = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else ctx.device.type
    dtype, why = precision_choice(config.precision, ctx.device, ctx.world)
    return {"git_commit": commit, "torch": torch.__version__, "device": device, "world_size": ctx.world,
            "threads": torch.get_num_threads(), "precision": str(dtype).removeprefix("torch."), "precision_reason": why}


def read_metrics(run_dir: Path) -> list[dict]:
    """Parsed metrics.jsonl; a line cut short by a kill is dropped."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def truncate_metrics(run_dir: Path, upto_step: int, source: Path | None = None):
    """Keep the log up to a checkpoint's step (from `source`, a shared-prefix run, if given). The next
    phase's start evaluation at that step is dropped too: the resumed run logs it again."""
    rows = [r for r in read_metrics(source or run_dir)
            if r["step"] < upto_step or (r["step"] == upto_step and not r.get("phase_start"))]
    tmp = run_dir / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, run_dir / "metrics.jsonl")


def adopt_shared_prefix(config: RunConfig, run_dir: Path):
    """Start from another run's phase-end checkpoint whose phases equal our first ones: copy it
    and the log lines up to it, so this run's folder is complete on its own."""
    src = Path(config.start_from)
    state_file = src / "trainer_state.json"
    if not state_file.is_file():
        raise TrainingError(f"{src}: not a finished phase checkpoint (no trainer_state.json); run its run first")
    shutil.copytree(src, run_dir / src.name, dirs_exist_ok=True)
    truncate_metrics(run_dir, read_json(state_file, "step")["step"], source=src.parent)


# ----------------------------------------------------------------------------------------------
# The metrics log: metrics.jsonl, and TensorBoard or W&B when asked for (imported only then)

TRACKERS = ("", "tensorboard", "wandb")


class MetricsLog:
    """Appends rows (already reduced over ranks) to metrics.jsonl on rank 0 and feeds the same rows to a
    tracker: train/<key> per step, eval/<key> per evaluation, phase_start/<key> for a phase's start."""

    def __init__(self, run_dir: Path, config: RunConfig, ctx: Dist, tracker: str = ""):
        if tracker not in TRACKERS:
            raise TrainingError(f"--log {tracker}: unknown; choose tensorboard or wandb")
        self.file = open(run_dir / "metrics.jsonl", "a") if ctx.is_main else None
        self.send, self.finish = (open_tracker(tracker, run_dir, config) if ctx.is_main and tracker
                                  else (None, None))

    def write(self, row: dict):
        if self.file:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()
        if self.send:
            kind = "phase_start" if row.get("phase_start") else "eval" if row.get("eval") else "train"
            self.send({f"{kind}/{k}": v for k, v in row.items() if k not in ("step", "eval", "phase_start")
                       and isinstance(v, (int, float)) and not isinstance(v, bool)}, row["step"])

    def close(self):
        if self.file:
            self.file.close()
        if self.finish:
            self.finish()


def check_tracker(kind: str):
    """Fail before any work if the tracker's package is missing (one line with the install command)."""
    if kind:
        package = "tensorboard" if kind == "tensorboard" else "wandb"
        try:
            __import__(package)
        except ImportError:
            raise TrainingError(f"--log {kind}: the {package} package is not installed; pip install {package}") from None


def open_tracker(kind: str, run_dir: Path, config: RunConfig):
    """(send(values, step), finish()) for TensorBoard (run_dir/tensorboard/) or W&B (project normgrow,
    the run's name and config)."""
    check_tracker(kind)
    if kind == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

        def send(values, step):
            for key, value in values.items():
                writer.add_scalar(key, value, step)
            writer.flush()
        return send, writer.close
    import wandb
    run = wandb.init(project="normgrow", name=f"{run_dir.parent.name}/{run_dir.name}", config=asdict(config),
                     dir=str(run_dir), reinit=True)
    return (lambda values, step: run.log(values, step=step)), run.finish


# ----------------------------------------------------------------------------------------------
# The run

def optimizer_step(config, net, teacher, phase, batch, params, optimizer, lr, ctx: Dist) -> dict:
    """One optimizer step over the global batch, micro-batch by micro-batch. Returns the global
    (all-rank) loss, its KD and CE terms, and the gradient norm before clipping."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    sums = [0.0, 0.0, 0.0]
    for micro in batch.micro_batches:
        micro = micro.to(ctx.device)
        with autocast(config, ctx):
            loss, kd_term, ce_term = loss_fn(config, micro, teacher, phase, batch.global_targets, net)
        # Each rank's loss is already divided by the global target count; FSDP2 averages gradients
        # over ranks, so scale by the world size to get the gradient of the global mean.
        (loss * ctx.world).backward()
        sums = [s + float(v) for s, v in zip(sums, (loss.detach(), kd_term, ce_term))]
    grad_norm = float(model.full_tensor(torch.nn.utils.clip_grad_norm_(params, config.grad_clip, foreach=False)))
    loss_sum, kd_sum, ce_sum = ctx.sum(sums)
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
        return {"loss": loss_sum, "grad_norm": grad_norm, "finite": False}
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss_sum, "kd": kd_sum, "ce": ce_sum, "grad_norm": grad_norm, "finite": True}


def progress_bar(ctx: Dist):
    """A rich progress bar on an interactive rank-0 terminal; logs and other ranks get printed lines."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    if not (ctx.is_main and Console().is_terminal):
        return None
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}  {task.fields[tok_s]:,.0f} tok/s"), TimeRemainingColumn())


def train(config: RunConfig, run_dir, force: bool = False, ctx: Dist | None = None,
          stop_after_step: int | None = None, tracker: str = "") -> dict:
    """Run (or resume, or skip if done) one run; returns the final evaluation. `stop_after_step`
    ends early as if killed there (tests of resume); `tracker` also feeds TensorBoard or W&B."""
    ctx = ctx or setup_distributed()
    run_dir = Path(run_dir)
    if prepare_run_dir(config, run_dir, force, ctx):
        print0(ctx, f"{config.name}: done, reusing {run_dir}")
        return read_json(run_dir / "done.json", "ce", "ppl", "kd")

    # ---- models, data, and where to start ----
    torch.manual_seed(config.seed)
    phases = plan_phases(config)
    print0(ctx, f"{config.name}: {config.protocol}, {config.norm}-norm, seed {config.seed}, {len(phases)} phase(s) x "
                f"{config.phase_steps} steps, {ctx.world} rank(s) on {ctx.device.type}, precision "
                f"{precision_choice(config.precision, ctx.device, ctx.world)[1]}; resolved config in {run_dir / 'config.json'}")
    net, teacher = build_models(config, ctx)
    # Sizes are checked on open; the sha256 of the whole shard (tens of GB at full scale) is checked
    # once by data.prepare, not again by every run on every rank.
    train_shard, val_shard = data.Shard(config.train_data, verify=False), data.Shard(config.val_data, verify=False)
    batcher = data.Batcher(train_shard, config.global_batch, config.seed, mode=config.data_mode,
                           replay_docs=config.replay_docs, rank=ctx.rank, world_size=ctx.world,
                           micro_batch=config.micro_batch)
    adopting = bool(config.start_from) and newest_checkpoint(run_dir) is None
    if ctx.is_main and adopting:
        adopt_shared_prefix(config, run_dir)
    ctx.barrier()
    resume = newest_checkpoint(run_dir)
    step, totals, elapsed = 0, {"total_tokens": 0, "active_layer_tokens": 0}, 0.0
    if resume:
        ckpt, state = resume
        step, totals, elapsed = state["step"], state["totals"], state["elapsed"]
        batcher.load_state_dict(state["data"])
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch_rng"])), dtype=torch.uint8))
        if ckpt.name != "latest":
            load_weights(net, ckpt)
        if adopting:
            print0(ctx, f"{config.name}: adopting {config.start_from} (its first phases are this run's), "
                        f"continuing at step {step}")
        else:
            print0(ctx, f"{config.name}: resuming at step {step} from {ckpt}")
    if ctx.is_main:  # from step 0 too: a run killed before its first checkpoint left lines behind
        truncate_metrics(run_dir, step)
    log = MetricsLog(run_dir, config, ctx, tracker)
    progress = progress_bar(ctx)
    layers_per_block = config.layers_per_block if teacher is not None else 0

    final = None
    for phase in phases:
        last_step = phase.first_step + phase.steps
        if step >= last_step:
            continue
        # ---- a new phase: a new optimizer over exactly the trainable parameters ----
        params = trainable_parameters(net, phase)
        optimizer = build_optimizer(config, params)
        if resume and resume[0].name == "latest" and step > phase.first_step:
            load_latest_checkpoint(resume[0], net, optimizer, ctx)
        if step == phase.first_step and config.reset_data_each_phase:
            batcher.reset()
        active_layers = phase.active_blocks * layers_per_block or len(net.layers)
        print0(ctx, f"{config.name}: phase {phase.index}: active blocks {phase.active_blocks}, trainable blocks "
                    f"{list(phase.trainable_blocks)}, {sum(p.numel() for p in params):,} trainable parameters, "
                    f"steps {phase.first_step + 1}..{last_step}, "
                    f"{config.global_batch} documents/step in {config.global_batch // ctx.world // config.micro_batch} "
                    f"micro-batches x {ctx.world} ranks")
        if progress:
            progress.start()
            task = progress.add_task(f"{config.name} phase {phase.index}", total=phase.steps,
                                     completed=step - phase.first_step, loss=float("nan"), tok_s=0.0)
        started = time.time() - elapsed
        if step == phase.first_step:  # before the phase's first update: the starting weights' scores
            start = evaluate(config, net, teacher, val_shard, phase.active_blocks, ctx)
            log.write({"step": step, "phase": phase.index, "eval": True, "phase_start": True, **start})
            print0(ctx, f"{config.name}: phase {phase.index} starts at val CE {start['ce']:.4f}, val KD {start['kd']:.4f}")
        while step < last_step:
            # ---- train ----
            lr = learning_rate(config, step - phase.first_step)
            batch = next(batcher)
            result = optimizer_step(config, net, teacher, phase, batch, params, optimizer, lr, ctx)
            if not result["finite"]:
                raise TrainingError(f"{config.name}: non-finite loss ({result['loss']}) or gradient norm "
                                    f"({result['grad_norm']}) at step {step + 1}; the last good checkpoint in "
                                    f"{run_dir} is kept")
            step += 1
            # ---- log ----
            totals["total_tokens"] += batch.global_tokens
            totals["active_layer_tokens"] += batch.global_tokens * active_layers
            elapsed = time.time() - started
            row = {"step": step, "phase": phase.index, "loss": result["loss"], "kd": result["kd"], "ce": result["ce"],
                   "lr": lr, "grad_norm": result["grad_norm"], "tokens": batch.global_tokens, **totals, "time": elapsed}
            log.write(row)
            if progress:
                progress.update(task, advance=1, loss=result["loss"], tok_s=totals["total_tokens"] / max(elapsed, 1e-9))
            # ---- evaluate and checkpoint ----
            phase_end = step == last_step
            if phase_end or step % config.eval_interval == 0:
                final = evaluate(config, net, teacher, val_shard, phase.active_blocks, ctx)
                log.write({"step": step, "phase": phase.index, "eval": True, **final})
                print0(ctx, f"{config.name}: step {step}: loss {result['loss']:.4f}, val CE {final['ce']:.4f}, "
                            f"val KD {final['kd']:.4f}, {totals['total_tokens'] / max(elapsed, 1e-9):,.0f} tok/s")
            state = trainer_state(step, phase.index, batcher, totals, elapsed)
            if phase_end:
                save_kept_checkpoint(run_dir, f"phase-{phase.index}", net, state, ctx)
            elif config.snapshot_interval and step % config.snapshot_interval == 0:
                save_kept_checkpoint(run_dir, f"step-{step}", net, state, ctx)
            if not phase_end and step % config.checkpoint_interval == 0:
                save_latest_checkpoint(run_dir, net, optimizer, state, ctx)
            if stop_after_step is not None and step >= stop_after_step:
                log.close()
                return {}
        if progress:
            progress.stop()
        resume = None

    # ---- done: the scheduled endpoint's evaluation (killed after the last save: evaluate it) ----
    if final is None:
        final = evaluate(config, net, teacher, val_shard, phases[-1].active_blocks, ctx)
    if ctx.is_main:
        (run_dir / "done.json").write_text(json.dumps({**final, "step": step}, indent=2) + "\n")
        shutil.rmtree(run_dir / "latest", ignore_errors=True)
    log.close()
    ctx.barrier()
    return read_json(run_dir / "done.json", "ce", "ppl", "kd")


def main(argv=None):
    """`python grow.py RUN_DIR/config.json` (re)starts or resumes the run stored in that folder."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("config", type=Path, help="a run's config.json")
    parser.add_argument("--run-dir", type=Path, help="default: the folder holding the config")
    parser.add_argument("--stop-after-step", type=int, help="stop there, as if killed (resume tests)")
    args = parser.parse_args(argv)
    config = RunConfig(**json.loads(args.config.read_text()))
    train(config, args.run_dir or args.config.parent, stop_after_step=args.stop_after_step)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
