"""An independent count of a training step's per-rank memory: every storage alive on rank 0, after every
operator, through the launch's own step (grow.lockstep_step and Run.accumulate), at full size with fake
tensors on a fake process group.

    python -m tools.memcount table1 --scale full --gpus 8 [--nodes 4]   # a run apart, then every lockstep segment

memory.py counts a step's tensors from their shapes, and the rehearsal (rehearse.py) measures the step with
torch's FSDPMemTracker, which sees what module hooks and operator outputs show it. This count shares
neither: it takes every fake tensor's storage the garbage collector holds when the step starts (weights,
shards, AdamW moments, the batch), then follows every operator's outputs and every storage resize (FSDP2
frees and refills its gathered parameters by resizing them) to the step's end, and reports the most bytes
alive at once, with the operator where that was. The models, the worst step's micro-batches and what a CPU is
told to rehearse a GPU are the rehearsal's (rehearse.resident_models, worst_step, as_on_a_gpu), and the resident
runs step in the plan's order with every micro-batch of the step, so the teacher's states are kept as a launch
keeps them; a step at full size takes minutes of CPU (every operator of every resident run's micro-batches, faked).
tests/test_memcount.py holds the plan and the rehearsal to it.
"""
import argparse
import contextlib
import gc
import warnings
import weakref
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

import config
import data
import grow
from experiments import presets, suite
from plumbing import devices
from tools import cli_options, lockstep_plan, memory, plan, rehearse

GiB = 2**30


def fake_storages() -> list:
    """The storage of every fake tensor the garbage collector holds."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op object warns
        warnings.simplefilter("ignore", FutureWarning)
        return [obj.untyped_storage() for obj in gc.get_objects() if isinstance(obj, FakeTensor)]


class LiveStorages(TorchDispatchMode):
    """The bytes of every distinct storage of a fake tensor alive, after each operator: `now`, `peak` and
    `peak_op` (the operator whose output made the peak). Storages alive when it is made (another
    rehearsal's, in the same process) are not the step's: left out."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list] = {}  # id(storage) -> [weak reference, bytes]
        self.now = self.peak = 0
        self.peak_op = ""
        self.foreign = {id(s): weakref.ref(s) for s in fake_storages()}

    def add(self, storage):
        key = id(storage)
        for ref in (self.live.get(key, [None])[0], self.foreign.get(key)):
            if ref is not None and ref() is storage:
                return
        self.live[key] = [weakref.ref(storage, lambda _, key=key: self.drop(key)), storage.nbytes()]
        self.now += storage.nbytes()

    def drop(self, key: int):
        entry = self.live.pop(key, None)
        if entry is not None:
            self.now -= entry[1]

    def __enter__(self):
        for storage in fake_storages():
            self.add(storage)
        self.peak = self.now
        # A storage's resize_ is not an operator (no dispatch mode sees it): FSDP2 frees and refills its
        # unsharded parameters that way, so the count follows it here.
        resize = self.resize = torch.UntypedStorage.resize_

        def counted_resize(storage, size):
            resize(storage, size)
            entry = self.live.get(id(storage))
            if entry is not None and entry[0]() is storage:
                self.now += storage.nbytes() - entry[1]
                entry[1] = storage.nbytes()
        torch.UntypedStorage.resize_ = counted_resize
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self.resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):  # DTensor runs its local operators, which come back here
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        tree_map_only(FakeTensor, lambda t: self.add(t.untyped_storage()), out)
        if self.now > self.peak:
            self.peak, self.peak_op = self.now, str(func)
        return out


class OnDevice(data.Batch):
    """A micro-batch made on the device already (grow.lockstep_step moves each; a fake one stays)."""

    def to(self, device):
        return self


class FixedBatchRun(grow.Run):
    """A run of `phase` that takes the kit's own step (Run.accumulate, driven by grow.lockstep_step) on one
    fixed batch; its end_step is Run.update's clipping and AdamW step, without the log and checkpoints."""

    def __init__(self, settings, ctx, net, teacher, optimizer, phase, batch: data.StepBatch, dtype):
        self.config, self.ctx, self.net, self.teacher, self.dtype = settings, ctx, net, teacher, dtype
        self.optimizer, self.phase, self.batch, self.monitor_pending = optimizer, phase, batch, False
        self.batcher = None  # its teacher keeps no first epoch (a GPU's)
        self.params = grow.trainable_parameters(net, phase)
        self.active_layers = phase.active_blocks * settings.layers_per_block

    def begin_step(self) -> data.StepBatch:
        self.sums = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
        return self.batch

    def batch_key(self) -> tuple:
        return ("the worst batch",)  # every resident run reads it: one teacher pass serves them all

    def own_rng(self):
        return contextlib.nullcontext()  # the RNG holds no device memory

    def end_step(self):
        devices.clip_gradients(self.params, self.config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def worst_step(settings, max_len: int, world: int) -> data.StepBatch:
    """Every micro-batch of rehearse.worst_step (a rank's worst step on `world` ranks, as the launch places and
    packs it), copied under the fake mode so that they are counted as a GPU holds them."""
    micro = [OnDevice(b.input_ids.clone(), b.targets.clone(), b.mask.clone(), b.lengths.clone(), b.doc_ids,
                      b.n_targets, b.doc_lengths) for b in rehearse.worst_step(settings, max_len, world, "cpu")]
    return data.StepBatch(micro, settings.global_batch * max_len, [], 0)


def step_peak(ws, launch: rehearse.Launch, residents: list[config.Phase], norms: list[str] | None = None) -> dict:
    """{"bytes", "operator"}: the most bytes alive at once on rank 0 of `launch` during one lockstep step of
    students in `residents` (their phases, in the order they step; post-norm, or each of `norms`), on the
    worst step (worst_step)."""
    settings = memory.run_settings(ws.preset, "count")
    dtype = devices.DTYPES.get(settings.precision, torch.bfloat16)
    ctx = rehearse.rank0(launch, "cpu")
    counter = LiveStorages()
    with rehearse.as_on_a_gpu(), FakeTensorMode(allow_non_fake_inputs=True):
        teacher, students, optimizers = rehearse.resident_models(ws.preset, settings, ctx, dtype, residents, False,
                                                                 "cpu", norms)
        batch = worst_step(settings, ws.preset.data["max_len"], launch.world)
        runs = [FixedBatchRun(settings, ctx, s, teacher, o, ph, batch, dtype)
                for s, o, ph in zip(students, optimizers, residents)]
        with counter:
            grow.lockstep_step(runs, teacher)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {"bytes": counter.peak, "operator": counter.peak_op}


def segments(ws, launch: rehearse.Launch, names) -> list[dict]:
    """A run apart (grow's last phase), then every lockstep segment of the runs `names` (lockstep_plan.segment_memory):
    {"steps", "runs", "count_gib", "plan_gib", "operator"} each, memory.py's count beside this one."""
    last = memory.last_phase(ws.preset)
    apart = memory.step_peak(ws.preset, presets.teacher_shape(ws.preset), launch.gpus, launch.nodes, [last])
    runs = plan.planned_runs(ws, names, ws.preset.run["seed"])
    out = []
    for s in [{"steps": None, "runs": [f"a run apart phase {last.index}"], "phases": [last], "norms": ["post"],
               "bytes": apart["total"]}, *lockstep_plan.segment_memory(ws.preset, runs, launch.gpus, launch.nodes)]:
        counted = step_peak(ws, launch, s["phases"], s["norms"])
        out.append({"steps": s["steps"], "runs": s["runs"], "count_gib": counted["bytes"] / GiB,
                    "operator": counted["operator"], "plan_gib": s["bytes"] / GiB})
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=("table1", "all"), nargs="?", default="table1")
    parser.add_argument("--scale", default="full", choices=sorted(presets.PRESETS))
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=1)
    args = parser.parse_args()
    ws = suite.workspace(args.scale, Path("runs"), dry_run=True, device="cpu")
    _, run_names = cli_options.chosen_experiments([args.experiment])  # the runs the paper's tables named read
    for row in segments(ws, rehearse.Launch(args.gpus, args.nodes), run_names):
        steps = "a run apart" if row["steps"] is None else f"steps {row['steps'][0]:,}-{row['steps'][1]:,}"
        print(f"{steps} ({', '.join(row['runs'])}): {row['count_gib']:.2f} GiB counted from the storages "
              f"(peak at {row['operator']}), {row['plan_gib']:.2f} GiB by memory.py", flush=True)
