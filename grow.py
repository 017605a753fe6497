"""Training: a run's protocol, its phases (each with a fresh AdamW and a restarted warmup + cosine),
and several runs trained together in lockstep on one teacher pass per batch.

Runs are normally started by repro.py, which fills a RunConfig from a preset:

    python repro.py train --scale toy --norm post --protocol grow           # one CPU or GPU
    torchrun --nproc_per_node=8 repro.py train --scale full --norm post --protocol grow
    torchrun --nnodes=4 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 \\
        repro.py train --scale full --norm post --protocol grow             # several nodes

`train` runs one run; `train_together` several, each exactly as if alone (bit-identical in one process), the frozen
teacher running once per batch for the runs that read it.
"""

import math
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

import checkpointing
import data
import model
import nets
import rundir
import transitions
from config import Phase, RunConfig, learning_rate, plan_phases
from plumbing import flops
from plumbing.devices import Dist, autocast, clip_gradients, precision_choice, print0, set_gradient_sync, setup_distributed
from plumbing.errors import TrainingError
from plumbing.faults import armed, kill_point
from plumbing.locks import held
from plumbing.progress import Bars, Runs
from plumbing.writer import wait_for_writes

# Phases: what trains, with which optimizer

def trainable_parameters(net: torch.nn.Module, phase: Phase, train_embedding: bool = False) -> list[torch.nn.Parameter]:
    """Set requires_grad for the phase and return the parameters the optimizer gets (the embedding frozen, the
    paper's, except in growth from scratch)."""
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


def build_optimizer(config: RunConfig, params: list) -> torch.optim.AdamW:
    # foreach=False: bit-identical across resumes and ranks' shards. Run.begin_step sets the lr before each step.
    groups = [{"params": [p for p in params if p.ndim > 1 or config.decay_gains]},
              {"params": [p for p in params if p.ndim < 2 and not config.decay_gains], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay, foreach=False)


# A run while it trains. The driver below calls, for each of its steps, begin_step, accumulate (once per
# micro-batch) and end_step.

class Run:
    def __init__(self, config: RunConfig, run_dir, ctx: Dist, stop_after_step: int | None = None,
                 tracker: str = ""):
        # `written` goes to config.json as given (portable paths); the run itself uses absolute ones.
        self.written, self.config = config, config.resolved(run_dir)
        self.run_dir, self.ctx = Path(run_dir), ctx
        self.stop_after_step, self.tracker = stop_after_step, tracker
        self.phases = plan_phases(config)
        self.last_step = self.phases[-1].first_step + self.phases[-1].steps
        # A joint-long run with restart_optimizer off carries AdamW's moments across LR restarts.
        self.keeps_optimizer = config.protocol == "joint-long" and not config.restart_optimizer
        # The compute precision, decided once (for "auto", by measuring the machine: plumbing/devices.py).
        self.dtype, self.precision = precision_choice(config.precision, ctx.device, ctx.auto_precision)
        self.state = "new"   # new -> training -> done | stopped
        self.result: dict = {}

    def prepare(self, force: bool):
        """Create or check the folder; a run already done is not trained again."""
        if rundir.prepare_run_dir(self.written, self.run_dir, force, self.ctx,
                                  rundir.provenance(self.ctx, self.dtype, self.precision)):
            print0(self.ctx, f"{self.config.name}: done, reusing {self.run_dir}")
            self.state, self.result = "done", rundir.final_eval(self.run_dir)

    def can_open(self) -> bool:
        """False while the shared prefix it starts from is not written yet (a write of it in flight is waited for,
        so when a run joins does not depend on the writer thread's timing)."""
        if self.config.start_from:
            wait_for_writes(Path(self.config.start_from).parent)
        return (not self.config.start_from or checkpointing.newest_checkpoint(self.run_dir) is not None
                or (Path(self.config.start_from) / "trainer_state.json").is_file())

    def open(self, teacher: nets.Teacher | None, progress):
        """Build the model and data, then continue from the newest checkpoint (or the shared prefix), the log cut
        back to it; latest/'s AdamW state is loaded by begin_phase, once the optimizer exists."""
        config, ctx = self.config, self.ctx
        torch.manual_seed(config.seed)
        print0(ctx, (f"{progress.runs.label(self.run_dir)}: " if progress else "") +  # logs say it too
               f"{config.name}: {config.protocol}, {config.norm}-norm, seed {config.seed}, {len(self.phases)} "
               f"phase(s) x {config.phase_steps} steps, {ctx.world} rank(s) on {ctx.device.type}, precision "
               f"{self.precision}; resolved config in {self.run_dir / 'config.json'}")
        self.teacher = teacher if config.distils else None
        # The whole shard's sha256 (tens of GB at full scale) is checked once, by prepare_shards.prepare.
        train_shard = data.Shard(config.train_data, verify=False)
        self.net = nets.build_model(config, self.teacher, ctx, self.dtype, boundary_token=train_shard.eot)
        self.monitor_row, self.warned, self.transition_row = None, set(), None
        self.val = data.Shard(config.val_data, verify=False)
        self.batcher = data.Batcher(train_shard, config.global_batch, config.seed, mode=config.data_mode,
                                    replay_docs=config.replay_docs, rank=ctx.rank, world_size=ctx.world,
                                    micro_batch=config.micro_batch, balance=config.balance_lengths,
                                    fixed_shapes=config.compile, packed=config.packs,
                                    # a balanced run's micro-batches placed by cost, as the dry run prices them
                                    doc_cost=partial(flops.document_cost, self.net.config, len(self.net.layers)))
        self.resume, self.step, self.totals, elapsed, self.outcome = checkpointing.resume_point(
            config, self.run_dir, self.net, self.batcher, ctx)
        if ctx.is_main:  # from step 0 too: a run killed before its first checkpoint left lines behind
            rundir.truncate_metrics(self.run_dir, self.step)
        self.rng = torch.get_rng_state()
        self.log = rundir.MetricsLog(self.run_dir, config, ctx, self.tracker)
        self.started = time.time() - elapsed
        self.phase, self.final = None, None
        self.progress = progress  # Bars, or None (a test driving the run itself)
        if progress:
            progress.add(self.run_dir, config.name, self.step, self.last_step)
        self.state = "training"
        kill_point("opened", config.name, self.step)
        if self.step >= self.last_step:  # killed after its last checkpoint, before done.json
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
        """mirror-fwd: the reference run's boundary profile for this phase, where the phase appends a block."""
        if self.config.boundary == "mirror-fwd" and phase.active_blocks >= 2:
            self.net.profile_source = nets.boundary_profile(self.config, phase, self.ctx, self.dtype)

    def begin_phase(self, phase: Phase):
        """A new optimizer over the trainable parameters (unless the run keeps its own); the start evaluation."""
        config, ctx = self.config, self.ctx
        continuing = self.phase is not None and self.keeps_optimizer
        self.phase = phase
        self.params = trainable_parameters(self.net, phase, train_embedding=config.scratch_model is not None)
        if not continuing:
            self.optimizer = build_optimizer(config, self.params)
        at_start = self.step == phase.first_step and not self.keeps_optimizer
        if self.resume and self.resume[0].name == "latest" and not at_start:
            checkpointing.load_latest_checkpoint(self.resume[0], self.net, self.optimizer, ctx)
        self.resume = None
        if self.step == phase.first_step and config.reset_data_each_phase:
            self.batcher.reset()
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
            self.progress.describe(self.run_dir, f"{config.name} phase {phase.index}")
        if self.step == phase.first_step:  # before the phase's first update: the starting weights' scores
            start = nets.evaluate(config, self.net, self.teacher, self.val, phase.active_blocks, ctx, self.dtype)
            self.log.write({"step": self.step, "phase": phase.index, "eval": True, "phase_start": True, **start})
            print0(ctx, f"{config.name}: phase {phase.index} starts at val CE {start['ce']:.4f}, val KD {start['kd']:.4f}")

    def transition(self, phase: Phase):
        """transitions.at_transition on this step's batch (read ahead); then a new optimizer over what now trains."""
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
            lr = learning_rate(self.config, self.step - phase.first_step, phase.index)  # the one place it is set
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.batch = next(self.batcher)
            # loss, KD and CE summed in float64 (equal on any ranks) on the device (no host sync until update)
            self.sums = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
            interval = self.config.monitor_interval  # whether the step about to be taken writes a boundary-monitor row
            self.monitor_pending = bool(interval) and (self.step + 1) % interval == 0 and isinstance(self.net, model.Student)
        return self.batch

    def batch_key(self) -> tuple:
        """Runs whose keys are equal read the same micro-batches: one teacher pass serves them all."""
        c, ids = self.config, self.batcher.global_doc_ids(self.batch.step)  # the layout too: packed or padded rows
        return (c.train_data, c.micro_batch, c.global_batch, c.balance_lengths, c.compile, c.packs, ids.tobytes(),
                bool(self.teacher))

    def accumulate(self, micro: data.Batch, teacher_hidden: torch.Tensor | None, last: bool = True,
                   teacher_log_probs: torch.Tensor | None = None):
        """Forward and backward of one micro-batch; gradients add up (under FSDP2 unsharded, reduce-scattered after
        the step's last micro-batch: set_gradient_sync). Nothing here waits for the device."""
        if hasattr(self.net, "set_requires_gradient_sync"):
            set_gradient_sync(self.net, last, self.active_layers)
        monitoring, self.monitor_pending = self.monitor_pending, False  # the step's first micro-batch
        with self.own_rng():
            self.net.capture_boundaries = monitoring
            with autocast(self.dtype, self.ctx):
                loss, kd_term, ce_term = nets.loss_fn(self.config, micro, teacher_hidden,
                                                      self.teacher.head_weight if self.teacher else None, self.phase,
                                                      self.batch.global_targets, self.net, teacher_log_probs)
            if monitoring:
                self.monitor_row = nets.monitor_row(self.net.captured, micro.mask, micro.first_positions())
                self.net.capture_boundaries, self.net.captured = False, None
            # The loss is over the global target count and FSDP2 averages over ranks: scale back by the world size.
            (loss * self.ctx.world).backward()
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
        """The optimizer step and its log rows, then an evaluation and the checkpoints when due."""
        # The step's loss, KD and CE (summed over ranks) and gradient norm, read together: its one host sync.
        grad_norm = clip_gradients(self.params, self.config.grad_clip)
        if self.ctx.world > 1:
            dist.all_reduce(self.sums)  # logged losses are global
        loss, kd_sum, ce_sum, grad_norm = torch.cat((self.sums, grad_norm.to(self.sums).reshape(1))).tolist()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.diverge(self.step + 1, "a non-finite loss or gradient norm", {"loss": loss, "grad_norm": grad_norm},
                         stop=True)
            return
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        step, totals, tokens = self.step, self.totals, self.batch.global_tokens
        totals["total_tokens"] += tokens
        totals["active_layer_tokens"] += tokens * self.active_layers
        lr, elapsed = self.optimizer.param_groups[0]["lr"], time.time() - self.started
        self.log_step({"loss": loss, "kd": kd_sum, "ce": ce_sum, "lr": lr, "grad_norm": grad_norm,
                       "tokens": tokens, **totals, "time": elapsed})
        kill_point("stepped", self.config.name, step)
        tok_s = totals["total_tokens"] / max(elapsed, 1e-9)
        if self.progress:
            self.progress.step(self.run_dir, loss, tok_s)
        phase_end = step == self.phase.first_step + self.phase.steps
        if phase_end or step % self.config.eval_interval == 0:
            if not self.evaluate_step(loss, tok_s):
                return
        state = checkpointing.trainer_state(step, self.phase.index, self.batcher, totals, elapsed, self.outcome)
        checkpointing.save_due_checkpoints(self.run_dir, self.config, self.net, self.optimizer, state, self.ctx, phase_end,
                                           moments_go_on=self.keeps_optimizer and step < self.last_step)
        if armed("saved", self.config.name, step):  # "saved" is after the step's checkpoints are on disk: the
            wait_for_writes(self.run_dir)  # background writes finish first (gpucheck's driver kills here)
        kill_point("saved", self.config.name, step)

    def log_step(self, numbers: dict):
        """The step's row, then the boundary monitor's and a transition's rows if the step took them."""
        step, phase = self.step, self.phase.index
        self.log.write({"step": step, "phase": phase, **numbers})
        if self.monitor_row is not None:
            self.log.write({"step": step, "phase": phase, "monitor": True, **self.monitor_row})
            self.warn_boundaries(step, self.monitor_row["boundaries"])
            self.monitor_row = None
        if self.transition_row is not None:
            self.log.write({"step": step, **self.transition_row})
            self.transition_row = None

    def warn_boundaries(self, step: int, rows: list[dict]):
        """One line the first time a boundary passes a monitor threshold (per boundary and statistic)."""
        for row in rows[1:]:
            for key, limit in (("mean", self.config.monitor_rms_warn), ("kurtosis", self.config.monitor_kurtosis_warn)):
                if row[key] is not None and row[key] > limit and (row["boundary"], key) not in self.warned:
                    self.warned.add((row["boundary"], key))
                    name = "mean per-token RMS" if key == "mean" else "kurtosis of per-token RMS"
                    print0(self.ctx, f"{self.config.name}: warning: step {step}: {row['label']}: {name} {row[key]:.4g} "
                                     f"passed the monitor's threshold {limit:g}")

    def evaluate_step(self, loss: float, tok_s: float) -> bool:
        """Evaluate, log and print; record the best CE and a divergence. False if the run stopped there."""
        config, step = self.config, self.step
        self.final = nets.evaluate(config, self.net, self.teacher, self.val, self.phase.active_blocks, self.ctx,
                                   self.dtype)
        kill_point("evaluated", config.name, step)
        if not all(math.isfinite(v) for v in self.final.values()):  # a CE past ~709 makes PPL infinite
            self.diverge(step, "a non-finite validation CE or PPL", self.final, stop=True)
            return False
        self.log.write({"step": step, "phase": self.phase.index, "eval": True, **self.final})
        print0(self.ctx, f"{config.name}: step {step}: loss {loss:.4f}, val CE {self.final['ce']:.4f}, "
                         f"val KD {self.final['kd']:.4f}, {tok_s:,.0f} tok/s")
        best = self.outcome["best_ce"]
        self.outcome["best_ce"] = self.final["ce"] if best is None else min(best, self.final["ce"])
        # the validation CE above which a run has diverged: a uniform prediction's log V, plus the margin
        ceiling = math.log(self.net.embed_tokens.num_embeddings) + config.diverged_above_uniform
        if self.final["ce"] > ceiling:
            self.diverge(step, f"validation CE above log V + {config.diverged_above_uniform:g} = "
                               f"{ceiling:.4f} (worse than a uniform prediction)", self.final,
                         stop=config.on_divergence == "stop")
        return self.state == "training"

    def diverge(self, step: int, why: str, values: dict, stop: bool):
        """Record the first divergence, with its values and the newest checkpoint; with `stop`, stop there."""
        if self.outcome["diverged"] is None:
            good = checkpointing.newest_checkpoint(self.run_dir)
            self.outcome["diverged"] = {
                "step": step, "why": why, "last_good_checkpoint": good[0].name if good else None,
                "values": {k: v if isinstance(v, (int, float)) and math.isfinite(v) else str(v) for k, v in values.items()}}
            print0(self.ctx, f"{self.config.name}: diverged at step {step}: {why}" +
                   (f"; the last good checkpoint is {good[0]}" if good else ""))
        if stop:
            self.finish()

    def finish(self):
        """done.json: the scheduled endpoint's evaluation (evaluated now if killed after the last save)."""
        if self.final is None and self.outcome["diverged"] is None:
            self.final = nets.evaluate(self.config, self.net, self.teacher, self.val, self.phases[-1].active_blocks,
                                       self.ctx, self.dtype)
        best, margin = self.outcome["best_ce"], self.config.diverged_above_best
        if self.final is not None and not all(math.isfinite(v) for v in self.final.values()):
            self.diverge(self.step, "a non-finite validation CE or PPL", self.final, stop=False)
        elif self.final is not None and best is not None and self.final["ce"] > best + margin:
            self.diverge(self.step, f"ended {self.final['ce'] - best:.4f} above its best validation CE "
                                    f"{best:.4f} (margin {margin:g})", self.final, stop=False)
        rundir.write_done(self.run_dir, self.final, self.step, self.outcome["diverged"], self.ctx)
        kill_point("done", self.config.name, self.step)
        self.result = rundir.final_eval(self.run_dir)
        self.stop("done")

    def stop(self, state: str = "stopped"):
        """Stop here (done, or as if killed: the resume tests), its memory freed, its checkpoint writes finished."""
        wait_for_writes(self.run_dir)
        self.log.close()
        if self.progress:
            self.progress.end(self.run_dir)
        self.state, self.net, self.optimizer, self.params = state, None, None, None


# Training: one run, or several in lockstep

def train(config: RunConfig, run_dir, force: bool = False, ctx: Dist | None = None,
          stop_after_step: int | None = None, tracker: str = "", teacher: nets.Teacher | None = None,
          wait: bool = True) -> dict:
    """Run (or resume, or skip if done) one run; its final evaluation. `stop_after_step`: as if killed there."""
    return train_together([(config, run_dir)], force, ctx, stop_after_step, tracker, teacher, wait)[0]


def train_together(jobs: list[tuple[RunConfig, Path]], force: bool = False, ctx: Dist | None = None,
                   stop_after_step: int | None = None, tracker: str = "", teacher: nets.Teacher | None = None,
                   wait: bool = True, counted: Runs | None = None) -> list[dict]:
    """Train several runs in lockstep, each exactly as it would train alone. A run that starts from another's phase
    joins when that phase is written; runs resumed at different steps train alone until they meet. Each unfinished
    run folder is held by this process while it trains (locks.held). `counted`: the command's runs, for its
    progress. Returns each run's final evaluation ({} if stopped early)."""
    ctx = ctx or setup_distributed()
    with ExitStack() as stack:
        ctx.on_main(lambda: stack.enter_context(held([d for c, d in jobs if not rundir.finished(c, d)], wait,
                                                     say=lambda line: print0(ctx, line))),
                    "another process's use of the run folders")
        bars = Bars(ctx, counted or Runs(), jobs)
        runs = [Run(config, run_dir, ctx, stop_after_step, tracker) for config, run_dir in jobs]
        for run in runs:
            run.prepare(force)
            if run.state == "done":  # numbered now (a run about to train is numbered when it opens)
                bars.runs.opened(run.run_dir, 0, 0)
        todo = [run for run in runs if run.state == "new"]
        distilled = [run for run in todo if run.config.distils]  # each Run decided its precision when made
        if len({(run.config.teacher, run.dtype) for run in distilled}) > 1:
            raise TrainingError("runs trained together must distil from one teacher at one precision; train them apart")
        if distilled and teacher is None:
            teacher = nets.load_teacher(distilled[0].config, ctx, distilled[0].dtype)
        if todo and ctx.device.type == "cuda":
            nets.warn_math_attention(todo[0].config, ctx)
        with bars:
            while open_runs(todo, teacher, bars):
                training = [run for run in todo if run.state == "training"]
                step = min(run.step for run in training)
                lockstep_step([run for run in training if run.step == step], teacher)
        return [run.result for run in runs]


def lockstep_groups(jobs: list, settings: Callable = lambda job: job[0]) -> list[list]:
    """A seed's runs as they train in lockstep: a group per data stream (RunConfig.data_mode: grow's replayed shard,
    or the long joint controls' fresh documents, which pre- and post-norm read alike), in order of first appearance
    (a shared prefix comes before the runs that adopt it, and its group with it). `settings`: a job's RunConfig."""
    streams: dict[str, list] = {}
    for job in jobs:
        streams.setdefault(settings(job).data_mode, []).append(job)
    return list(streams.values())


def open_runs(todo: list[Run], teacher: nets.Teacher | None, progress) -> bool:
    """Open every run that can start; True while any is training. One whose shared prefix never appears is opened
    once nothing else trains, to say which run to do first."""
    for run in todo:
        if run.state == "new" and run.can_open():
            run.open(teacher, progress)
    if not any(run.state == "training" for run in todo):
        for run in todo:
            if run.state == "new":
                run.open(teacher, progress)
    return any(run.state == "training" for run in todo)


def lockstep_step(runs: list[Run], teacher: nets.Teacher | None):
    """One optimizer step of every run in `runs` (all at the same step), one run after another, so that under FSDP2
    one run's unsharded gradients are held at a time (micro-batch i of every run before i + 1 would hold every
    run's at once). The teacher runs once per micro-batch for each group of runs that reads the same batch. The
    order between runs changes no run's numbers (each keeps its own RNG state)."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        run.begin_step()
        groups.setdefault(run.batch_key(), []).append(run)
    for group in groups.values():
        first = group[0]
        micro_batches = [micro.to(first.ctx.device) for micro in first.batch.micro_batches]
        kept: list[tuple] = [(None, None)] * len(micro_batches)  # (hidden states, log-probabilities) of each
        # the teacher's log-probabilities too, where every run reads them at one temperature and in one chunking
        same_terms = len({(run.config.tau, run.config.loss_chunk) for run in group}) == 1
        for run in group:
            for i, micro in enumerate(micro_batches):
                hidden, log_probs = kept[i]
                if run is first and first.teacher is not None:
                    with autocast(first.dtype, first.ctx):
                        hidden = teacher.training_hidden(micro, first.batcher)
                        if len(group) > 1 and same_terms:
                            log_probs = teacher.log_probs(hidden, micro, first.config)
                    if len(group) > 1:
                        kept[i] = hidden, log_probs
                run.accumulate(micro, hidden, last=i == len(micro_batches) - 1, teacher_log_probs=log_probs)
            run.end_step()
