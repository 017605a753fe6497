"""The rehearsal: a launch of the suite, on a CPU, with no GPU, two ways (this file: the first).

    python repro.py rehearse table1 --scale full --gpus 8             # one 8-GPU node
    python repro.py rehearse all --scale full --gpus 8 --nodes 4      # HSDP: shard within a node, replicate across
    python repro.py rehearse --scale small --gpus 1 --mode fake

Fake tensors at full size (rehearse_segments, rehearse): for every lockstep segment one step as
grow.lockstep_step takes it (lockstep_run_step), what rank 0 of the launch runs on a fake process group of its
world size and mesh, through the kit's own construction and sharding (model.py, devices.shard_fn, grow's teacher,
student, loss, gradient sync, clipping and optimizer, not a copy), on the worst step a rank of the launch can be
given (worst_step). It reports per-rank peak memory by category (torch's FSDPMemTracker) beside memory.py's count,
whether any module stays gathered, every collective of a step with its bytes, the operators a step dispatches,
and communication time at the stated bandwidths against compute at the stated MFU and against the host's floor
(operators times this host's dispatch time for one, measured: a lower bound).

Real tensors at reduced size: rehearse_real.py, the launch's own driver on every rank of its mesh.

What it cannot see: the CUDA context and NCCL's buffers (~1-3 GiB a GPU), the allocator's fragmentation,
kernels a GPU picks that a CPU does not (SDPA's flash path is the CPU's too; a GPU's fused kernels can
save less), and overlap: communication time is bytes over bandwidth, not a trace.
"""
import contextlib
import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

import data
import grow
import kd
import model
import nets
from experiments import presets
from plumbing import checkpoint, devices
from tools import lockstep_plan, memory, plan, utilization
from tools.dispatch_counts import CollectiveBytes, DispatchedOps, host_seconds_per_op

GiB = 2**30


@dataclass
class Launch:
    gpus: int    # per node
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.gpus * self.nodes


# What a step dispatches, summarized (tools/dispatch_counts.py counts it)

def summarize_calls(calls: list[tuple[str, int, int]]) -> dict:
    """{"<kind> over <n> ranks": {"count", "gib"}}."""
    out: dict = {}
    for kind, ranks, nbytes in calls:
        entry = out.setdefault(f"{kind} over {ranks} ranks", {"count": 0, "gib": 0.0})
        entry["count"] += 1
        entry["gib"] += nbytes / GiB
    return out


# Memory

def local_bytes(tensors) -> int:
    """Bytes a rank holds for these tensors (a DTensor's own shard)."""
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors)


def gathered(net) -> list[str]:
    """The FSDP2 units of `net` whose parameters are gathered (unsharded) right now."""
    from torch.distributed.fsdp import FSDPModule
    groups = [(name, module._get_fsdp_state()._fsdp_param_group) for name, module in net.named_modules()
              if isinstance(module, FSDPModule)]
    return [name or "root" for name, group in groups if group is not None and group.is_unsharded]


@contextmanager
def as_on_a_gpu():
    """What a CPU must be told to rehearse a GPU: DTensor's sharding propagation gets a fake mode of its
    own (else FSDPMemTracker counts its global-shape temporaries as this rank's memory); the chunked
    loss works in the GPU's row blocks (kd.ROW_BLOCK_ELEMENTS), whose temporaries are what a GPU holds;
    MemTracker (one GPU, no FSDP) skips the gradient hooks it would put on frozen weights (the
    teacher's, the student's embedding), which torch refuses; a fake boolean vector's nonzero, whose
    size a fake tensor cannot know, is every position: the step's one such call is kd._real_tokens' on
    the batch's mask, all True in the worst step (every target real), so the loss selects and copies its
    states as a launch's does; and a packed row's attention takes model.Attention.document_attention's
    CUDA branch (varlen_attn, whose fake kernel runs here and gives a GPU's layout: the CPU's branch
    concatenates its documents' outputs, a copy a GPU never makes), varlen_attn refused where a GPU's flash kernel
    would refuse it: q, k and v not of one 16-bit dtype (what a launch would hit, the rehearsal hits first)."""
    import torch.distributed.tensor._sharding_prop as sharding_prop
    detect, blocks = sharding_prop.detect_fake_mode, kd.ROW_BLOCK_ELEMENTS["cpu"]
    kept = {name: getattr(torch.Tensor, name)
            for name in ("register_hook", "register_post_accumulate_grad_hook", "nonzero")}
    sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    kd.ROW_BLOCK_ELEMENTS["cpu"] = kd.ROW_BLOCK_ELEMENTS["cuda"]
    for name in ("register_hook", "register_post_accumulate_grad_hook"):  # a frozen weight's handle: nothing to remove
        setattr(torch.Tensor, name, lambda t, hook, register=kept[name]: register(t, hook) if t.requires_grad
                else SimpleNamespace(remove=lambda: None))
    torch.Tensor.nonzero = lambda t, *args, **kwargs: torch.arange(t.numel(), device=t.device)[:, None] \
        if isinstance(t, FakeTensor) and t.dtype == torch.bool and t.dim() == 1 else kept["nonzero"](t, *args, **kwargs)
    document_attention, varlen_attn = model.Attention.document_attention, model.varlen_attn

    def flash_on_a_gpu(q, k, v, *args, **kwargs):
        if len({q.dtype, k.dtype, v.dtype}) > 1 or q.dtype not in (torch.bfloat16, torch.float16):
            raise RuntimeError(f"on a GPU, model.Attention.document_attention gives varlen_attn q {q.dtype}, k {k.dtype}"
                               f" and v {v.dtype}; its flash kernel takes one 16-bit dtype, so a launch in this "
                               "precision would stop at its first packed micro-batch")
        return varlen_attn(q, k, v, *args, **kwargs)

    def on_a_gpu(attention, q, k, v):
        FakeTensor.is_cuda = property(lambda t: True)  # read only by the branch, and only while it runs
        try:
            return document_attention(attention, q, k, v)
        finally:
            del FakeTensor.is_cuda
    model.Attention.document_attention = on_a_gpu
    if varlen_attn is not None:
        model.varlen_attn = flash_on_a_gpu
    try:
        yield
    finally:
        sharding_prop.detect_fake_mode, kd.ROW_BLOCK_ELEMENTS["cpu"] = detect, blocks
        model.Attention.document_attention, model.varlen_attn = document_attention, varlen_attn
        for name, method in kept.items():
            setattr(torch.Tensor, name, method)


# The rehearsal

class CudaPeak(contextlib.AbstractContextManager):
    """The GPU's own allocator statistics, where the rehearsal runs on a real GPU (make gpu-check)."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        # An earlier segment's students, optimizers and FSDP2 modules hold reference cycles: until collected
        # their tensors stay allocated and count in this segment's peak (measured on an H200: grow's phase 2
        # read 51.1 GiB after the other segments, 34.9 alone or after a collection, against the plan's 34.8).
        gc.collect()
        torch.cuda.empty_cache()  # what an earlier rehearsal left cached is not this one's
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc):
        return None  # AbstractContextManager leaves __exit__ abstract: without it the class cannot be made

    def reset_mod_stats(self):
        pass

    def get_tracker_snapshot(self, kind: str) -> dict:
        return {self.device: {"Total": torch.cuda.max_memory_allocated(self.device),
                              "Reserved": torch.cuda.max_memory_reserved(self.device)}}


def rehearse_segments(ws, launch: Launch, names, replicate_teacher: bool = False, device: str = "cpu") -> list[dict]:
    """rehearse() of every lockstep segment of the runs `names` (lockstep_plan.segment_memory): {"steps", "runs",
    "rehearsal", "plan_gib"} each, the plan's per-GPU memory beside the rehearsal's. With fake tensors a
    step is measured once for the segments that step the same phase (blocks run and trained, the head)
    and keep the teacher's states alike: the step's tensors are the same, only the residents beside it
    differ, and those are built and counted for each segment."""
    runs = plan.planned_runs(ws, names, ws.preset.run["seed"])
    measured = {} if device == "cpu" else None  # on a GPU the allocator's peak holds the residents too
    return [{"steps": list(s["steps"]), "runs": s["runs"],
             "rehearsal": rehearse(ws, launch, s["phases"], replicate_teacher, device, measured, s["norms"]),
             "plan_gib": s["bytes"] / GiB}
            for s in lockstep_plan.segment_memory(ws.preset, runs, launch.gpus, launch.nodes, replicate_teacher)]


def rehearse(ws, launch: Launch, residents: list | None = None, replicate_teacher: bool = False,
             device: str = "cpu", measured: dict | None = None, norms: list[str] | None = None) -> dict:
    """One lockstep step of `ws`'s scale on `launch`'s GPUs, as rank 0 runs it: with fake tensors on this
    CPU, or (device "cuda", make gpu-check) with real ones on one GPU, the other ranks still a fake group.
    residents: the phases (config.Phase) of the students held at once, of placements `norms` (default
    post-norm), the costliest stepping (memory.costliest_first; default: one run in grow's last phase, a
    run apart); replicate_teacher: the teacher whole on every GPU; measured: the steps measured so far, by
    what a step's tensors depend on (rehearse_segments)."""
    started, host_s_per_op = time.time(), host_seconds_per_op()  # before any fake mode: real tensors
    preset, on_gpu = ws.preset, device == "cuda"
    settings = memory.run_settings(preset, "rehearsal")
    data.check_split(settings.global_batch, launch.world, settings.micro_batch)
    step_batches = worst_step(settings, preset.data["max_len"], launch.world, device)
    batches, micro_per_step = step_batches[:2], len(step_batches)
    dtype = devices.DTYPES.get(settings.precision, torch.bfloat16)  # a GPU's precision (auto: bf16)
    residents, norms = memory.costliest_first(preset, residents or [memory.last_phase(preset)], norms)
    # the teacher's hidden states of the step's other micro-batches, kept for the other resident runs
    phase, kept_states = residents[0], (micro_per_step - 1) * (len(residents) > 1)
    key = (phase.active_blocks, phase.trainable_blocks, phase.trains_head, norms[0], kept_states)
    reused = measured is not None and key in measured
    ctx = rank0(launch, device)
    with (contextlib.nullcontext() if on_gpu else as_on_a_gpu()), \
            (contextlib.nullcontext() if on_gpu else FakeTensorMode(allow_non_fake_inputs=True)):
        teacher, students, optimizers = resident_models(preset, settings, ctx, dtype, residents, replicate_teacher,
                                                        device, norms)
        step, peak = measured[key] if reused else measure_step(
            settings, phase, teacher, students, optimizers, batches, ctx, dtype, on_gpu, kept_states)
    if measured is not None:
        measured[key] = step, peak
    if dist.is_initialized():
        dist.destroy_process_group()
    out = {"scale": preset.name, "gpus": launch.gpus, "nodes": launch.nodes, "world": launch.world,
           "precision": str(dtype).removeprefix("torch."), "micro_batches_per_step": micro_per_step,
           "micro_batch_tokens": [b.n_targets for b in batches],
           "micro_batch_documents": [list(b.doc_lengths or b.lengths.tolist()) for b in batches],
           "packed": settings.packs, "resident_students": len(residents),
           "stepping_phase": {"active_blocks": phase.active_blocks, "trained_blocks": list(phase.trainable_blocks)},
           "teacher_replicated": replicate_teacher, "activation_checkpointing": settings.activation_checkpointing,
           "student_parameters": sum(p.numel() for p in students[0].parameters()),
           "student_trainable_parameters": sum(p.numel() for p in grow.trainable_parameters(students[0], phase)),
           "teacher_parameters": sum(p.numel() for p in teacher.net.parameters()),
           "left_gathered": step["left_gathered"], "step_measured_for_an_earlier_segment": reused,
           **step_costs(settings, preset, launch, micro_per_step, step, len(residents), host_s_per_op),
           "peak_gib": peak_gib(peak, teacher, students, optimizers, on_gpu)}
    return {**out, "wall_s": time.time() - started}


def measure_step(settings, phase, teacher, students, optimizers, batches, ctx, dtype, on_gpu: bool,
                 kept_states: int) -> tuple[dict, dict]:
    """lockstep_run_step of the stepping student (the first) under the memory tracker: (the step's counts,
    its peak memory by category in GiB, with the teacher's weights the tracker never saw: UNSEEN)."""
    with memory_tracker(students, optimizers, ctx, on_gpu) as tracker:
        step = lockstep_run_step(settings, phase, teacher, students[0], optimizers[0], batches, ctx, dtype,
                                 tracker, kept_states)
    snapshot = next(iter(tracker.get_tracker_snapshot("peak").values()))
    peak = {getattr(k, "value", k): v / GiB for k, v in snapshot.items() if v}
    if not on_gpu:  # the teacher's weights whose storage (a DTensor's: its local shard's) the tracker never counted
        shards = [p.to_local() if hasattr(p, "to_local") else p for p in teacher.net.parameters()]
        peak[UNSEEN] = local_bytes(t for t in shards if t.untyped_storage() not in tracker._WINFO) / GiB
    return step, peak


# Held through the whole step but never an operator's output nor an FSDP2 unit's parameter, so FSDPMemTracker
# never counts them: the teacher's replicated embedding and final norm (nets.TEACHER_REPLICATED; their
# forwards read them as inputs only): 1.16 GiB a rank at full scale, left out of the rehearsal before issue 40.
UNSEEN = "teacher weights the tracker never saw (its replicated embedding and norm)"


def peak_gib(peak: dict, teacher, students, optimizers, on_gpu: bool) -> dict:
    """The step's peak by category, the teacher's weights among it, and what the tracker does not see:
    the other resident students' weights and AdamW moments (built before it, untouched in the step) and
    the teacher's weights no operator produced (UNSEEN); on a GPU the allocator's peak already holds them."""
    others = {"other students' weights": sum(local_bytes(s.parameters()) for s in students[1:]) / GiB,
              "other students' AdamW moments": sum(local_bytes(v for st in o.state.values() for v in st.values())
                                                   for o in optimizers[1:]) / GiB}
    return {**peak, "of which teacher weights": local_bytes(teacher.net.parameters()) / GiB, **others,
            "per-rank peak": peak.get("Total", 0.0) + (0.0 if on_gpu else sum(others.values()) + peak.get(UNSEEN, 0))}


def rank0(launch: Launch, device: str) -> devices.Dist:
    """Rank 0 of the launch: a process group of its world size in this one process (torch's fake backend:
    collectives return at once) and the launch's mesh (1-D over one node; HSDP's 2-D replicate x shard over
    several)."""
    if launch.world == 1:
        return devices.Dist(device=torch.device(device))
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=launch.world)
    return devices.Dist(0, launch.world, torch.device(device), launch.gpus,
                        devices.mesh_for(device, launch.world, launch.gpus))


def worst_step(settings, max_len: int, world: int, device: str) -> list[data.Batch]:
    """Rank 0's micro-batches in the worst step a rank of `world` can be given, made as the launch makes them
    (data.Batcher): every document of the step of the full length (max_len inputs), placed and laid out by data.py
    as the run's settings say, every target real (the mask all True). Each micro-batch then holds a full budget, and
    a rank the most micro-batches the placement gives it (global_batch / world / micro_batch: the placement opens
    more only when each holds micro_batch documents already). How a budget splits into documents changes only
    tensors of a few bytes a document (its lengths and offsets: the attention and RoPE work per token), so whole
    ones of the full length are the worst case. The rehearsal runs the first two (the first holds the loss with no
    gradients yet, the last on top of the accumulated ones; the collectives and operators of those between equal the
    first's)."""
    ids, lengths = np.arange(settings.global_batch), np.full(settings.global_batch, max_len)
    if settings.packs and settings.balance_lengths:
        placed = data.token_micro_batches(ids, lengths, settings.micro_batch * max_len, 0, world)
    else:
        placed = data.rank_micro_batches(ids, lengths, settings.micro_batch, 0, world, settings.balance_lengths)
    document = np.zeros(max_len + 1, dtype=np.int64)
    with unset_fake_temporarily():
        if settings.packs:
            return [data.packed_batch([document] * len(docs), docs).to(device) for docs in placed]
        rows = lambda n, value: torch.full((n, max_len), value, device=device)
        return [data.Batch(rows(len(docs), 0), rows(len(docs), 0), rows(len(docs), True),
                           torch.full((len(docs),), max_len), docs, len(docs) * max_len) for docs in placed]


def resident_models(preset, settings, ctx, dtype, residents: list, replicate_teacher: bool, device: str,
                    norms: list[str] | None = None):
    """(teacher, students, optimizers) as a launch builds them (model.py, devices.shard_fn, grow's
    trainable parameters and optimizer), a student in each phase of `residents` (post-norm, or each of
    `norms`): its AdamW moments as after its phase's first step."""
    sharding = None if replicate_teacher else devices.shard_fn(ctx, dtype, nets.TEACHER_REPLICATED)
    net = model.qwen3_on_meta(presets.teacher_shape(preset), sharding)
    with unset_fake_temporarily():
        net.to(dtype)
    net.to_empty(device=device)
    teacher = nets.Teacher(net.eval().requires_grad_(False))
    students, optimizers = [], []
    for phase, norm in zip(residents, norms or ["post"] * len(residents)):
        student = model.Student.from_teacher(net, settings.blocks, settings.layers_per_block, norm, settings.seed,
                                             shard_fn=devices.shard_fn(ctx, dtype))
        student.checkpoint_layers = settings.activation_checkpointing
        devices.settle_fsdp_dtypes(student)  # as nets.build_model does
        optimizer = grow.build_optimizer(settings, grow.trainable_parameters(student, phase))
        for group in optimizer.param_groups:
            for p in group["params"]:
                optimizer.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}
        students.append(student)
        optimizers.append(optimizer)
    return teacher, students, optimizers


def memory_tracker(students, optimizers, ctx, on_gpu: bool):
    """The allocator's own peak on a GPU; else torch's FSDPMemTracker over the stepping student (one
    process: MemTracker). Neither sees the other resident students' shards and moments (built before
    it, untouched in the step): rehearse() adds their bytes, read from the tensors themselves."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    if on_gpu:
        return CudaPeak(ctx.device)
    if ctx.world > 1:
        class GrownFSDPTracker(FSDPMemTracker):
            """FSDPMemTracker, able to follow a student whose later blocks have not grown in yet: its
            post-backward hook reads every parameter's unsharded gradient, and a unit that never ran forward
            (FSDP2's final callback still calls its post-backward) has no unsharded parameter, so the tracker
            raised AttributeError where the training code does not. Such a unit holds nothing to attribute."""
            def _fsdp_param_group_post_backward(self, fsdp_mod, orig_post_backward):
                tracked = super()._fsdp_param_group_post_backward(fsdp_mod, orig_post_backward)

                def post_backward(*args, **kwargs):
                    group = fsdp_mod._get_fsdp_state()._fsdp_param_group
                    ran = group is None or all(hasattr(p, "_unsharded_param") for p in group.fsdp_params)
                    return (tracked if ran else orig_post_backward)(*args, **kwargs)
                return post_backward
        return GrownFSDPTracker(students[0], optimizers[0])
    tracker = MemTracker()
    tracker.track_external(students[0], optimizers[0])
    return tracker


def lockstep_run_step(settings, phase, teacher, student, optimizer, batches, ctx, dtype, tracker,
                      kept_states: int) -> dict:
    """One run's step as grow.lockstep_step takes it: its micro-batches in turn (gradient sync set by
    devices.set_gradient_sync, on for the last), the teacher's hidden states kept for the step where other
    runs read them (kept_states, those of the micro-batches not run, allocated at their size),
    devices.clip_gradients, the AdamW step, then an evaluation forward; collectives and operators counted."""
    ops, calls, teacher_ops, student_ops, kept = DispatchedOps(), [], [], [], []
    active = phase.active_blocks * settings.layers_per_block
    left = {}
    for i, batch in enumerate(batches):
        tracker.reset_mod_stats()  # a fresh forward (the trackers take one at a time)
        collectives = CollectiveBytes()
        with collectives, ops:
            start = ops.count
            with devices.autocast(dtype, ctx):
                hidden = teacher.hidden(batch.input_ids, doc_lengths=batch.doc_lengths)
                teacher_ops.append(ops.count - start)
                left["teacher"] = gathered(teacher.net)
                if i == 0:  # a run after the group's first: every state already kept
                    kept = [torch.empty_like(hidden) for _ in range(kept_states)]
                if hasattr(student, "set_requires_gradient_sync"):  # as grow.Run.accumulate
                    devices.set_gradient_sync(student, i == len(batches) - 1, active)
                loss, _, _ = nets.loss_fn(settings, batch, hidden, teacher.head_weight, phase,
                                          batch.n_targets * settings.global_batch, student)
            (loss * ctx.world).backward()
        calls.append(collectives.calls)
        student_ops.append(ops.count - start - teacher_ops[-1])
    collectives, start = CollectiveBytes(), ops.count
    with collectives, ops:
        devices.clip_gradients(grow.trainable_parameters(student, phase), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    calls.append(collectives.calls)
    optimizer_ops = ops.count - start
    kept.clear()
    tracker.reset_mod_stats()
    collectives = CollectiveBytes()
    with collectives, torch.no_grad(), devices.autocast(dtype, ctx):  # an evaluation forward
        student(batches[0].input_ids, active_blocks=phase.active_blocks, doc_lengths=batches[0].doc_lengths,
                output_fn=nets.hidden_only)
        if hasattr(student, "reshard"):
            student.reshard()
    left["student after evaluation"] = gathered(student)
    return {"calls": calls, "evaluation_calls": collectives.calls, "teacher_ops": teacher_ops,
            "student_ops": student_ops, "optimizer_ops": optimizer_ops, "left_gathered": left}


def step_costs(settings, preset, launch: Launch, micro_per_step: int, step: dict, resident: int,
               host_s_per_op: float) -> dict:
    """A whole step from the micro-batches run: the first one's collectives and operators for each of the
    step's first n - 1, the last one's (with the reduce-scatters), then the optimizer's; communication
    at the stated bandwidths against compute at the stated MFU and against the host's floor."""
    calls = step["calls"]
    step_calls = calls[0] * (micro_per_step - 1) + calls[-2] + calls[-1]
    per_step = lambda counts: counts[0] * (micro_per_step - 1) + counts[-1]
    ops = {"teacher forward": per_step(step["teacher_ops"]),
           "a student's forward, backward and AdamW step": per_step(step["student_ops"]) + step["optimizer_ops"]}
    ops["a step of every resident student, one teacher forward"] = \
        ops["teacher forward"] + resident * ops["a student's forward, backward and AdamW step"]
    doc_tokens = min(preset.doc_tokens, preset.data["max_len"])
    tokens = settings.global_batch * doc_tokens
    flops = utilization.student_step_flops(presets.teacher_shape(preset), settings.blocks * settings.layers_per_block,
                                           tokens, doc_tokens, settings.activation_checkpointing)
    compute_s = flops / launch.world / (plan.GPU_BF16_PEAK["h100"] * plan.ASSUMED_MFU)
    comm_s = plan.comm_seconds(step_calls, launch.nodes)
    return {"collectives_per_step": summarize_calls(step_calls),
            "collectives_per_evaluation_batch": summarize_calls(step["evaluation_calls"]),
            "comm_s_per_step": comm_s, "compute_s_per_step": compute_s, "step_s": max(compute_s, comm_s),
            "ops_per_step": ops, "host_s_per_op": host_s_per_op,
            "host_floor_s_per_step": ops["a step of every resident student, one teacher forward"] * host_s_per_op,
            "assumptions": {"mfu": plan.ASSUMED_MFU, "gpu": "h100", "nvlink_bytes_per_s": plan.NVLINK_BYTES_PER_S,
                            "infiniband_bytes_per_s": plan.INFINIBAND_BYTES_PER_S, "tokens_per_step": tokens,
                            "overlap": "communication overlaps compute (FSDP2's prefetch): a step takes the longer"}}


def write(out: dict, results: Path, scale: str, launch: Launch, experiments_name: str, replicated: bool) -> Path:
    """results/rehearse-<scale>[-<nodes>x<gpus>]-<experiments>.json: {"apart", "lockstep": rehearse(..),
    "real": rehearse_real.rehearse(..)}, those run."""
    nodes = "" if launch.nodes == 1 else f"-{launch.nodes}x{launch.gpus}"
    path = results / f"rehearse-{scale}{nodes}-{experiments_name}{'-replicated-teacher' if replicated else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return checkpoint.write_json(path, out)


def segments_markdown(apart: dict, segments: list[dict]) -> list[str]:
    """Every lockstep segment's per-rank peak beside the plan's, then the worst segment's step in full."""
    lines = [f"Per-rank peak of every lockstep segment on {apart['nodes']} x {apart['gpus']} GPUs (a run apart: "
             f"{apart['peak_gib']['per-rank peak']:.2f} GiB)", "",
             "| steps | resident runs (phase) | rehearsal GiB | plan GiB |", "| --- | --- | --- | --- |"]
    lines += [f"| {s['steps'][0]:,}-{s['steps'][1]:,} | {', '.join(s['runs'])} | "
              f"{s['rehearsal']['peak_gib']['per-rank peak']:.2f} | {s['plan_gib']:.2f} |" for s in segments]
    worst = max(segments, key=lambda s: s["rehearsal"]["peak_gib"]["per-rank peak"], default=None)
    return lines + ([""] + markdown(worst["rehearsal"]) if worst else [])


def markdown(out: dict) -> list[str]:
    documents = " and ".join(f"{tokens:,} tokens ({'packed' if out['packed'] else 'rows'}: documents of "
                             f"{', '.join(f'{n:,}' for n in docs)})"
                             for tokens, docs in zip(out["micro_batch_tokens"], out["micro_batch_documents"]))
    lines = [f"Rehearsal of `{out['scale']}` on {out['nodes']} x {out['gpus']} GPUs ({out['precision']}, "
             f"{out['micro_batches_per_step']} micro-batches a rank a step, of {documents} run; "
             f"{out['resident_students']} students resident): per-rank peak "
             f"{out['peak_gib']['per-rank peak']:.1f} GiB", "", "| memory (GiB, per rank) | |", "| --- | --- |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in out["peak_gib"].items()]
    lines += ["", "| collectives per step | count | GiB |", "| --- | --- | --- |"]
    lines += [f"| {k} | {v['count']} | {v['gib']:.1f} |" for k, v in out["collectives_per_step"].items()]
    lines += ["", f"left gathered after a forward: {out['left_gathered'] or 'nothing'}; communication "
              f"{out['comm_s_per_step']:.2f} s a step against compute {out['compute_s_per_step']:.2f} s at "
              f"{out['assumptions']['mfu']:.0%} MFU; {out['wall_s']:.0f} s on this machine", "",
              "| operators dispatched per step | count |", "| --- | --- |"]
    lines += [f"| {k} | {v:,} |" for k, v in out["ops_per_step"].items()]
    lines += ["", f"host floor: {out['host_floor_s_per_step'] * 1e3:.1f} ms a step ({out['host_s_per_op'] * 1e6:.2f} µs "
              "to dispatch one operator on this host; a GPU's launch adds to it)"]
    return lines
