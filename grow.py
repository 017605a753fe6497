"""Training: a run's protocol, its phases (each with a fresh AdamW and a restarted warmup + cosine),
and several runs trained together in lockstep on one teacher pass per batch.

Runs are normally started by repro.py, which fills a RunConfig from a preset:

    python repro.py train --scale toy --norm post --protocol grow           # one CPU or GPU
    torchrun --nproc_per_node=8 repro.py train --scale full --norm post --protocol grow
    torchrun --nnodes=4 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 \\
        repro.py train --scale full --norm post --protocol grow             # several nodes

Protocols (paper Sec. 4 and Appendix B): `joint` (all K blocks, one phase), `grow` (phase p runs
blocks 0..p, all of them trained), `freeze` (grow, but phase p>0 trains only block p), `joint-long`
(all blocks, several phases with LR restarts, fresh data) and `teacher` (plain CE pretraining of a
Qwen3 model, the toy preset's own teacher).

`train` runs one run; `train_together` several, each exactly as if alone (bit-identical in one
process): the suite's runs of one seed read the same batch at the same step, so the frozen teacher
runs once per batch for all of them. What a run directory holds is rundir.py's. A run killed at
any moment resumes from its newest checkpoint to the same result.
"""
from __future__ import annotations

import base64
import math
import shutil
import time
from contextlib import ExitStack, contextmanager, nullcontext
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import data
import kd
import model
import transitions
from config import Phase, RunConfig, learning_rate, plan_phases
from plumbing.checkpoint import loads, write_json
from plumbing.devices import Dist, precision_choice, print0, settle_fsdp_dtypes, setup_distributed, shard_fn
from plumbing.errors import TrainingError
from plumbing.locks import held
from rundir import (
    RESULT_KEYS,
    MetricsLog,
    adopt_shared_prefix,
    final_eval,
    finished,
    git_commit,
    kill_point,
    load_latest_checkpoint,
    load_weights,
    newest_checkpoint,
    prepare_run_dir,
    save_kept_checkpoint,
    save_latest_checkpoint,
    trainer_state,
    truncate_metrics,
)

# ----------------------------------------------------------------------------------------------
# Phases: what trains, with which optimizer

def trainable_parameters(net: torch.nn.Module, phase: Phase, train_embedding: bool = False) -> list[torch.nn.Parameter]:
    """Set requires_grad for the phase and return exactly the parameters the optimizer gets. The
    embedding is frozen (the paper), except in growth from scratch, where it learns with the head."""
    if isinstance(net, model.Qwen3):  # teacher pretraining: everything learns
        return list(net.requires_grad_(True).parameters())
    net.requires_grad_(False)
    for b in phase.trainable_blocks:
        for module in net.block_modules(b):
            module.requires_grad_(True)
    for module in (*net.boundary_modules(), net.lm_head):
        module.requires_grad_(phase.trains_head)
    net.embed_tokens.requires_grad_(train_embedding and phase.trains_head)
    return [p for p in net.parameters() if p.requires_grad]


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global L2 norm of at most `max_norm` (torch's clip_grad_norm_ rule,
    coefficient max_norm / (norm + 1e-6)); returns the norm before clipping, a float64 tensor on the
    gradients' device: nothing here waits for the device (the caller reads the norm with the step's
    other numbers, one host sync a step).

    The norm is summed in float64 from each rank's own shard, so one process and FSDP2 ranks, whose
    sums run in different orders, get norms that differ by float64 rounding only, and the float32
    coefficient they multiply by is the same (unless the two norms straddle a float32 rounding
    boundary: about one step in 10^8). A float32 norm would differ by float32 rounding, and AdamW
    turns that into weight differences far above it, where it divides by sqrt(v) ~ eps. Under FSDP2
    the squares are summed over the mesh dimensions the gradients are sharded on: all ranks at 1 x G;
    under HSDP the "shard" dimension only (the replicas hold equal shards after the all-reduce)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
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
    # The coefficient rounded to float32 (an exact float32 value: the same product on every rank), and
    # at most 1: a product with 1.0 is exact, so gradients within the norm keep their values.
    # (A tensor divided by a tensor: Python's number / tensor multiplies by a reciprocal, two roundings.)
    coefficient = (torch.full_like(norm, max_norm) / (norm + 1e-6)).float().clamp(max=1.0)
    with torch.no_grad():
        torch._foreach_mul_(local, coefficient)
    return norm


def set_gradient_sync(net: torch.nn.Module, sync: bool, active_layers: int):
    """FSDP2: whether this backward reduce-scatters the gradients (the step's last micro-batch) or adds
    them up unsharded, set on the units that run forward only: the root and the first `active_layers`
    layers. With sync off FSDP2's post-backward converts every unit's gradient to the reduce dtype, and
    a unit that never ran (grow's blocks not yet appended) was never gathered: under bf16 parameters
    with fp32 reduction it raises AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:807, to_accumulated_grad_if_needed; in fp32
    there is no conversion, so it returns first). With sync left on, FSDP2 passes over a unit that was
    never gathered (_fsdp_param_group.py:619)."""
    for unit in (net, *net.layers[:active_layers]):
        unit.set_requires_gradient_sync(sync, recurse=False)


def build_optimizer(config: RunConfig, params: list) -> torch.optim.AdamW:
    # foreach=False: the single-tensor path is bit-identical across resumes and ranks' shards.
    return torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay, foreach=False)


# ----------------------------------------------------------------------------------------------
# Models: the frozen teacher (shared by every run that distils from it) and the model a run trains

TEACHER_CACHE_BYTES = 2**30  # validation hidden states kept per teacher (one process only)
# The teacher's modules kept whole on every rank under FSDP2: the chunked loss applies its head to the
# shared hidden states inside each student's forward, outside the teacher's.
TEACHER_REPLICATED = ("embed_tokens", "norm", "lm_head")


class Teacher:
    """The frozen teacher's final hidden states (the chunked loss applies its head). `forwards` counts
    the passes it actually ran. Validation batches are kept after their first pass, up to
    `cache_bytes`: every evaluation of every run reads the same ones. Under FSDP2 nothing is kept, so
    every rank runs the same sequence of sharded forwards."""

    def __init__(self, net: model.Qwen3, cache_bytes: int = 0):
        self.net, self.cache_bytes, self.forwards = net, cache_bytes, 0
        self.kept: dict = {}

    @property
    def head_weight(self) -> torch.Tensor:
        return self.net.head_weight

    @torch.no_grad()
    def hidden(self, input_ids: torch.Tensor, key=None) -> torch.Tensor:
        if key is not None and key in self.kept:
            return self.kept[key]
        self.forwards += 1
        hidden = self.net(input_ids, output_fn=hidden_only)
        if key is not None and sum(h.nbytes for h in self.kept.values()) + hidden.nbytes <= self.cache_bytes:
            self.kept[key] = hidden
        return hidden


def load_teacher(config: RunConfig, ctx: Dist, dtype: torch.dtype) -> Teacher:
    """The teacher checkpoint, its layers sharded under FSDP2 (embedding, final norm and head
    replicated, so its head weight can be handed to the chunked loss); held in the compute `dtype` on a
    GPU, fp32 on a CPU."""
    net = model.load_qwen3(config.teacher, dtype=dtype if ctx.device.type == "cuda" else torch.float32,
                           device=ctx.device, shard_fn=shard_fn(ctx, dtype, replicated=TEACHER_REPLICATED))
    if config.compile:
        compile_layers(net)
    return Teacher(net, TEACHER_CACHE_BYTES if ctx.world == 1 else 0)


def build_model(config: RunConfig, teacher: Teacher | None, ctx: Dist, dtype: torch.dtype) -> torch.nn.Module:
    """The model a run trains, fp32 master weights computing in `dtype`: a student built from the teacher
    (or from the seed alone, growth from scratch), or (the `teacher` protocol) a Qwen3 from the seed."""
    if config.protocol == "teacher":
        with torch.device("meta"):
            net = model.Qwen3(model.ModelConfig(**config.teacher_config))
        shard = shard_fn(ctx, dtype)
        if shard:
            shard(net)
        net.to_empty(device=ctx.device)
        net.init_weights(config.seed)
    elif config.scratch_model is not None:
        net = model.Student.from_scratch(model.ModelConfig(**config.scratch_model), config.blocks,
                                         config.layers_per_block, config.student_norm, config.seed,
                                         shard_fn=shard_fn(ctx, dtype), device=ctx.device,
                                         boundary=config.boundary, boundary_scale=config.boundary_scale,
                                         features=config.student_features)
    else:
        net = model.Student.from_teacher(teacher.net, config.blocks, config.layers_per_block, config.student_norm,
                                         config.seed, shard_fn=shard_fn(ctx, dtype),
                                         output_gain=config.post_output_gain, boundary=config.boundary,
                                         boundary_scale=config.boundary_scale, features=config.student_features)
    net.checkpoint_layers = config.activation_checkpointing
    settle_fsdp_dtypes(net)
    if config.compile:
        compile_layers(net)
    return net


def compile_layers(net: torch.nn.Module):
    """torch.compile each decoder layer with a symbolic batch and sequence length: one compile serves
    every padded length of a run (the layers of a model share it)."""
    for layer in net.layers:
        layer.compile(dynamic=True)


def autocast(dtype: torch.dtype, ctx: Dist):
    """bf16 autocast, in one process and under FSDP2 alike: the residual stream stays fp32 in both (under
    FSDP2 the layers' weights are gathered in bf16 and the root's stay fp32: devices.shard_fn)."""
    if dtype == torch.bfloat16:
        return torch.autocast(ctx.device.type, dtype=torch.bfloat16)
    return nullcontext()


def hidden_only(hidden, head_weight):
    return hidden


def loss_fn(config, batch, teacher_hidden, teacher_head_weight, phase, denominator, net):
    """One micro-batch through the model with the chunked loss as its output function: KD against the
    teacher's hidden states, or plain CE where there are none (teacher pretraining, growth from scratch)."""
    if teacher_hidden is None:
        blocks = {"active_blocks": phase.active_blocks} if isinstance(net, model.Student) else {}
        loss, ce_term = net(batch.input_ids, **blocks, output_fn=partial(
            kd.ce_loss, targets=batch.targets, mask=batch.mask, chunk_size=config.loss_chunk,
            denominator=denominator))
        return loss, loss.new_zeros(()), ce_term
    return net(batch.input_ids, active_blocks=phase.active_blocks, output_fn=partial(
        kd.kd_loss, teacher_hidden=teacher_hidden, teacher_head_weight=teacher_head_weight, targets=batch.targets,
        mask=batch.mask, alpha=config.alpha, gamma=config.gamma, tau=config.tau,
        chunk_size=config.loss_chunk, denominator=denominator))


# ----------------------------------------------------------------------------------------------
# Evaluation: the whole fixed validation set, token-weighted, on every rank

@torch.no_grad()
def evaluate(config: RunConfig, net, teacher: Teacher | None, val: data.Shard, active_blocks: int | None,
             ctx: Dist, dtype: torch.dtype) -> dict:
    """CE, PPL, KD (soft-target CE) and KL over every validation document, token-weighted and summed
    over ranks. Without a teacher, CE and PPL of `net` alone (a teacher run, or `repro.py eval`)."""
    net.eval()
    sums = [0.0, 0.0, 0.0, 0.0]  # kl, soft_ce, ce, targets
    for i, batch in enumerate(data.eval_batches(val, config.eval_batch, ctx.rank, ctx.world)):
        batch = batch.to(ctx.device)
        with autocast(dtype, ctx):
            if teacher is None:
                blocks = {"active_blocks": active_blocks} if isinstance(net, model.Student) else {}
                s = net(batch.input_ids, **blocks, output_fn=partial(
                    kd.kd_sums, teacher_hidden=None, teacher_head_weight=None, targets=batch.targets,
                    mask=batch.mask, chunk_size=config.loss_chunk))
            else:
                teacher_hidden = teacher.hidden(batch.input_ids, key=(str(val.path), config.eval_batch, i))
                s = net(batch.input_ids, active_blocks=active_blocks, output_fn=partial(
                    kd.kd_sums, teacher_hidden=teacher_hidden, teacher_head_weight=teacher.head_weight,
                    targets=batch.targets, mask=batch.mask, tau=config.tau, chunk_size=config.loss_chunk))
        for k, key in enumerate(("kl", "soft_ce", "ce", "n")):
            sums[k] += float(s.get(key, 0.0))
    kl, soft_ce, ce, n = ctx.sum(sums)
    if hasattr(net, "reshard"):  # FSDP2 keeps a root gathered after its forward: free it until the next step
        net.reshard()
    net.train()
    n = max(n, 1.0)
    return {"ce": ce / n, "ppl": perplexity(ce / n), "kd": soft_ce / n, "kl": kl / n, "val_tokens": int(n)}


def perplexity(ce: float) -> float:
    """exp(CE), inf (not an overflow) for a CE past exp's range."""
    return math.exp(ce) if ce < 700 else math.inf


def provenance(ctx: Dist, dtype: torch.dtype, why: str) -> dict:
    commit = git_commit()
    device = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else ctx.device.type
    return {"git_commit": commit, "torch": torch.__version__, "device": device, "world_size": ctx.world,
            "threads": torch.get_num_threads(), "precision": str(dtype).removeprefix("torch."), "precision_reason": why}


# ----------------------------------------------------------------------------------------------
# A run while it trains: its model, data, optimizer, log and checkpoints. The driver below calls,
# for each of its steps, begin_step, accumulate (once per micro-batch) and end_step.

class Run:
    def __init__(self, config: RunConfig, run_dir, ctx: Dist, stop_after_step: int | None = None,
                 tracker: str = ""):
        # `written` goes to config.json as given (portable paths); the run itself uses absolute ones.
        self.written, self.config = config, config.resolved(run_dir)
        self.run_dir, self.ctx = Path(run_dir), ctx
        self.stop_after_step, self.tracker = stop_after_step, tracker
        self.phases = plan_phases(config)
        # The compute precision, decided once (for "auto", by measuring the machine: devices.py).
        self.dtype, self.precision = precision_choice(config.precision, ctx.device)
        self.state = "new"   # new -> training -> done | stopped
        self.result: dict = {}

    @property
    def last_step(self) -> int:
        return self.phases[-1].first_step + self.phases[-1].steps

    def prepare(self, force: bool):
        """Create or check the folder; a run already done is not trained again."""
        if prepare_run_dir(self.written, self.run_dir, force, self.ctx, provenance(self.ctx, self.dtype, self.precision)):
            print0(self.ctx, f"{self.config.name}: done, reusing {self.run_dir}")
            self.state, self.result = "done", final_eval(self.run_dir)

    def can_open(self) -> bool:
        """False while the shared prefix it starts from is not written yet (grow's phase 0 for freeze)."""
        return (not self.config.start_from or newest_checkpoint(self.run_dir) is not None
                or (Path(self.config.start_from) / "trainer_state.json").is_file())

    def open(self, teacher: Teacher | None, progress):
        """Build the model and data, then continue from the newest checkpoint (or the shared prefix)."""
        config, ctx, run_dir = self.config, self.ctx, self.run_dir
        torch.manual_seed(config.seed)
        print0(ctx, f"{config.name}: {config.protocol}, {config.norm}-norm, seed {config.seed}, {len(self.phases)} "
                    f"phase(s) x {config.phase_steps} steps, {ctx.world} rank(s) on {ctx.device.type}, precision "
                    f"{self.precision}; resolved config in "
                    f"{run_dir / 'config.json'}")
        self.teacher = teacher if config.distils else None
        self.net = build_model(config, self.teacher, ctx, self.dtype)
        self.monitor_row, self.warned, self.transition_row = None, set(), None
        # Sizes are checked on open; the sha256 of the whole shard (tens of GB at full scale) is checked
        # once by data.prepare, not again by every run on every rank.
        train_shard = data.Shard(config.train_data, verify=False)
        self.val = data.Shard(config.val_data, verify=False)
        self.batcher = data.Batcher(train_shard, config.global_batch, config.seed, mode=config.data_mode,
                                    replay_docs=config.replay_docs, rank=ctx.rank, world_size=ctx.world,
                                    micro_batch=config.micro_batch, balance=config.balance_lengths)
        adopting = bool(config.start_from) and newest_checkpoint(run_dir) is None
        if ctx.is_main and adopting:
            adopt_shared_prefix(config, run_dir)
        ctx.barrier()
        self.resume = newest_checkpoint(run_dir, verify=True, warn=lambda line: print0(ctx, line), ctx=ctx)
        step = self.resume[1]["step"] if self.resume else 0
        if not ctx.agree_on(step):  # every rank must resume from the same step, or the run would fork
            raise TrainingError(f"{run_dir}: the ranks found different resume points (rank {ctx.rank}: step {step}); "
                                "the runs folder must be one filesystem that every node shares (or copy it to each)")
        self.step, self.totals, elapsed = 0, {"total_tokens": 0, "active_layer_tokens": 0}, 0.0
        self.outcome = {"best_ce": None, "diverged": None}
        if self.resume:
            ckpt, state = self.resume
            self.step, self.totals, elapsed = state["step"], state["totals"], state["elapsed"]
            self.outcome = {**self.outcome, **state.get("outcome", {})}
            self.batcher.load_state_dict(state["data"])
            for p, keep in self.outcome.get("transitions", {}).items():  # decisions the weights do not hold
                transitions.apply_kept(self.net, int(p), keep)
            torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch_rng"])), dtype=torch.uint8))
            if ckpt.name != "latest":
                load_weights(self.net, ckpt)
            if ckpt.name.startswith("step-"):
                print0(ctx, f"{config.name}: warning: {ckpt} holds weights but no AdamW state; its moments restart at "
                            f"step {self.step}, so this run will not be bit-identical to an uninterrupted one")
            print0(ctx, f"{config.name}: adopting {config.start_from} (its first phases are this run's), continuing at "
                        f"step {self.step}" if adopting else f"{config.name}: resuming at step {self.step} from {ckpt}")
        if ctx.is_main:  # from step 0 too: a run killed before its first checkpoint left lines behind
            truncate_metrics(run_dir, self.step)
        self.rng = torch.get_rng_state()
        self.log = MetricsLog(run_dir, config, ctx, self.tracker)
        self.started = time.time() - elapsed
        self.phase, self.final = None, None
        self.progress, self.task = progress, None
        if progress:
            self.task = progress.add_task(config.name, total=self.last_step, completed=self.step, loss=float("nan"),
                                          tok_s=0.0)
        self.state = "training"
        kill_point("opened", config.name, self.step)
        if self.step >= self.last_step:  # killed after its last checkpoint, before done.json
            if config.boundary == "mirror-fwd":
                self.attach_profile(self.phases[-1])  # its evaluation runs the mirrored forward
            self.finish()

    @contextmanager
    def own_rng(self):
        """The global torch RNG holds this run's state while it works, as if it ran alone."""
        torch.set_rng_state(self.rng)
        try:
            yield
        finally:
            self.rng = torch.get_rng_state()

    def attach_profile(self, phase: Phase):
        """mirror-fwd: the reference pre-norm run's phase-<p>/ (the same phase) gives, per batch, each
        token's RMS at the boundaries this phase's appended blocks read."""
        if phase.active_blocks < 2:
            return
        path = Path(self.config.boundary_source) / f"phase-{phase.index}"
        if not (path / "trainer_state.json").is_file():
            raise TrainingError(f"{path}: missing; a mirror-fwd run copies the boundary profile of "
                                f"{self.config.boundary_source}, so finish that run first")
        # The reference only runs forward: on a GPU it is held in the compute precision, as the teacher is.
        dtype = self.dtype if self.ctx.device.type == "cuda" else torch.float32
        self.net.profile_source = BoundaryProfile(model.Student.load(path, dtype, self.ctx.device).eval())

    def monitor_due(self) -> bool:
        """The step about to be taken writes a boundary-monitor row."""
        interval = self.config.monitor_interval
        return bool(interval) and (self.step + 1) % interval == 0 and isinstance(self.net, model.Student)

    def warn_boundaries(self, step: int, rows: list[dict]):
        """One line the first time a boundary passes a threshold (per boundary and statistic)."""
        for row in rows[1:]:
            for key, limit in (("mean", self.config.monitor_rms_warn), ("kurtosis", self.config.monitor_kurtosis_warn)):
                if row[key] is not None and row[key] > limit and (row["boundary"], key) not in self.warned:
                    self.warned.add((row["boundary"], key))
                    name = "mean per-token RMS" if key == "mean" else "kurtosis of per-token RMS"
                    print0(self.ctx, f"{self.config.name}: warning: step {step}: {row['label']}: {name} {row[key]:.4g} "
                                     f"passed the monitor's threshold {limit:g}")

    def keeps_optimizer(self) -> bool:
        """A joint-long run with restart_optimizer off carries AdamW's moments across LR restarts."""
        return self.config.protocol == "joint-long" and not self.config.restart_optimizer

    def begin_phase(self, phase: Phase):
        """A new optimizer over exactly the trainable parameters (unless the run keeps its own across
        phases), and the phase's start evaluation."""
        config, ctx = self.config, self.ctx
        continuing = self.phase is not None and self.keeps_optimizer()
        self.phase = phase
        self.params = trainable_parameters(self.net, phase, train_embedding=config.scratch_model is not None)
        if not continuing:
            self.optimizer = build_optimizer(config, self.params)
        at_start = self.step == phase.first_step and not self.keeps_optimizer()
        if self.resume and self.resume[0].name == "latest" and not at_start:
            load_latest_checkpoint(self.resume[0], self.net, self.optimizer, ctx)
        self.resume = None
        if self.step == phase.first_step and config.reset_data_each_phase:
            self.batcher.reset()
        if config.boundary == "mirror-fwd":
            self.attach_profile(phase)
        student = isinstance(self.net, model.Student)
        if student and phase.index and self.step == phase.first_step and transitions.acts(config):
            self.transition(phase)
        self.active_layers = phase.active_blocks * config.layers_per_block if student else len(self.net.layers)
        print0(ctx, f"{config.name}: phase {phase.index}: active blocks {phase.active_blocks}, trainable blocks "
                    f"{list(phase.trainable_blocks)}, {sum(p.numel() for p in self.params):,} trainable parameters, "
                    f"steps {phase.first_step + 1}..{phase.first_step + phase.steps}, {config.global_batch} "
                    f"documents/step in {config.global_batch // ctx.world // config.micro_batch} micro-batches x "
                    f"{ctx.world} ranks")
        if self.progress:
            self.progress.update(self.task, description=f"{config.name} phase {phase.index}")
        if self.step == phase.first_step:  # before the phase's first update: the starting weights' scores
            start = evaluate(config, self.net, self.teacher, self.val, phase.active_blocks, ctx, self.dtype)
            self.log.write({"step": self.step, "phase": phase.index, "eval": True, "phase_start": True, **start})
            print0(ctx, f"{config.name}: phase {phase.index} starts at val CE {start['ce']:.4f}, val KD {start['kd']:.4f}")

    def transition(self, phase: Phase):
        """transitions.at_transition on this step's batch (read ahead, the batcher put back), logged; then
        the optimizer is built again over what now trains (nothing has stepped yet)."""
        state = self.batcher.state_dict()
        batches = [micro.to(self.ctx.device) for micro in next(self.batcher).micro_batches]
        self.batcher.load_state_dict(state)
        with autocast(self.dtype, self.ctx):
            event = transitions.at_transition(self.net, self.config, phase, batches, self.ctx.sum)
        self.outcome.setdefault("transitions", {})[str(phase.index)] = event["keep"]
        # logged with the step's own row, as a monitor row is: a resume before that step reads it again
        self.transition_row = {"phase": phase.index, **event}
        print0(self.ctx, f"{self.config.name}: transition to block {phase.index}: {event['fired'] or 'nothing'} fired; "
                         f"{event['keep'] or 'no structural change'}")
        self.params = trainable_parameters(self.net, phase, train_embedding=self.config.scratch_model is not None)
        self.optimizer = build_optimizer(self.config, self.params)

    def begin_step(self) -> data.StepBatch:
        """Enter the step's phase if it is new; the step's batch (the same on every run that shares it)."""
        with self.own_rng():
            phase = next(p for p in self.phases if self.step < p.first_step + p.steps)
            if phase is not self.phase:
                self.begin_phase(phase)
            self.lr = learning_rate(self.config, self.step - phase.first_step, phase.index)
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr
            self.batch = next(self.batcher)
            # loss, KD and CE summed over the step's micro-batches in float64 on the device (float64: the
            # sums one process and FSDP2 ranks log are the same; on the device: no host sync until update)
            self.sums = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
            self.monitor_pending = self.monitor_due()
        return self.batch

    def batch_key(self) -> tuple:
        """Runs whose keys are equal read the same micro-batches: one teacher pass serves them all."""
        c = self.config
        ids = self.batcher.global_doc_ids(self.batch.step)
        return c.train_data, c.micro_batch, c.global_batch, c.balance_lengths, ids.tobytes(), self.teacher is not None

    def accumulate(self, micro: data.Batch, teacher_hidden: torch.Tensor | None, last: bool = True):
        """Forward and backward of one micro-batch; gradients add up until end_step. Under FSDP2 they
        add up unsharded on each rank and are reduce-scattered once, after the step's last micro-batch
        (set_gradient_sync). Nothing here waits for the device."""
        config, ctx = self.config, self.ctx
        if hasattr(self.net, "set_requires_gradient_sync"):
            set_gradient_sync(self.net, last, self.active_layers)
        monitoring, self.monitor_pending = self.monitor_pending, False  # the step's first micro-batch
        with self.own_rng():
            self.net.capture_boundaries = monitoring
            with autocast(self.dtype, ctx):
                loss, kd_term, ce_term = loss_fn(config, micro, teacher_hidden,
                                                 self.teacher.head_weight if self.teacher else None, self.phase,
                                                 self.batch.global_targets, self.net)
            if monitoring:
                self.monitor_row = monitor_row(self.net.captured, micro.mask)
                self.net.capture_boundaries, self.net.captured = False, None
            # Each rank's loss is already divided by the global target count; FSDP2 averages gradients
            # over ranks, so scale by the world size to get the gradient of the global mean.
            (loss * ctx.world).backward()
        self.sums += torch.stack((loss.detach(), kd_term, ce_term)).double()

    def end_step(self):
        """Clip, update, log; evaluate and checkpoint when due; finish after the last step."""
        with self.own_rng():
            self.update()
        if self.state != "training":  # diverged, and stopped there
            return
        if self.step == self.last_step:
            self.finish()
        elif self.stop_after_step is not None and self.step >= self.stop_after_step:
            self.stop()

    def update(self):
        config, ctx, phase = self.config, self.ctx, self.phase
        grad_norm = clip_gradients(self.params, config.grad_clip)
        if ctx.world > 1:
            dist.all_reduce(self.sums)  # logged losses are global
        # The step's one host sync: the losses and the norm, read together.
        loss, kd_sum, ce_sum, grad_norm = torch.cat((self.sums, grad_norm.to(self.sums).reshape(1))).tolist()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.diverge(self.step + 1, "a non-finite loss or gradient norm", {"loss": loss, "grad_norm": grad_norm},
                         always_stop=True)
            return
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        step, totals, tokens = self.step, self.totals, self.batch.global_tokens
        totals["total_tokens"] += tokens
        totals["active_layer_tokens"] += tokens * self.active_layers
        elapsed = time.time() - self.started
        self.log.write({"step": step, "phase": phase.index, "loss": loss, "kd": kd_sum, "ce": ce_sum, "lr": self.lr,
                        "grad_norm": grad_norm, "tokens": tokens, **totals, "time": elapsed})
        if self.monitor_row is not None:
            self.log.write({"step": step, "phase": phase.index, "monitor": True, **self.monitor_row})
            self.warn_boundaries(step, self.monitor_row["boundaries"])
            self.monitor_row = None
        if self.transition_row is not None:
            self.log.write({"step": step, **self.transition_row})
            self.transition_row = None
        kill_point("stepped", config.name, step)
        tok_s = totals["total_tokens"] / max(elapsed, 1e-9)
        if self.progress:
            self.progress.update(self.task, advance=1, loss=loss, tok_s=tok_s)
        phase_end = step == phase.first_step + phase.steps
        if phase_end or step % config.eval_interval == 0:
            self.final = evaluate(config, self.net, self.teacher, self.val, phase.active_blocks, ctx, self.dtype)
            kill_point("evaluated", config.name, step)
            if not all(math.isfinite(v) for v in self.final.values()):  # a CE past ~709 makes PPL infinite
                self.diverge(step, "a non-finite validation CE or PPL", self.final, always_stop=True)
                return
            self.log.write({"step": step, "phase": phase.index, "eval": True, **self.final})
            print0(ctx, f"{config.name}: step {step}: loss {loss:.4f}, val CE {self.final['ce']:.4f}, "
                        f"val KD {self.final['kd']:.4f}, {tok_s:,.0f} tok/s")
            best = self.outcome["best_ce"]
            self.outcome["best_ce"] = self.final["ce"] if best is None else min(best, self.final["ce"])
            if self.final["ce"] > self.ceiling():
                self.diverge(step, f"validation CE above log V + {config.diverged_above_uniform:g} = "
                                   f"{self.ceiling():.4f} (worse than a uniform prediction)", self.final)
                if self.state != "training":
                    return
        state = trainer_state(step, phase.index, self.batcher, totals, elapsed, self.outcome)
        if phase_end and self.keeps_optimizer() and step < self.last_step:
            # The next phase needs these moments: saved before phase-<p>/, so a kill between the two
            # resumes from them (on a tie newest_checkpoint prefers latest/).
            save_latest_checkpoint(self.run_dir, self.net, self.optimizer, state, ctx)
        if phase_end:
            save_kept_checkpoint(self.run_dir, f"phase-{phase.index}", self.net, state, ctx)
        elif config.snapshot_interval and step % config.snapshot_interval == 0:
            save_kept_checkpoint(self.run_dir, f"step-{step}", self.net, state, ctx)
        if not phase_end and step % config.checkpoint_interval == 0:
            save_latest_checkpoint(self.run_dir, self.net, self.optimizer, state, ctx)
        kill_point("saved", config.name, step)

    def ceiling(self) -> float:
        """The validation CE above which a run has diverged: a uniform prediction's log V, plus the margin."""
        return math.log(self.net.embed_tokens.num_embeddings) + self.config.diverged_above_uniform

    def diverge(self, step: int, why: str, values: dict, always_stop: bool = False):
        """Record a divergence; stop the run there unless it continues past one (on_divergence "continue",
        for a finite but too-high CE)."""
        self.record_divergence(step, why, values)
        if always_stop or self.config.on_divergence == "stop":
            self.finish()

    def record_divergence(self, step: int, why: str, values: dict):
        """The first divergence, with its values (a non-finite one as text: strict JSON) and the newest
        checkpoint, which it did not reach."""
        if self.outcome["diverged"] is not None:
            return
        good = newest_checkpoint(self.run_dir)
        self.outcome["diverged"] = {
            "step": step, "why": why, "last_good_checkpoint": good[0].name if good else None,
            "values": {k: v if isinstance(v, (int, float)) and math.isfinite(v) else str(v) for k, v in values.items()}}
        print0(self.ctx, f"{self.config.name}: diverged at step {step}: {why}" +
               (f"; the last good checkpoint is {good[0]}" if good else ""))

    def finish(self):
        """done.json holds the scheduled endpoint's evaluation (killed after the last save: evaluate it), or,
        for a run that diverged, null numbers and the divergence: an outcome, never a number."""
        if self.final is None and self.outcome["diverged"] is None:
            self.final = evaluate(self.config, self.net, self.teacher, self.val, self.phases[-1].active_blocks, self.ctx,
                                  self.dtype)
        best, margin = self.outcome["best_ce"], self.config.diverged_above_best
        if self.final is not None and not all(math.isfinite(v) for v in self.final.values()):
            self.record_divergence(self.step, "a non-finite validation CE or PPL", self.final)
        elif self.final is not None and best is not None and self.final["ce"] > best + margin:
            self.record_divergence(self.step, f"ended {self.final['ce'] - best:.4f} above its best validation CE "
                                              f"{best:.4f} (margin {margin:g})", self.final)
        diverged = self.outcome["diverged"]
        done = {**self.final, "step": self.step} if diverged is None else \
            {**{k: None for k in RESULT_KEYS}, "step": self.step, "diverged": diverged}
        if self.ctx.is_main:
            write_json(self.run_dir / "done.json", done)
            if diverged is None:  # a diverged run keeps its resume point beside the last good checkpoint
                shutil.rmtree(self.run_dir / "latest", ignore_errors=True)
        self.ctx.barrier()
        kill_point("done", self.config.name, self.step)
        self.result = final_eval(self.run_dir)
        self.stop("done")

    def stop(self, state: str = "stopped"):
        """Stop here (done, or as if killed: the resume tests); its memory is freed for the others."""
        self.log.close()
        if self.progress:
            self.progress.update(self.task, visible=False)
        self.state, self.net, self.optimizer, self.params = state, None, None, None


class BoundaryProfile:
    """mirror-fwd's target: a frozen reference student's per-token RMS at each block boundary, on the
    batch being run (a plain object, so the reference is never part of the trained model)."""

    def __init__(self, reference: model.Student):
        self.reference = reference

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, active_blocks: int) -> dict:
        _, bounds = self.reference(input_ids, active_blocks=active_blocks - 1, output_fn=hidden_only,
                                   return_boundaries=True)
        return {b: bounds[b].float().pow(2).mean(-1, keepdim=True).sqrt() for b in range(1, active_blocks)}


def monitor_row(captured: dict, mask: torch.Tensor) -> dict:
    """The boundary monitor's numbers from one training forward: per boundary, the mean, std and Pearson
    kurtosis of per-token RMS over real tokens, the document-boundary token's (position 0) mean RMS
    over that of all other real tokens (delimiters included: the monitor decodes nothing) and the
    largest activation over the median magnitude (diag.massive_activation); per layer, each head's
    mean attention on position 0 (diag.first_token_attention). diag.boundary_stats's conventions."""
    import diag  # diag imports this module
    rows = []
    for b, h in enumerate(captured["boundaries"]):
        rms = diag.token_rms(h, mask)
        first = diag.token_rms(h[:, :1], mask[:, :1])
        others = diag.token_rms(h[:, 1:], mask[:, 1:])
        ratio = first.mean().item() / others.mean().item() if first.numel() and others.numel() else None
        stats = diag.summarize(rms)
        rows.append({"boundary": b, "label": diag.boundary_label(b), "mean": stats["mean"], "std": stats["std"],
                     "kurtosis": stats["kurtosis"], "boundary_over_others": ratio,
                     "massive_ratio": diag.massive_activation(h, mask)["massive_ratio"]})
    return {"boundaries": rows, "first_attention": diag.first_token_attention(captured["first_attention"], mask)}


# ----------------------------------------------------------------------------------------------
# Training: one run, or several in lockstep

def train(config: RunConfig, run_dir, force: bool = False, ctx: Dist | None = None,
          stop_after_step: int | None = None, tracker: str = "", teacher: Teacher | None = None,
          wait: bool = True) -> dict:
    """Run (or resume, or skip if done) one run; returns the final evaluation. `stop_after_step`
    ends early as if killed there (tests of resume); `tracker` also feeds TensorBoard or W&B;
    `teacher`, a loaded one (default: config.teacher is loaded)."""
    return train_together([(config, run_dir)], force, ctx, stop_after_step, tracker, teacher, wait)[0]


def train_together(jobs: list[tuple[RunConfig, Path]], force: bool = False, ctx: Dist | None = None,
                   stop_after_step: int | None = None, tracker: str = "", teacher: Teacher | None = None,
                   wait: bool = True) -> list[dict]:
    """Train several runs in lockstep, each exactly as it would train alone. At each global step the
    teacher runs once per micro-batch for every run that reads that batch (runs of one seed read the
    same batch at the same step), then each of those runs does its own forward and backward. A run
    that starts from another's phase (freeze from grow's phase 0) joins when that phase is written; a
    finished run drops out; runs resumed at different steps train alone until they meet. Weights and
    optimizer states of all runs are resident together; activations and, under FSDP2, unsharded
    gradients are one run's at a time (lockstep_step). Each run
    folder is held by this process alone while it trains (locks.held: another process on one of them
    is waited for, or with wait=False an error); a finished run is only read, and not held. Returns
    each run's final evaluation ({} for one stopped early)."""
    ctx = ctx or setup_distributed()
    with ExitStack() as stack:
        ctx.on_main(lambda: stack.enter_context(held([d for c, d in jobs if not finished(c, d)], wait,
                                                     say=lambda line: print0(ctx, line))),
                    "another process's use of the run folders")
        return train_held(jobs, force, ctx, stop_after_step, tracker, teacher)


def train_held(jobs, force, ctx, stop_after_step, tracker, teacher) -> list[dict]:
    runs = [Run(config, run_dir, ctx, stop_after_step, tracker) for config, run_dir in jobs]
    for run in runs:
        run.prepare(force)
    todo = [run for run in runs if run.state == "new"]
    distilled = [run.config for run in todo if run.config.distils]
    if len({(c.teacher, c.precision) for c in distilled}) > 1:
        raise TrainingError("runs trained together must distil from one teacher at one precision; train them apart")
    if distilled and teacher is None:
        teacher = load_teacher(distilled[0], ctx, precision_choice(distilled[0].precision, ctx.device)[0])
    if todo and ctx.device.type == "cuda":
        warn_math_attention(todo[0].config, ctx)
    progress = progress_bar(ctx)
    if progress:
        progress.start()
    try:
        while open_runs(todo, teacher, progress):
            training = [run for run in todo if run.state == "training"]
            step = min(run.step for run in training)
            lockstep_step([run for run in training if run.step == step], teacher)
    finally:
        if progress:
            progress.stop()
    return [run.result for run in runs]


def warn_math_attention(config: RunConfig, ctx: Dist):
    """One line if this GPU has no fused attention kernel for the runs' longest document (SDPA would fall
    back to the math kernel without a word: its T x T scores per head, and several times slower)."""
    shard = data.Shard(config.train_data, verify=False)
    length = int(shard.lengths.max()) - 1
    shape = model.ModelConfig(**config.teacher_config) if config.teacher_config else \
        model.ModelConfig.from_hf(model.read_config(Path(config.teacher))) if config.teacher else \
        model.ModelConfig(**config.scratch_model)
    problem = model.fused_attention_problem(shape, length, ctx.device)
    if problem:
        scores = shape.num_attention_heads * length**2 * 4 / 2**30
        print0(ctx, f"warning: no fused attention kernel on {torch.cuda.get_device_name(ctx.device)} for {length} tokens "
                    f"({problem}); SDPA's math kernel will hold ~{scores:.1f} GiB of scores a layer and run several "
                    "times slower: use a GPU with flash attention (sm80+) or shorter documents (data.max_len)")


def open_runs(todo: list[Run], teacher: Teacher | None, progress) -> bool:
    """Open every run that can start; True while any is training. A run whose shared prefix never
    appears is opened anyway once nothing else trains, to say which run to do first."""
    for run in todo:
        if run.state == "new" and run.can_open():
            run.open(teacher, progress)
    if not any(run.state == "training" for run in todo):
        for run in todo:
            if run.state == "new":
                run.open(teacher, progress)
    return any(run.state == "training" for run in todo)


def lockstep_step(runs: list[Run], teacher: Teacher | None):
    """One optimizer step of every run in `runs` (all at the same step), one run after another: each
    run's micro-batches in turn, then its update. Under FSDP2 a run's gradients add up unsharded (fp32,
    the size of its trained layers) until its last micro-batch reduce-scatters them, so this order holds
    one run's unsharded gradients at a time beside the others' shards; taking micro-batch i of every
    run before micro-batch i + 1 would hold every run's at once. The teacher runs once per micro-batch
    for each group of runs that reads the same batch; its hidden states are kept for the step (one
    micro-batch's each) where the group has more than one run. Each run computes exactly what it
    computes alone: the order between runs changes no run's numbers (each keeps its own RNG state)."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        run.begin_step()
        groups.setdefault(run.batch_key(), []).append(run)
    for group in groups.values():
        first = group[0]
        micro_batches = [micro.to(first.ctx.device) for micro in first.batch.micro_batches]
        kept: list[torch.Tensor | None] = [None] * len(micro_batches)
        for run in group:
            for i, micro in enumerate(micro_batches):
                hidden = kept[i]
                if run is first and first.teacher is not None:
                    with autocast(first.dtype, first.ctx):
                        hidden = teacher.hidden(micro.input_ids)
                    if len(group) > 1:
                        kept[i] = hidden
                run.accumulate(micro, hidden, last=i == len(micro_batches) - 1)
            run.end_step()


def progress_bar(ctx: Dist):
    """A rich progress bar on an interactive rank-0 terminal; logs and other ranks get printed lines."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    if not (ctx.is_main and Console().is_terminal):
        return None
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}  {task.fields[tok_s]:,.0f} tok/s"), TimeRemainingColumn())


def main(argv=None):
    """`python grow.py RUN_DIR/config.json [...]` (re)starts or resumes the runs stored in those
    folders, several of them in lockstep."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("configs", type=Path, nargs="+", help="runs' config.json files")
    parser.add_argument("--run-dir", type=Path, help="one run only; default: the folder holding its config")
    parser.add_argument("--stop-after-step", type=int, help="stop there, as if killed (resume tests)")
    args = parser.parse_args(argv)
    if args.run_dir and len(args.configs) > 1:
        parser.error("--run-dir is for one run; each of several runs lives in its config's folder")
    jobs = [(RunConfig(**loads(path.read_text())), args.run_dir or path.parent) for path in args.configs]
    train_together(jobs, stop_after_step=args.stop_after_step)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
