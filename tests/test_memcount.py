"""A step's per-rank memory counted three ways, held together: from the shapes (tools/memory.py, the plan's),
by FSDP2's tracker (the rehearsal, tools/rehearse.py), and from every storage alive at every operator of
the kit's own lockstep step (tools/memcount.py). Reduced dimensions (test_cluster.reduced), the full
preset's settings: bf16, FSDP2, activation checkpointing, the chunked loss."""
from pathlib import Path

import pytest
import torch
from test_cluster import reduced

MiB = 2**20


def test_the_counter_follows_allocations_views_frees_and_resizes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tools import memcount
    with FakeTensorMode():
        before = torch.empty(4096)  # another computation's tensor, alive when the counter is made: not counted
        counter = memcount.LiveStorages()
        held = torch.empty(1024)    # 4 KiB, held when the step starts
        with counter:
            view = held.view(32, 32)  # no new storage
            temporary = torch.empty(256) + 1  # 1 KiB twice (empty, then the sum), the first freed at once
            del temporary
            grown = torch.empty(2048)  # 8 KiB: 12 KiB alive, the peak
            held.untyped_storage().resize_(0)  # as FSDP2 frees a gathered parameter: 8 KiB
            assert counter.now == 8 * 1024
    assert counter.peak == 12 * 1024 and counter.peak_op == "aten.empty.memory_format"
    assert view.shape == (32, 32) and before.numel() == grown.numel() * 2


def counted(preset, gpus: int, nodes: int, residents: int, norms: list[str], with_rehearsal: bool) -> dict:
    """{"count", "plan"[, "rehearsal"]} in bytes for `residents` runs in grow's last phase of `norms`."""
    from experiments import presets, suite
    from plumbing import devices
    from tools import memcount, memory, rehearse
    ws = suite.Workspace(preset, Path("/nonexistent") / preset.name, Path("/nonexistent"), devices.Dist())
    phases, launch = [memory.last_phase(preset)] * residents, rehearse.Launch(gpus, nodes)
    out = {"count": memcount.step_peak(ws, launch, phases, norms)["bytes"],
           "plan": memory.step_peak(preset, presets.teacher_shape(preset), gpus, nodes, phases, norms=norms)["total"]}
    if with_rehearsal:
        out["rehearsal"] = rehearse.rehearse(ws, launch, phases, norms=norms)["peak_gib"]["per-rank peak"] * 2**30
    return out


# What the count holds and neither the plan nor the rehearsal counts is a few KiB: the step's token ids,
# targets, mask and lengths, the float64 loss sums, AdamW's step counters, the gradient norm (about 50 KiB here).
# The smallest tensor either of them could leave out is larger: an fp32 stream tensor of a micro-batch is
# 0.25 MiB a document at these dimensions, the bf16 head 2 MiB (the one both left out before: the plan 2.05 MiB
# under the count, and the rehearsal, which missed the teacher's embedding, 2.05 MiB under it too), a packed
# row's RoPE cos and sin, made for every token (0.125 MiB above padded rows' at two documents), the loss's copy
# of the teacher's states at the real targets (0.25 MiB); those two were left out by both before the rehearsal
# built packed micro-batches with their mask.
TOLERANCE = 0.1 * MiB


def test_the_plan_counts_every_storage_a_pre_norm_step_holds():
    """One pre-norm run on 8 GPUs, one micro-batch (two documents packed): its final norm holds one more fp32
    stream tensor at the loss than post-norm (0.5 MiB here; the plan counted post-norm's before), and the loss
    casts the fp32 head to bf16 once (2 MiB, left out under FSDP2 before)."""
    from experiments import presets
    one_micro_batch_a_rank = 8 * presets.PRESETS["full"].run["micro_batch"]
    out = counted(reduced("full", global_batch=one_micro_batch_a_rank), 8, 1, 1, ["pre"], with_rehearsal=False)
    assert 0 <= out["count"] - out["plan"] <= TOLERANCE, out


@pytest.mark.slow
@pytest.mark.parametrize("scale, gpus, nodes, norms, run", [
    ("full", 8, 1, ["post", "pre"], {}), ("full", 2, 2, ["post"], {}), ("small", 1, 1, ["post", "post"], {"compile": True}),
    ("small", 1, 1, ["post", "post"], {})])
def test_the_plan_and_the_rehearsal_count_every_storage_a_lockstep_step_holds(scale, gpus, nodes, norms, run):
    """Two micro-batches a rank (teacher states kept for the other run, gradients accumulated), each a full
    token budget of documents of the full length, on a node, HSDP on a 2 x 2 mesh, and one GPU (its rows padded,
    a compiled run's layout, and packed): the plan and the rehearsal each equal the count of the
    storages."""
    from experiments import presets
    preset = reduced(scale, global_batch=2 * gpus * nodes * presets.PRESETS[scale].run["micro_batch"], **run)
    out = counted(preset, gpus, nodes, len(norms), norms, with_rehearsal=True)
    assert 0 <= out["count"] - out["plan"] <= TOLERANCE, out
    assert 0 <= out["count"] - out["rehearsal"] <= TOLERANCE, out
