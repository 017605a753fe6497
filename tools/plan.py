"""The dry run: what a suite costs, computed without running anything (`repro.py ... --dry-run`).

Per run: phases, steps, tokens, FLOPs and GPU-hours; for the suite: the totals with every run paying
for its own teacher passes (separate) and with the runs of a seed that read the same batches sharing
one teacher pass per batch (lockstep, grow.train_together), and the per-GPU memory of each. Lockstep
keeps the weights and optimizer states of every run it trains at once resident, so it is chosen only
where that fits the GPU (tools/lockstep_plan.py counts which runs train together and what each stretch of
steps holds on a GPU; tools/cpu_estimate.py estimates the time on this machine's CPU).
"""
import io
import math
from dataclasses import dataclass
from functools import partial

import numpy as np
from rich.console import Console
from rich.table import Column, Table

import config
import data
from experiments import presets, report, suite
from plumbing.flops import document_cost, forward_flops_per_token
from plumbing.hf_qwen3 import ModelConfig
from tools import lockstep_plan, memory
from tools.lockstep_plan import PlannedRun

GPU_BF16_PEAK = {"a100": 312e12, "h100": 989e12, "h200": 989e12, "b200": 2250e12}  # dense bf16 FLOP/s
GPU_MEMORY_GIB = {"a100": 80, "h100": 80, "h200": 141, "b200": 180}
ASSUMED_MFU = 0.40  # torchtitan reports roughly 40-50% on dense 8B models
DISK_BYTES_PER_S = 1e9  # an assumed sequential read speed for the dry run's diagnostics estimate
# Stated, not measured: NCCL's bus bandwidth per GPU for all-gather and reduce-scatter within an 8 x H100
# NVLink node, and for all-reduce across nodes over one 400 Gb/s InfiniBand NIC per GPU.
NVLINK_BYTES_PER_S = 360e9
INFINIBAND_BYTES_PER_S = 45e9
# Stated, not measured: what the runs folder takes from one node's ranks writing their checkpoint shards
# at once (a cluster filesystem's per-client write speed is of this order). The write runs on a writer thread
# while training goes on (checkpointing.save_checkpoint); GPUs wait for it only where the writes outlast the steps.
CHECKPOINT_WRITE_BYTES_PER_S = 2e9
# Stated, not measured: a GPU's copy of its share of a checkpoint into pageable host memory over PCIe Gen5 x16
# (pinned memory reaches several times this): the part of a checkpoint every GPU waits for.
HOST_COPY_BYTES_PER_S = 10e9
# Assumed until the data exists (then the shard's own lengths are used): document lengths lognormal with
# this spread around the preset's mean (FineWeb-Edu's median is about 0.6 of its mean: exp(-sigma^2/2)),
# cut at data.max_len.
DOC_LENGTH_SIGMA = 1.0
BALANCE_STEPS = 500  # steps simulated for the rank-imbalance factor


# Communication: FSDP2's collectives of one step, counted from the sharding (rehearse.py measures them)

def collectives(preset, teacher: ModelConfig, phase: config.Phase, gpus: int, nodes: int = 1,
                with_teacher: bool = True) -> list[tuple[str, int, float]]:
    """(kind, ranks, bytes of this rank's buffer) of every collective of one optimizer step in `phase`
    under devices.shard_fn on `nodes` x `gpus`: each micro-batch all-gathers every teacher layer
    (bf16) once, the student's active layers (bf16) in forward and, those that train, again in backward,
    and the student's root (fp32: embedding, norms, head) once; after the last micro-batch each trained
    unit's fp32 gradients are reduce-scattered once (the frozen embedding has none), and over several
    nodes all-reduced across them (HSDP); then the gradient norm's one all-reduce over a node's shards.
    One GPU: none."""
    world = gpus * nodes
    if world == 1:
        return []
    micro = preset.run["global_batch"] // world // preset.run["micro_batch"]
    L, layer = preset.run["layers_per_block"], memory.layer_parameters(teacher)
    active, trained = phase.active_blocks * L, len(phase.trainable_blocks) * L
    head = teacher.vocab_size * teacher.hidden_size
    root = 2 * head + 2 * teacher.hidden_size
    per_micro = [("all-gather", gpus, 2 * layer)] * (teacher.num_hidden_layers if with_teacher else 0) \
        + [("all-gather", gpus, 2 * layer)] * (active + trained) + [("all-gather", gpus, 4 * root)]
    grads = [("reduce-scatter", gpus, 4 * layer)] * trained + [("reduce-scatter", gpus, 4 * head)] * phase.trains_head
    across = [("all-reduce", nodes, b / gpus) for _, _, b in grads] if nodes > 1 else []
    clip = [("all-reduce", gpus, 8)]  # devices.clip_gradients: the float64 sum of squares over the shards
    return per_micro * micro + grads + across + clip


def comm_seconds(calls: list[tuple[str, int, float]], nodes: int = 1) -> float:
    """Ring collectives' time at the stated bandwidths: bytes x (n - 1) / n over NVLink within a node,
    over InfiniBand for the all-reduce across nodes (HSDP's replicas)."""
    seconds = 0.0
    for kind, ranks, nbytes in calls:
        if ranks > 1:
            across = kind == "all-reduce" and nodes > 1
            seconds += nbytes * (ranks - 1) / ranks / (INFINIBAND_BYTES_PER_S if across else NVLINK_BYTES_PER_S)
    return seconds


def student_flops(preset, teacher: ModelConfig, ph: config.Phase, context: float, checkpointing: bool) -> float:
    """A token's FLOPs in a student's step of phase `ph`: its forward everywhere, the backward (2x) of its
    trained blocks, their forward again under activation checkpointing, and its head's forward and backward."""
    layers, head = forward_flops_per_token(teacher, ph.active_blocks * preset.run["layers_per_block"], context)
    trained = len(ph.trainable_blocks) / ph.active_blocks
    return layers * (1 + 2 * trained + (trained if checkpointing else 0.0)) + 3 * head


def student_bytes(preset, teacher: ModelConfig) -> float:
    """A kept student checkpoint on disk: fp32 decoder layers, embedding, norms and head."""
    return 4 * (preset.run["blocks"] * preset.run["layers_per_block"] * memory.layer_parameters(teacher)
                + 2 * teacher.vocab_size * teacher.hidden_size + 2 * teacher.hidden_size)


def planned_runs(ws: suite.Workspace, runs, seed: int) -> list[PlannedRun]:
    """The runs `runs` need (suite.RunName), each with the number of leading phases another run computes for it."""
    def shared(run):
        prefix = suite.prefix_run(run, ws)
        return prefix[1] + 1 if prefix else 0
    return [PlannedRun(run.name, suite.run_config(ws, run, seed), shared(run)) for run in suite.with_prefixes(runs)]


def lockstep_default(ws: suite.Workspace, names) -> bool:
    """Lockstep on CPUs and Apple silicon (host memory; the toy's students are a few MB each), and on a
    CUDA GPU where the resident runs fit (fits)."""
    if ws.ctx.device.type != "cuda":
        return True
    import torch
    gpu_bytes = torch.cuda.get_device_properties(ws.ctx.device).total_memory
    return lockstep_plan.fits(ws.preset, ws.ctx.local_world, gpu_bytes, planned_runs(ws, names, ws.preset.run["seed"]),
                              ws.ctx.nodes)


@dataclass
class PhaseCost:
    """A step's costs in one run's phase on each GPU (seconds): the student's compute and communication, and the
    teacher's (which lockstep runs share)."""
    compute: float
    comm: float
    teacher_compute: float
    teacher_comm: float


def phase_costs(run: PlannedRun, preset, teacher: ModelConfig, doc_tokens: float, gpu: str, gpus: int,
                nodes: int, recompute: bool = True) -> dict[int, PhaseCost]:
    """The phases a run computes itself (after a shared prefix), by index, each costed per step: FLOPs at the
    assumed MFU, collectives (collectives()) at the stated bandwidths."""
    context = min(doc_tokens, preset.data["max_len"]) / 2
    tokens = run.config.global_batch * doc_tokens / (gpus * nodes)  # per GPU
    rate = GPU_BF16_PEAK[gpu] * ASSUMED_MFU
    t_layers, head = forward_flops_per_token(teacher, teacher.num_hidden_layers, context)
    out = {}
    for ph in config.plan_phases(run.config)[run.shared_phases:]:
        # the student's step and the teacher's head forward inside this run's loss; the teacher's layers
        # forward apart (lockstep shares only those)
        checkpointing = recompute and run.config.activation_checkpointing
        flops = tokens * (student_flops(preset, teacher, ph, context, checkpointing) + head)
        student = comm_seconds(collectives(preset, teacher, ph, gpus, nodes, with_teacher=False), nodes)
        both = comm_seconds(collectives(preset, teacher, ph, gpus, nodes), nodes)
        out[ph.index] = PhaseCost(flops / rate, student, tokens * t_layers / rate, both - student)
    return out


def suite_seconds(runs: list[PlannedRun], costs: dict[str, dict[int, PhaseCost]], lockstep: bool) -> float:
    """Wall seconds of one seed's runs: a step takes the longer of its compute and its communication
    (FSDP2 prefetches the next unit's all-gather during the current one's compute). Apart, every step
    pays its own teacher; in lockstep, the runs of a segment (lockstep_plan.lockstep_segments) at one global
    step share one teacher pass (plan of grow.train_together)."""
    seconds = 0.0
    for runs_together in [runs] if lockstep else [[run] for run in runs]:
        for a, b, live in lockstep_plan.lockstep_segments(runs_together):
            steps = [costs[name][ph.index] for name, ph in live]
            seconds += (b - a) * max(steps[0].teacher_compute + sum(s.compute for s in steps),
                                     steps[0].teacher_comm + sum(s.comm for s in steps))
    return seconds


def print_plan(ws, runs: list[PlannedRun], seeds: list[int], gpu: str, gpus: int, console: Console,
               nodes: int = 1, first_epoch_kept: bool = False) -> dict:
    """The plan table and, each way (separate, lockstep), where the GPU-hours go line by line and the
    per-GPU memory (lockstep: of every segment); returns {"rows", "separate", "lockstep"} (FLOPs,
    GPU-hours, their lines, memory, teacher passes) and "lockstep_default". `first_epoch_kept`: the FLOPs
    without the teacher passes one CPU process spares (lockstep_plan.teacher_passes)."""
    preset = ws.preset
    for run in runs:  # what the launch would refuse is refused here, with its line, before anything is priced
        data.check_split(run.config.global_batch, gpus * nodes, run.config.micro_batch)
    teacher = presets.teacher_shape(preset)
    # the documents' mean length: the training shard's (its lengths `measured`) once the data exists, else assumed
    train = ws.data_dir / "train"
    measured = data.Shard(train, verify=False).lengths[:ws.replay_docs] - 1 if (train / "manifest.json").is_file() else None
    doc_tokens = preset.doc_tokens if measured is None else float(measured.mean())
    costs = {r.name: phase_costs(r, preset, teacher, doc_tokens, gpu, gpus, nodes) for r in runs}
    plain = {r.name: phase_costs(r, preset, teacher, doc_tokens, gpu, gpus, nodes, recompute=False) for r in runs}
    rows, separate_flops = run_table(ws, runs, seeds, teacher, doc_tokens, costs, gpu, gpus, nodes, console)
    context = min(doc_tokens, preset.data["max_len"]) / 2
    t_layers, _ = forward_flops_per_token(teacher, teacher.num_hidden_layers, context)
    pass_flops = preset.run["global_batch"] * doc_tokens * t_layers * len(seeds)
    priced = lockstep_plan.teacher_passes(runs, False)  # run_table's: each run its own teacher passes
    totals = {}
    for way in ("separate", "lockstep"):
        saved = priced - lockstep_plan.teacher_passes(runs, way == "lockstep", first_epoch_kept)
        flops = separate_flops - saved * pass_flops
        totals[way] = way_total = way_totals(ws, runs, seeds, teacher, costs, plain, measured, gpu, gpus, nodes,
                                             way == "lockstep")
        way_total["flops"] = flops
        console.print(f"{way}: {flops_text(flops)} (recompute included); {hours_text(way_total['gpu_hours'])} {gpu} "
                      f"GPU-hours = {hours_text(way_total['wall_hours'])} hours on {nodes} x {gpus} GPU(s); "
                      f"{way_total['teacher_passes']:,} teacher steps. Where the hours go (compute at an assumed "
                      f"{ASSUMED_MFU:.0%} MFU, communication at {NVLINK_BYTES_PER_S / 1e9:.0f} GB/s within a node"
                      + (f" and {INFINIBAND_BYTES_PER_S / 1e9:.0f} GB/s across" if nodes > 1 else "") + "):")
        for line, hours in way_total["hours_lines"].items():
            console.print(f"  {line}: {hours_text(hours)} GPU-h")
        if not way_total["memory_segments"]:
            console.print(f"  per-GPU memory at most {way_total['memory_gib']:.1f} GiB (one run at a time)")
        for s in way_total["memory_segments"]:
            console.print(f"  steps {s['steps'][0]:,}-{s['steps'][1]:,}: per-GPU memory {s['gib']:.1f} GiB "
                          f"({', '.join(s['runs'])} resident)")
    print_diagnostics(console, preset, runs, seeds, teacher, context, gpu, totals)
    default = lockstep_plan.fits(preset, gpus, GPU_MEMORY_GIB[gpu] * 2**30, runs, nodes)
    console.print(f"default on {gpus} {gpu}: {'lockstep' if default else 'separate'} (lockstep's worst segment needs "
                  f"~{totals['lockstep']['memory_gib']:.2g} of {GPU_MEMORY_GIB[gpu]} GiB, "
                  f"{lockstep_plan.MEMORY_HEADROOM:.0%} usable, where every micro-batch holds its full budget of "
                  f"{preset.run['micro_batch'] * preset.data['max_len']:,} tokens; --lockstep/--no-lockstep overrides)")
    return {"rows": rows, **totals, "lockstep_default": default}


def run_table(ws, runs, seeds, teacher, doc_tokens: float, costs: dict[str, dict[int, PhaseCost]], gpu: str, gpus: int,
              nodes: int, console) -> tuple[list, float]:
    """Each run alone: phases, steps, tokens, FLOPs (activation-checkpointing recompute included) and
    GPU-hours of its steps; (rows, FLOPs of every run apart over the seeds)."""
    preset, L = ws.preset, ws.preset.run["layers_per_block"]
    context = min(doc_tokens, preset.data["max_len"]) / 2
    t_layers, t_head = forward_flops_per_token(teacher, teacher.num_hidden_layers, context)
    columns = ("run", "phases", "steps", "active layers", "tokens", "unique", "layer-tokens", "FLOPs", f"{gpu} GPU-h")
    table = Table(*(Column(column, justify="right") for column in columns),
                  title=f"plan at scale {preset.name}: {len(seeds)} seed(s), {doc_tokens:.1f} tokens/document"
                        f"{' (assumed)' if doc_tokens == preset.doc_tokens else ' (measured)'}; each run alone")
    total, rows = 0.0, []
    for run in runs:
        c, phases = run.config, config.plan_phases(run.config)
        tokens_per_phase = c.phase_steps * c.global_batch * doc_tokens
        flops = 0.0
        for ph in phases[run.shared_phases:]:  # a shared prefix is not recomputed
            # the student's step; the teacher's layers once, its head in each run's loss
            student = student_flops(preset, teacher, ph, context, c.activation_checkpointing)
            flops += (student + t_layers + t_head) * tokens_per_phase
        total += flops * len(seeds)
        unique = tokens_per_phase * (len(phases) if c.data_mode == "fresh" else 1)
        row = [run.name, str(len(phases)), f"{len(phases) * c.phase_steps:,}",
               " / ".join(str(p.active_blocks * L) for p in phases),
               *(report.fmt(n, report.TOKENS) for n in (tokens_per_phase * len(phases), unique,
                                                          sum(p.active_blocks * L for p in phases) * tokens_per_phase)),
               flops_text(flops), hours_text(suite_seconds([run], costs, lockstep=False) * gpus * nodes / 3600)]
        rows.append(row)
        table.add_row(*row)
    console.print(table)
    return rows, total


def way_totals(ws, runs, seeds, teacher, costs: dict[str, dict[int, PhaseCost]], plain: dict[str, dict[int, PhaseCost]],
               measured, gpu: str, gpus: int, nodes: int, lockstep: bool) -> dict:
    """One way's GPU-hours by line (each line's name, printed, says what it counts: rank imbalance stretches each step
    by 1 / balance, micro-batches placed as run.balance_lengths says; evaluations at the assumed MFU), then its wall
    hours on the launch, its per-GPU memory (lockstep: every segment's) and teacher passes."""
    preset, world = ws.preset, gpus * nodes
    steps = suite_seconds(runs, costs, lockstep) * len(seeds) * world / 3600
    balance = {way: balance_factor(preset, teacher, world, way == "balanced", preset.run["seed"], measured)
               for way in ("balanced", "unbalanced")}
    used = "balanced" if preset.run.get("balance_lengths") else "unbalanced"
    # the validation documents' lengths (inputs a document): the shard's own once prepared, else drawn as
    # document_lengths draws a step's (from the training shard's lengths, or lognormal)
    val = ws.data_dir / "val"
    val_lengths = data.Shard(val, verify=False).lengths - 1 if (val / "manifest.json").is_file() else \
        document_lengths(preset, preset.data["val_docs"], preset.run["seed"], measured).astype(np.int64)
    eval_flops = sum(evaluation_flops(r, preset, teacher, val_lengths, world) for r in runs)
    written = sum(checkpoint_bytes(r, preset, teacher) for r in runs)
    lines = {"steps (each the longer of its compute and communication)": steps,
             "  of which activation-checkpointing recompute (where compute is the longer)":
             steps - suite_seconds(runs, plain, lockstep) * len(seeds) * world / 3600,
             f"rank imbalance (packed micro-batches, balance {balance[used]:.2f} as the preset places them; "
             f"{balance['balanced']:.2f} by tokens, {balance['unbalanced']:.2f} in order)":
             steps * (1 / balance[used] - 1),
             "evaluations (packed, placed by length over the ranks, waits included)":
             eval_flops / (GPU_BF16_PEAK[gpu] * ASSUMED_MFU) / 3600 * len(seeds),
             f"checkpoint writes ({written / 1e12:,.1f} TB; blocking: the copy to host memory at "
             f"{HOST_COPY_BYTES_PER_S / 1e9:g} GB/s a GPU, and the writes at {CHECKPOINT_WRITE_BYTES_PER_S / 1e9:g} "
             "GB/s a node where they outlast the steps)": checkpoint_blocking(written, steps, len(seeds), gpus, nodes)}
    gpu_hours = sum(v for k, v in lines.items() if not k.startswith("  of which"))
    memory_segments = lockstep_plan.segment_memory(preset, runs, gpus, nodes) if lockstep else []
    # apart: a run in grow's last phase (memory.step_peak), of the costliest placement among the runs
    apart = max((memory.step_peak(preset, teacher, gpus, nodes, 1, norms=[r.config.norm])["total"] for r in runs),
                default=0.0)
    peak = max((s["bytes"] for s in memory_segments), default=apart)
    return {"gpu_hours": gpu_hours, "wall_hours": gpu_hours / world, "hours_lines": lines,
            "balance": balance, "memory_gib": peak / 2**30,
            "memory_segments": [{**s, "gib": s.pop("bytes") / 2**30} for s in memory_segments],
            "resident_runs": lockstep_plan.most_resident(runs) if lockstep else 1,
            "teacher_passes": lockstep_plan.teacher_passes(runs, lockstep) * len(seeds)}


def print_diagnostics(console, preset, runs, seeds, teacher, context: float, gpu: str, totals: dict):
    """The diagnostics' forward FLOPs and checkpoints loaded over the seeds (into `totals`): the boundary
    statistics at every kept checkpoint of the grow runs (phase ends and snapshots) and whole-block removal
    (a full pass and one per skipped block) at the end of every main run, all on the fixed diagnostic batch."""
    tokens = preset.diag["docs"] * preset.diag["max_inputs"]
    L, K = preset.run["layers_per_block"], preset.run["blocks"]
    _, head = forward_flops_per_token(teacher, 0, context)
    flops, loads = 0.0, 0
    for run in runs:
        if run.config.protocol == "grow":
            snapshot = run.config.snapshot_interval or run.config.phase_steps
            for ph in config.plan_phases(run.config):
                layers, _ = forward_flops_per_token(teacher, ph.active_blocks * L, context)
                flops += tokens * layers * -(-ph.steps // snapshot)
                loads += -(-ph.steps // snapshot)
        if run.config.protocol in ("grow", "joint"):
            layers, _ = forward_flops_per_token(teacher, K * L, context)
            flops += tokens * (layers + head) * (K + 1)
            loads += 1
    diag_flops, loads = flops * len(seeds), loads * len(seeds)
    read = loads * student_bytes(preset, teacher)
    seconds = diag_flops / (GPU_BF16_PEAK[gpu] * ASSUMED_MFU)  # the diagnostics: rank 0, no collectives
    console.print(f"diagnostics (rank 0 alone, after training, one checkpoint at a time in bf16): "
                  f"{flops_text(diag_flops)} ({duration_text(seconds)} on one {gpu}), plus "
                  f"reading {loads} checkpoints ({read / 1e9:,.3g} GB: {duration_text(read / DISK_BYTES_PER_S)} at "
                  f"{DISK_BYTES_PER_S / 1e9:g} GB/s)")
    totals.update(diagnostics_flops=diag_flops, diagnostics_checkpoints=loads)


# Where the hours go besides the steps' compute and communication

def document_lengths(preset, n: int, seed: int, measured=None) -> np.ndarray:
    """`n` document lengths (tokens): drawn from the shard's own (`measured`), or, before the data exists,
    lognormal with the preset's mean and DOC_LENGTH_SIGMA, cut at data.max_len."""
    rng = np.random.default_rng(seed)
    if measured is not None:
        return np.minimum(rng.choice(measured, n), preset.data["max_len"])
    mu = math.log(preset.doc_tokens) - DOC_LENGTH_SIGMA**2 / 2
    return np.minimum(rng.lognormal(mu, DOC_LENGTH_SIGMA, n).round().clip(1), preset.data["max_len"])


def balance_factor(preset, teacher: ModelConfig, world: int, balanced: bool, seed: int,
                   measured=None) -> float:
    """Useful over total work of the ranks over BALANCE_STEPS simulated steps. Every FSDP2 unit's
    all-gather makes the ranks wait for each other, so the ranks' j-th micro-batches take as long as the
    costliest of them; a packed micro-batch costs the sum of its documents' costs (no padding), a document's
    its tokens times flops.forward_flops_per_token at half its length. The placement is the kit's own: each
    rank's documents in the order drawn (data.rank_micro_batches), or (balanced) micro-batches made and dealt
    to the ranks by tokens (data.token_micro_batches, micro_batch x max_len tokens each)."""
    per_step, micro = preset.run["global_batch"], preset.run["micro_batch"]
    lengths = document_lengths(preset, BALANCE_STEPS * per_step, seed, measured).astype(np.int64)
    layers = preset.run["blocks"] * preset.run["layers_per_block"]
    cost = {n: n * sum(forward_flops_per_token(teacher, layers, n / 2)) for n in np.unique(lengths)}
    place = partial(data.token_micro_batches, budget=micro * preset.data["max_len"],
                    cost=partial(document_cost, teacher, layers)) if balanced else \
        partial(data.rank_micro_batches, micro_batch=micro)
    useful = waited = 0.0
    for step in range(BALANCE_STEPS):
        ids = np.arange(step * per_step, (step + 1) * per_step)
        slots = [[sum(cost[lengths[i]] for i in docs) for docs in
                  place(ids, lengths[ids], rank=rank, world_size=world)] for rank in range(world)]
        useful += sum(cost[n] for n in lengths[ids])
        waited += world * sum(max(column) for column in zip(*slots))
    return useful / waited


def evaluation_flops(run: PlannedRun, preset, teacher: ModelConfig, lengths: np.ndarray, world: int) -> float:
    """FLOPs of a run's evaluations as the GPUs spend them, waiting included: one at each phase's start
    and every eval_interval steps (grow.Run), each the whole validation set (`lengths`) through the
    teacher (not kept under FSDP2) and the active student, placed on the `world` ranks as the kit places
    it (data.eval_placement): every rank takes as long as the step's costliest batch (FSDP2's
    all-gathers make the ranks wait), a packed batch as the sum of its documents."""
    c, L = run.config, preset.run["layers_per_block"]
    steps = [[lengths[docs] for docs in step if docs] for step in data.eval_placement(lengths, c.eval_batch, world)]
    flops = 0.0
    for ph in config.plan_phases(c)[run.shared_phases:]:
        per_document = {n: document_flops(teacher, ph.active_blocks * L, n) for n in np.unique(lengths)}
        one_pass = sum(world * max(sum(per_document[n] for n in batch) for batch in step) for step in steps)
        evaluations = 1 + ph.steps // c.eval_interval + (ph.steps % c.eval_interval != 0)
        flops += evaluations * one_pass
    return flops


def document_flops(teacher: ModelConfig, student_layers: int, n: int) -> float:
    """A forward of n tokens through the teacher and a student of `student_layers`, with both heads:
    n times flops.forward_flops_per_token at half its length."""
    t_layers, head = forward_flops_per_token(teacher, teacher.num_hidden_layers, n / 2)
    s_layers, _ = forward_flops_per_token(teacher, student_layers, n / 2)
    return n * (t_layers + s_layers + 2 * head)


def checkpoint_bytes(run: PlannedRun, preset, teacher: ModelConfig) -> float:
    """Bytes a run writes: latest/ (fp32 weights and AdamW's two moments of the trained parameters) every
    checkpoint_interval steps, a kept checkpoint (fp32 weights) at each phase end and every
    snapshot_interval steps (rundir.py)."""
    c = run.config
    weights = student_bytes(preset, teacher)
    written = 0.0
    for ph in config.plan_phases(c)[run.shared_phases:]:
        trained = len(ph.trainable_blocks) * preset.run["layers_per_block"] * memory.layer_parameters(teacher) \
            + (teacher.vocab_size * teacher.hidden_size + teacher.hidden_size) * ph.trains_head
        latest = ph.steps // c.checkpoint_interval
        kept = 1 + (ph.steps - 1) // c.snapshot_interval if c.snapshot_interval else 1
        written += latest * (weights + 2 * 4 * trained) + kept * weights
    return written


def checkpoint_blocking(written: float, step_gpu_hours: float, seeds: int, gpus: int, nodes: int) -> float:
    """GPU-hours the checkpoints stop training: every GPU waits while each of one node's ranks (those that hold
    distinct shards) copies its 1/gpus of each checkpoint to host memory; the files are then written on a writer
    thread while the steps go on, so only write time beyond the steps' wall time blocks (in total: each write is
    assumed to end before the next save, which waits for it)."""
    world = gpus * nodes
    copy_hours = written / gpus / HOST_COPY_BYTES_PER_S / 3600 * seeds
    write_hours = written / (CHECKPOINT_WRITE_BYTES_PER_S * nodes) / 3600 * seeds
    return (copy_hours + max(0.0, write_hours - step_gpu_hours / world)) * world


def flops_text(flops: float) -> str:
    units = (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))
    unit, size = next(((u, x) for u, x in units if flops >= x), ("", 1))
    return f"{flops / size:,.2f} {unit}FLOPs"


def hours_text(hours: float) -> str:
    return f"{hours:,.1f}" if hours >= 0.1 else f"{hours:.2g}"


def duration_text(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"


def print_groups(groups: list[tuple[str, suite.Workspace, list[PlannedRun]]], seeds: list[int], gpu: str, gpus: int,
                 nodes: int, console: Console) -> float:
    """A command's runs in several workspaces (a study's variants, e.g. the interventions'): a row per group
    from print_plan's totals, then the sum on this CPU and on `gpu`. Returns the FLOPs (lockstep, diagnostics
    included)."""
    table = Table(*(Column(column, justify="right") for column in ("runs of", "runs", "steps", "FLOPs", f"{gpu} GPU-h")),
                  title=f"plan: {len(seeds)} seed(s); students only (the scale's teacher and data are made once, shared)")
    flops = gpu_hours = 0.0
    for label, ws, runs in groups:
        totals = print_plan(ws, runs, seeds, gpu, gpus, Console(file=io.StringIO()), nodes)  # its totals, unprinted
        group_flops = totals["lockstep"]["flops"] + totals["diagnostics_flops"]
        flops += group_flops
        gpu_hours += totals["lockstep"]["gpu_hours"]
        steps = sum(len(lockstep_plan.own_steps(r)) for r in runs) * len(seeds)
        table.add_row(label, ", ".join(r.name for r in runs), f"{steps:,}", flops_text(group_flops),
                      hours_text(totals["lockstep"]["gpu_hours"]))
    console.print(table)
    console.print(f"in all: {flops_text(flops)}; {hours_text(gpu_hours)} {gpu} GPU-hours on {nodes} x {gpus} GPU(s)")
    return flops
