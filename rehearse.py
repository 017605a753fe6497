"""The full-size rehearsal: one training step of a scale at its real size, on a CPU, with no GPU.

    python repro.py rehearse --scale full --gpus 8             # one 8-GPU node
    python repro.py rehearse --scale full --gpus 8 --nodes 4   # HSDP: shard within a node, replicate across
    python repro.py rehearse --scale small --gpus 1

A fake process group of the launch's world size, fake tensors (no memory, no arithmetic) and the kit's
own construction and sharding code (model.py, devices.shard_fn, grow's teacher, student, loss and
optimizer, not a copy) run what rank 0 of the launch would: the teacher's forward and the student's
forward and backward (activation checkpointing as the preset says) on a micro-batch of the longest
document and on one of a typical length, gradients reduce-scattered after the last, the AdamW step and
an evaluation forward, with the lockstep's other resident students' weights and moments held beside.
It reports per-rank peak memory by category (torch's FSDPMemTracker), whether any module stays gathered
after its forward, every collective of a step with its bytes, the operators a step dispatches, and the
step's communication time at the stated bandwidths against its compute at the stated MFU and against
the host's floor: every operator a GPU runs is a kernel the host dispatches and launches one after
another, which a small model's step cannot go below whatever its FLOPs (the floor is the count times
the time this host takes to dispatch one operator on a one-element tensor, measured; a GPU adds its
launch on top, so it is a lower bound). results/rehearse-<scale>.json holds it all.

What it cannot see: the CUDA context and NCCL's buffers (~1-3 GiB a GPU), the allocator's fragmentation,
kernels a GPU picks that a CPU does not (SDPA's flash path is the CPU's too; a GPU's fused kernels can
save less), and overlap: communication time is bytes over bandwidth, not a trace.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

import checkpoint
import config
import data
import devices
import experiments
import grow
import kd
import model
import plan
import presets

GiB = 2**30


@dataclass
class Launch:
    gpus: int    # per node
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.gpus * self.nodes


# ----------------------------------------------------------------------------------------------
# Counting collectives: the c10d ops FSDP2 issues, their bytes (this rank's buffers) and group sizes

class CollectiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Every all-gather, reduce-scatter and all-reduce dispatched, with the bytes of this rank's buffer
    (an all-gather's output, a reduce-scatter's input, an all-reduce's tensors) and its group's size."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int, int]] = []  # (kind, group size, bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):  # DTensor's own dispatch comes first
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        c10d, name = torch.ops.c10d, func._overloadpacket
        size = lambda ts: sum(t.numel() * t.element_size() for t in (ts if isinstance(ts, (list, tuple)) else [ts]))
        group = lambda g: dist.ProcessGroup.unbox(g).size()
        if name in (c10d._allgather_base_, c10d.allgather_into_tensor_coalesced_):
            self.calls.append(("all-gather", group(args[2]), size(args[0])))
        elif name in (c10d._reduce_scatter_base_, c10d.reduce_scatter_tensor_coalesced_):
            self.calls.append(("reduce-scatter", group(args[2]), size(args[1])))
        elif name is c10d.allreduce_:
            self.calls.append(("all-reduce", group(args[1]), size(args[0])))
        return out


# Aliasing ops that are not marked as views (`func.is_view`): they launch no kernel either
ALIASING = {torch.ops.aten.detach, torch.ops.aten.alias, torch.ops.aten.lift_fresh, torch.ops.aten._unsafe_view}


class DispatchedOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the operators dispatched that compute something (views, other aliasing ops and metadata
    queries excluded: they launch no kernel, and fake tensors answer `prim.device` queries a real run
    never dispatches); `count` runs on across the mode's uses, so a caller reads differences."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):  # DTensor runs its local ops, which come back here
            return NotImplemented
        self.count += func.namespace != "prim" and not func.is_view and func._overloadpacket not in ALIASING
        return func(*args, **(kwargs or {}))


def host_seconds_per_op(repeats: int = 20_000) -> float:
    """This host's time to dispatch one operator on a one-element tensor: what each kernel of a step costs
    the CPU that drives a GPU before the launch itself (the best of five rounds)."""
    x = torch.zeros(1)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            x.add_(1.0)
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def summarize_calls(calls: list[tuple[str, int, int]]) -> dict:
    """{"<kind> over <n> ranks": {"count", "gib"}}."""
    out: dict = {}
    for kind, ranks, nbytes in calls:
        entry = out.setdefault(f"{kind} over {ranks} ranks", {"count": 0, "gib": 0.0})
        entry["count"] += 1
        entry["gib"] += nbytes / GiB
    return out


# ----------------------------------------------------------------------------------------------
# Memory

def local_bytes(tensors) -> int:
    """Bytes a rank holds for these tensors (a DTensor's own shard)."""
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors)


def gathered(net) -> list[str]:
    """The FSDP2 units of `net` whose parameters are gathered (unsharded) right now."""
    from torch.distributed.fsdp import FSDPModule
    names = []
    for name, module in net.named_modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None and group.is_unsharded:
                names.append(name or "root")
    return names


@contextmanager
def as_on_a_gpu():
    """What a CPU must be told to rehearse a GPU: DTensor's sharding propagation gets a fake mode of its
    own (else FSDPMemTracker counts its global-shape temporaries as this rank's memory); the chunked
    loss works in the GPU's row blocks (kd.ROW_BLOCK_ELEMENTS), whose temporaries are what a GPU holds;
    and MemTracker (one GPU, no FSDP) skips the gradient hooks it would put on frozen weights (the
    teacher's, the student's embedding), which torch refuses."""
    import torch.distributed.tensor._sharding_prop as sharding_prop
    detect, blocks = sharding_prop.detect_fake_mode, kd.ROW_BLOCK_ELEMENTS["cpu"]
    hooks = {name: getattr(torch.Tensor, name) for name in ("register_hook", "register_post_accumulate_grad_hook")}
    sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    kd.ROW_BLOCK_ELEMENTS["cpu"] = kd.ROW_BLOCK_ELEMENTS["cuda"]
    for name, register in hooks.items():
        setattr(torch.Tensor, name, lambda t, hook, register=register: register(t, hook) if t.requires_grad
                else _NoHandle())
    try:
        yield
    finally:
        sharding_prop.detect_fake_mode, kd.ROW_BLOCK_ELEMENTS["cpu"] = detect, blocks
        for name, register in hooks.items():
            setattr(torch.Tensor, name, register)


class _NoHandle:
    def remove(self):
        pass


def fake_process_group(world: int):
    """A process group of `world` ranks in this one process (torch's fake backend: collectives return at once)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


# ----------------------------------------------------------------------------------------------
# The rehearsal

class CudaPeak:
    """The GPU's own allocator statistics, where the rehearsal runs on a real GPU (make gpu-check)."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc):
        return False

    def reset_mod_stats(self):
        pass

    def get_tracker_snapshot(self, kind: str) -> dict:
        return {self.device: {"Total": torch.cuda.max_memory_allocated(self.device),
                              "Reserved": torch.cuda.max_memory_reserved(self.device)}}


def rehearse(ws, launch: Launch, resident: int | None = None, replicate_teacher: bool = False,
             device: str = "cpu") -> dict:
    """One step of `ws`'s scale on `launch`'s GPUs, as rank 0 runs it: with fake tensors on this CPU, or
    (device "cuda", make gpu-check) with real ones on one GPU, the other ranks still a fake group.
    resident: students held at once (default: the lockstep's most, plan.most_resident; 1: runs apart);
    replicate_teacher: the teacher whole on every GPU instead of sharded."""
    from contextlib import nullcontext

    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.tensor.debug import CommDebugMode
    started = time.time()
    host_s_per_op = host_seconds_per_op()  # before any fake mode: real tensors
    preset = ws.preset
    on_gpu = device == "cuda"
    ctx = devices.Dist(device=torch.device(device))
    if launch.world > 1:
        fake_process_group(launch.world)
        ctx = devices.Dist(0, launch.world, torch.device(device), launch.gpus,
                           devices.mesh_for(device, launch.world, launch.gpus))
    dtype = devices.DTYPES.get(preset.run["precision"], torch.bfloat16)  # a GPU's precision (auto: bf16)
    runs = plan.planned_runs(ws, experiments.RUNS, preset.run["seed"])
    resident = resident or plan.most_resident(runs)
    settings = config.RunConfig(**{**preset.run, "name": "rehearsal", "protocol": "grow", "norm": "post",
                                   "train_data": "", "val_data": "", "replay_docs": 1})
    phase = config.plan_phases(settings)[-1]  # every block active and trained: the step's peak
    data.check_split(preset.run["global_batch"], launch.world, preset.run["micro_batch"])
    micro_per_step = preset.run["global_batch"] // launch.world // preset.run["micro_batch"]
    # The worst step a rank can be given: documents of the full length in every micro-batch (the first
    # holds the loss with no gradients yet, the last on top of the accumulated ones; between them the
    # same again). Two of them measure both; the collectives of the others equal the first's.
    lengths = [preset.data["max_len"]] * min(2, micro_per_step)
    with unset_fake_temporarily():  # real token ids; no padding (mask None): one document a micro-batch
        batches = [data.Batch(torch.zeros(preset.run["micro_batch"], n, dtype=torch.long, device=device),
                              torch.zeros(preset.run["micro_batch"], n, dtype=torch.long, device=device), None,
                              torch.full((preset.run["micro_batch"],), n), [0], n * preset.run["micro_batch"])
                   for n in lengths]
    out = {"scale": preset.name, "gpus": launch.gpus, "nodes": launch.nodes, "world": launch.world,
           "precision": str(dtype).removeprefix("torch."), "micro_batches_per_step": micro_per_step,
           "micro_batch_lengths": lengths, "resident_students": resident, "teacher_replicated": replicate_teacher,
           "activation_checkpointing": preset.run.get("activation_checkpointing", False)}
    with (nullcontext() if on_gpu else as_on_a_gpu()), \
            (nullcontext() if on_gpu else FakeTensorMode(allow_non_fake_inputs=True)):
        shape = presets.teacher_shape(preset)
        sharding = None if replicate_teacher else devices.shard_fn(ctx, dtype, grow.TEACHER_REPLICATED)
        net = model.qwen3_on_meta(shape, sharding)
        with unset_fake_temporarily():
            net.to(dtype)
        net.to_empty(device=device)
        teacher = grow.Teacher(net.eval().requires_grad_(False))
        students, optimizers = [], []
        for _ in range(resident):
            student = model.Student.from_teacher(net, preset.run["blocks"], preset.run["layers_per_block"], "post",
                                                 preset.run["seed"], shard_fn=devices.shard_fn(ctx, dtype))
            student.checkpoint_layers = bool(preset.run.get("activation_checkpointing"))
            optimizer = grow.build_optimizer(settings, grow.trainable_parameters(student, phase))
            for group in optimizer.param_groups:  # AdamW's moments as they are after the first step
                for p in group["params"]:
                    optimizer.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p),
                                          "exp_avg_sq": torch.zeros_like(p)}
            students.append(student)
            optimizers.append(optimizer)
        student, optimizer = students[0], optimizers[0]
        out["student_parameters"] = sum(p.numel() for p in student.parameters())
        out["student_trainable_parameters"] = sum(p.numel() for p in grow.trainable_parameters(student, phase))
        out["teacher_parameters"] = sum(p.numel() for p in net.parameters())
        # Held besides what the tracker sees: the other students. (The teacher's weights are in the
        # tracker's Total already: its dispatch mode registers them when an op first returns a view of
        # them, as FSDP2's all-gathers and the loss's .detach() of the head do.)
        teacher_gib = local_bytes(net.parameters()) / GiB
        resident_gib = {
            "other students' weights": sum(local_bytes(s.parameters()) for s in students[1:]) / GiB,
            "other students' AdamW moments": sum(local_bytes(v for st in o.state.values() for v in st.values())
                                                 for o in optimizers[1:]) / GiB}
        tracker = CudaPeak(ctx.device) if on_gpu else FSDPMemTracker(student, optimizer) if launch.world > 1 \
            else MemTracker()
        if launch.world == 1 and not on_gpu:
            tracker.track_external(student, optimizer)
        calls, left_gathered, ops, teacher_ops, student_ops = [], {}, DispatchedOps(), [], []
        with tracker:
            for i, batch in enumerate(batches):
                tracker.reset_mod_stats()  # a fresh forward (the trackers take one at a time)
                count, collectives = CommDebugMode(), CollectiveBytes()
                with count, collectives, ops:
                    start = ops.count
                    with grow.autocast(dtype, ctx):
                        hidden = teacher.hidden(batch.input_ids)
                        teacher_ops.append(ops.count - start)
                        left_gathered["teacher"] = gathered(teacher.net)
                        if hasattr(student, "set_requires_gradient_sync"):
                            student.set_requires_gradient_sync(i == len(batches) - 1)
                        loss, _, _ = grow.loss_fn(settings, batch, hidden, teacher.head_weight, phase,
                                                  batch.n_targets * preset.run["global_batch"], student)
                    (loss * ctx.world).backward()
                calls.append(collectives.calls)
                student_ops.append(ops.count - start - teacher_ops[-1])
            count, collectives = CommDebugMode(), CollectiveBytes()
            start = ops.count
            with count, collectives, ops:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            calls.append(collectives.calls)
            optimizer_ops = ops.count - start
            tracker.reset_mod_stats()
            count, collectives = CommDebugMode(), CollectiveBytes()
            with count, collectives, torch.no_grad(), grow.autocast(dtype, ctx):  # an evaluation forward
                student(batches[0].input_ids, active_blocks=phase.active_blocks, output_fn=grow.hidden_only)
                evaluation_calls = collectives.calls
                if hasattr(student, "reshard"):
                    student.reshard()
            left_gathered["student after evaluation"] = gathered(student)
        peak = {getattr(k, "value", k): v / GiB for k, v in next(iter(tracker.get_tracker_snapshot("peak").values())).items()
                if v}
    # A step: the measured non-final micro-batch's collectives for each of the step's first n - 1, the
    # last one's (with the reduce-scatters), then the optimizer's.
    first, last, optimizer_calls = calls[0], calls[-2], calls[-1]
    step_calls = first * (micro_per_step - 1) + last + optimizer_calls if len(batches) > 1 else last + optimizer_calls
    per_step = lambda counts: counts[0] * (micro_per_step - 1) + counts[-1]  # the same for operator counts
    step_ops = {"teacher forward": per_step(teacher_ops),
                "a student's forward, backward and AdamW step": per_step(student_ops) + optimizer_ops}
    step_ops["a step of every resident student, one teacher forward"] = \
        step_ops["teacher forward"] + resident * step_ops["a student's forward, backward and AdamW step"]
    tokens = preset.run["global_batch"] * min(preset.doc_tokens, preset.data["max_len"])
    flops = plan.step_flops(preset, shape, tokens) / launch.world
    compute_s = flops / (plan.GPU_BF16_PEAK["h100"] * plan.ASSUMED_MFU)
    out.update(
        # on a GPU the allocator's peak already holds what was resident before the step
        peak_gib={**peak, "of which teacher weights": teacher_gib, **resident_gib,
                  "per-rank peak": peak.get("Total", 0.0) + (0.0 if on_gpu else sum(resident_gib.values()))},
        left_gathered=left_gathered, collectives_per_step=summarize_calls(step_calls),
        collectives_per_evaluation_batch=summarize_calls(evaluation_calls),
        comm_s_per_step=plan.comm_seconds(step_calls, launch.nodes), compute_s_per_step=compute_s,
        ops_per_step=step_ops, host_s_per_op=host_s_per_op,
        host_floor_s_per_step=step_ops["a step of every resident student, one teacher forward"] * host_s_per_op,
        step_s=max(compute_s, plan.comm_seconds(step_calls, launch.nodes)),
        assumptions={"mfu": plan.ASSUMED_MFU, "gpu": "h100", "nvlink_bytes_per_s": plan.NVLINK_BYTES_PER_S,
                     "infiniband_bytes_per_s": plan.INFINIBAND_BYTES_PER_S, "tokens_per_step": tokens,
                     "overlap": "communication overlaps compute (FSDP2's prefetch): a step takes the longer"},
        wall_s=time.time() - started)
    if dist.is_initialized():
        dist.destroy_process_group()
    return out


def write(runs: dict, results: Path) -> Path:
    """results/rehearse-<scale>[-<nodes>x<gpus>].json: {"apart": rehearse(..), "lockstep": rehearse(..)}."""
    out = runs["lockstep"]
    nodes = "" if out["nodes"] == 1 else f"-{out['nodes']}x{out['gpus']}"
    path = results / f"rehearse-{out['scale']}{nodes}{'-replicated-teacher' if out['teacher_replicated'] else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return checkpoint.write_json(path, runs)


def markdown(out: dict) -> list[str]:
    lines = [f"Rehearsal of `{out['scale']}` on {out['nodes']} x {out['gpus']} GPUs ({out['precision']}, "
             f"{out['micro_batches_per_step']} micro-batches a rank a step, of "
             f"{' and '.join(map(str, out['micro_batch_lengths']))} tokens run; {out['resident_students']} students "
             "resident): per-rank peak "
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
