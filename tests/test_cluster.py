"""The cluster path without a cluster: gloo ranks under torchrun for the launch's failure modes (a long
preparation on rank 0, a runs folder some rank cannot see), and the full-size rehearsal (rehearse.py)
at reduced dimensions, its collectives and memory checked against counts made apart."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def torchrun_script(script: Path, *args, ranks: int = 2, cwd=ROOT) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", str(script),
           *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})


SLOW_PREPARATION = """
import sys, time
from datetime import timedelta
from pathlib import Path
import torch.distributed
from experiments import prepare_shards, presets, suite
from plumbing import devices
devices.COLLECTIVE_TIMEOUT = timedelta(seconds=3)   # what NCCL's 10 minutes are to a real preparation
devices.WAIT_REPORT_SECONDS = 2
prepare = prepare_shards.prepare
def slow(*args, **kwargs):
    time.sleep(10)
    return prepare(*args, **kwargs)
prepare_shards.prepare = slow
ctx = devices.setup_distributed("cpu")
if sys.argv[1] == "kit":
    ws = suite.Workspace(presets.PRESETS["smoke"], Path(sys.argv[2]) / "smoke", Path(sys.argv[2]) / "results", ctx)
    suite.prepare_data(ws)
else:  # what the kit did before: rank 0 prepares while the others sit in a collective of the default group
    if ctx.is_main:
        time.sleep(10)
    ctx.barrier()
ctx.barrier()
print(f"rank {ctx.rank}: done", flush=True)
torch.distributed.destroy_process_group()  # leave the group: torchrun's ranks exit together
"""


def test_a_preparation_longer_than_the_collective_timeout_is_waited_for(tmp_path):
    """Rank 0 prepares the data for longer than the process group's timeout (3 s here) while rank 1
    waits on the kit's gloo group of its own, saying so: both finish. The same wait in a collective of
    the default group times out (the test's control: without the kit's wait, a rank is killed)."""
    script = tmp_path / "prepare.py"
    script.write_text(SLOW_PREPARATION)
    kit = torchrun_script(script, "kit", tmp_path)
    assert kit.returncode == 0, kit.stdout[-2000:] + kit.stderr[-3000:]
    assert "rank 0: done" in kit.stdout and "rank 1: done" in kit.stdout
    assert "rank 1: waiting for rank 0 to finish preparing the data" in kit.stdout
    assert (tmp_path / "smoke" / "data" / "train" / "manifest.json").is_file()
    plain = torchrun_script(script, "plain", tmp_path)
    assert plain.returncode != 0 and "Timed out" in plain.stdout + plain.stderr


UNSHARED = """
import os, sys
os.chdir(sys.argv[1 + int(os.environ["RANK"])])   # each rank its own folder: a runs folder that is not shared
sys.argv = ["repro.py", "train", "--scale", "smoke", "--norm", "post", "--protocol", "joint", "--device", "cpu"]
import repro
repro.cli()
"""


def test_a_rank_that_cannot_see_the_runs_folder_stops_every_rank_with_one_line(tmp_path):
    """`--runs-dir runs` resolves to another folder on each rank (as on nodes without a shared filesystem):
    rank 0 prepares the data in its own, rank 1 cannot see it, and every rank stops; one line says why."""
    script = tmp_path / "unshared.py"
    script.write_text(UNSHARED)
    for rank in (0, 1):
        (tmp_path / f"node{rank}").mkdir()
    out = torchrun_script(script, tmp_path / "node0", tmp_path / "node1")
    errors = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("Error:")]
    assert out.returncode != 0 and len(errors) == 1, out.stdout[-2000:] + out.stderr[-3000:]
    assert "not there on every rank" in errors[0] and "filesystem every node shares" in errors[0]
    assert not (tmp_path / "node1" / "runs" / "smoke" / "s42").exists()  # no run started anywhere


# ----------------------------------------------------------------------------------------------
# The rehearsal at reduced dimensions: the kit's own step under FSDP2's tracker against counts made apart

def reduced(preset_name: str, **run):
    """A scale with a small teacher of the kit's own (same code paths: FSDP2 units, activation
    checkpointing, bf16, chunked loss) so that a rehearsal takes seconds."""
    from dataclasses import replace

    from experiments import presets
    p = presets.PRESETS[preset_name]
    return replace(p, teacher="", teacher_model=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                                     tie_word_embeddings=False),
                   data={**p.data, "vocab_size": 4096, "max_len": 256}, run={**p.run, "loss_chunk": 128, **run})


# Sharded over a node, HSDP over two with two students resident, and one GPU (no FSDP collectives): its rows
# padded (a compiled run's layout), and packed.
@pytest.mark.parametrize("scale,gpus,nodes,resident,run", [
    ("full", 8, 1, 1, {}), ("full", 4, 2, 2, {}), ("small", 1, 1, 2, {"compile": True}),
    ("small", 1, 1, 2, {})])
def test_the_rehearsal_measures_what_the_memory_and_collective_counts_say(scale, gpus, nodes, resident, run):
    from experiments import presets, suite
    from plumbing import devices
    from tools import dispatch_counts, memory, plan, rehearse
    preset = reduced(scale, **run)
    ws = suite.Workspace(preset, Path("/nonexistent") / scale, Path("/nonexistent"), devices.Dist())
    out = rehearse.rehearse(ws, rehearse.Launch(gpus, nodes), [memory.last_phase(preset)] * resident)
    counted = memory.step_peak(preset, presets.teacher_shape(preset), gpus, nodes, resident)
    # The same tensors counted two ways, by the tracker from the storages and by memory.py from the shapes.
    # The count leaves out what is a few KiB each (the loss's float64 sums, AdamW's step counters, scalar
    # temporaries): under 0.1 MiB in all, where the counted total is 100-1000 MiB.
    assert out["peak_gib"]["per-rank peak"] * 2**30 == pytest.approx(counted["total"], abs=0.1 * 2**20)
    assert not any(out["left_gathered"].values())  # every FSDP2 unit resharded after its forward
    phase = memory.last_phase(preset)
    expected = rehearse.summarize_calls(plan.collectives(preset, presets.teacher_shape(preset), phase, gpus, nodes))
    assert {k: v["count"] for k, v in out["collectives_per_step"].items()} == \
        {k: v["count"] for k, v in expected.items()}
    for kind, entry in expected.items():  # plan counts the parameters' bytes; FSDP2's buffers add a little
        # padding per unit (each shard aligned), well under 0.1% here and less at full size
        assert out["collectives_per_step"][kind]["gib"] == pytest.approx(entry["gib"], rel=1e-3), kind
    ops = out["ops_per_step"]
    assert ops["a step of every resident student, one teacher forward"] == \
        ops["teacher forward"] + resident * ops["a student's forward, backward and AdamW step"]
    assert out["host_floor_s_per_step"] > 0
    # Fake tensors dispatch what real ones do: the teacher's forward, counted on real ones; on padded rows only,
    # since a packed row takes the CUDA branch in the rehearsal and the CPU's per-document slices here.
    if gpus * nodes == 1 and run.get("compile"):
        import torch

        import model
        import nets
        net = model.Qwen3(presets.teacher_shape(preset)).to(torch.bfloat16).eval().requires_grad_(False)
        batch = rehearse.worst_step(memory.run_settings(preset), preset.data["max_len"], 1, "cpu")[0]
        real = dispatch_counts.DispatchedOps()
        with real, torch.no_grad(), devices.autocast(torch.bfloat16, devices.Dist()):
            net(batch.input_ids, doc_lengths=batch.doc_lengths, output_fn=nets.hidden_only)
        assert ops["teacher forward"] == real.count * out["micro_batches_per_step"]
    if gpus * nodes > 1:  # gradients reduce-scattered once a step: one per trained FSDP2 unit (layers, root)
        trained_units = preset.run["blocks"] * preset.run["layers_per_block"] + 1
        assert out["collectives_per_step"][f"reduce-scatter over {gpus} ranks"]["count"] == trained_units


def test_every_lockstep_segment_measures_what_the_plan_counts():
    """Table 1's lockstep at full scale's settings (reduced dimensions) on 8 GPUs: each segment (four runs
    in phase 0, joint's nine layers stepping beside grow's one block; then grow's two in phases 1 and
    2) measured through the kit's own code equals memory.py's count for it, which lockstep_plan.fits reads.
    Each is measured on the worst step as the launch makes it: a rank's 8 documents of the full length in 4
    packed micro-batches of the token budget, two documents end to end in one row."""
    from experiments import suite, tables
    from plumbing import devices
    from tools import lockstep_plan, plan, rehearse
    preset = reduced("full")
    ws = suite.Workspace(preset, Path("/nonexistent") / "full", Path("/nonexistent"), devices.Dist())
    segments = rehearse.rehearse_segments(ws, rehearse.Launch(8), tables.MAIN_RUNS)
    assert [s["steps"] for s in segments] == [[0, 50_000], [50_000, 100_000], [100_000, 150_000]]
    assert [len(s["runs"]) for s in segments] == [4, 2, 2]
    for s in segments:
        out = s["rehearsal"]
        assert out["packed"] and out["micro_batches_per_step"] == 4 and out["micro_batch_tokens"] == [512, 512]
        assert out["micro_batch_documents"] == [[256, 256], [256, 256]]
    for s in segments:  # as above: the count leaves out what is under 0.1 MiB in all
        assert s["rehearsal"]["peak_gib"]["per-rank peak"] * 2**30 == pytest.approx(s["plan_gib"] * 2**30,
                                                                                    abs=0.1 * 2**20), s["steps"]
    worst = max(s["plan_gib"] for s in segments) * 2**30
    runs = plan.planned_runs(ws, tables.MAIN_RUNS, 42)
    assert lockstep_plan.fits(preset, 8, worst / lockstep_plan.MEMORY_HEADROOM, runs)
    assert not lockstep_plan.fits(preset, 8, worst / lockstep_plan.MEMORY_HEADROOM - 1, runs)


def test_the_rehearsals_worst_step_is_the_most_the_launchs_placement_gives_a_rank():
    """Full scale (64 documents a step, a token budget of micro_batch x 8,192 tokens) on 8 and 32 GPUs: the
    rehearsal's worst step (every document of the full length) gives rank 0 global_batch / world / micro_batch
    micro-batches, each a full budget of whole documents packed in one row, every target real: what memory.py
    counts. No step placed as data.Batcher places it (token_micro_batches by flops.document_cost) gives a rank
    more micro-batches or a micro-batch more tokens: lognormal lengths capped at the full length, and lengths
    chosen to pack badly (just over a half or two thirds of the budget, the full length beside single tokens)."""
    from functools import partial

    import data
    from experiments import presets
    from plumbing.flops import document_cost
    from tools import memory, rehearse
    full = presets.PRESETS["full"]
    T, m, shape = full.data["max_len"], full.run["micro_batch"], presets.teacher_shape(full)
    cost = partial(document_cost, shape, full.run["blocks"] * full.run["layers_per_block"])
    rng = np.random.default_rng(0)
    steps = [np.minimum(rng.lognormal(6.4, 1.0, 64).astype(np.int64) + 1, T) for _ in range(100)]
    steps += [np.full(64, n) for n in (T, T // 2 + 1, m * T // 3 + 1, 1)] + [np.resize([T, 1], 64), np.resize([T, T, 1], 64)]
    for world in (8, 32):
        d = memory.Dims(full, shape, world, 1)
        batches = rehearse.worst_step(memory.run_settings(full), T, world, "cpu")
        assert len(batches) == d.micro_per_step == 64 // world // m and d.N == m * T
        for b in batches:
            assert b.input_ids.shape == (1, d.N) and b.doc_lengths == (T,) * m and b.n_targets == d.N and b.mask.all()
        for lengths in steps:
            placed = data.token_micro_batches(np.arange(64), lengths, d.N, 0, world, cost)
            assert len(placed) <= d.micro_per_step and all(lengths[mb].sum() <= d.N for mb in placed), lengths[:4]


def test_the_gpu_checks_packed_micro_batches_are_the_full_scales():
    """make gpu-check's packed checks (run on a GPU only; what decides their shapes, and their code on the CPU,
    here): the attention's row is a full token budget of the longest documents, the throughput's micro-batches
    that and a rank's share of a mean step on 8 GPUs, which token placement puts in one micro-batch; the packed
    attention equals each document alone both ways (the CPU's path: SDPA a document)."""
    import torch

    import data
    from experiments import presets
    from plumbing.hf_qwen3 import ModelConfig
    from tools import gpucheck
    full = presets.PRESETS["full"]
    budget, share = gpucheck.full_scale_micro_batches(full)
    assert budget == [8192, 8192] == [full.data["max_len"]] * full.run["micro_batch"] and len(share) == 8
    lengths = np.array(share * 8)  # a mean step of 64 documents
    assert [len(mb) for mb in data.token_micro_batches(np.arange(64), lengths, sum(budget), 0, 8)] == [8]
    tiny = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    out = gpucheck.packed_attention(tiny, [32, 20], torch.device("cpu"))
    assert out["ok"] and out["kernel"] == "sdpa per document" and len([k for k in out if "parameters" in k]) == 2


def test_dispatched_operators_leave_out_views_and_metadata():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tools import dispatch_counts
    x = torch.ones(4, 3)
    for mode in (None, FakeTensorMode(allow_non_fake_inputs=True)):
        ops = dispatch_counts.DispatchedOps()
        with (mode or torch.no_grad()), ops:
            y = (x + 1).view(2, 6).t().detach()  # one kernel: add; the view, the transpose and detach alias
            assert ops.count == 1 and y.device.type == "cpu"
            (y * 2).sum()
            assert ops.count == 3


# ----------------------------------------------------------------------------------------------
# The rehearsal's real-tensor mode is the launch: the driver's functions it calls, against a launch's

DRIVER_MODULES = (ROOT / "grow.py", ROOT / "rundir.py", ROOT / "checkpointing.py",
                  *(ROOT / "plumbing" / f for f in ("devices.py", "checkpoint.py", "faults.py")))


class CalledFunctions:
    """The functions of the driver's modules called while it is active (sys.setprofile on this thread and
    threading.setprofile on the threads it starts: the rehearsal's ranks are threads)."""

    def __init__(self):
        self.names: set[str] = set()

    def profile(self, frame, event, arg):
        if event == "call" and Path(frame.f_code.co_filename) in DRIVER_MODULES:
            self.names.add(f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_qualname}")

    def __enter__(self):
        import threading
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)
        return self

    def __exit__(self, *exc):
        import threading
        sys.setprofile(None)
        threading.setprofile(None)


# Called by a launch and never by the rehearsal, each for a reason: the rehearsal's ranks are threads of
# torch's threaded process group, which it makes itself (no torchrun environment to read and check, no NCCL
# or gloo group to set up or tear down); a launch in one process picks its device; the smoke scale pretrains its own
# teacher (grow.train of the teacher run), where the full scale's is the hub's and the rehearsal's a
# small random one; and the command line checks its --tracker option.
LAUNCH_ONLY = {"devices.setup_distributed", "devices.torchrun_rank", "devices.torchrun_rank.<locals>.<listcomp>",
               "devices.choose_device", "grow.train", "rundir.check_tracker"}


def test_the_real_rehearsal_runs_every_driver_function_a_launch_runs(tmp_path, monkeypatch):
    """A smoke launch of table1 (repro.py, in this process) against the rehearsal's real-tensor mode of
    table1 as `repro.py rehearse --scale full --gpus 4 --nodes 4 --mode real` runs it: on 2 x 2 ranks
    (HSDP's 2-D mesh), in the full preset's precision, each rank with the 2 micro-batches a step of a
    rank of 4 x 4 (its 4 documents packed two to a micro-batch of the token budget: accumulation with sync
    off, then on; on 4 x 8 a rank's 2 documents fit one): every function of grow, devices, rundir and
    checkpoint that the launch calls, the rehearsal calls (but the few above, each with its reason). A
    driver path the rehearsal skipped would fail here. A training step waits for the device once a
    micro-batch (kd._real_tokens finds the real targets) and once to read the step's losses and norm."""
    import repro
    from experiments import presets, tables
    from tools import rehearse, rehearse_real
    monkeypatch.chdir(tmp_path)
    with CalledFunctions() as launch:
        repro.cli(["table1", "--scale", "smoke", "--runs-dir", str(tmp_path / "runs"), "--results-dir",
                   str(tmp_path / "results")], standalone_mode=False)
    with CalledFunctions() as rehearsal:
        out = rehearse_real.rehearse(presets.PRESETS["full"], rehearse.Launch(4, 4), tables.MAIN_RUNS,
                                     tmp_path / "rehearsal")
    assert out["precision"] == "bf16" and out["first_world"] == 2 and out["world"] == 16
    assert out["ranks_run"] == {"gpus": 2, "nodes": 2, "world": 4} and out["micro_batches_per_step"] == 2
    assert {name: r["step"] for name, r in out["runs"].items()} == \
        {"pre-joint": rehearse_real.REDUCED_STEPS, "post-joint": rehearse_real.REDUCED_STEPS,
         "pre-grow": 3 * rehearse_real.REDUCED_STEPS, "post-grow": 3 * rehearse_real.REDUCED_STEPS}
    assert out["host_syncs_per_training_step"] == out["micro_batches_per_step"] + 1
    missed = launch.names - rehearsal.names - LAUNCH_ONLY
    assert not missed, f"called by a launch, never by the rehearsal: {sorted(missed)}"


def test_the_real_rehearsal_keeps_what_a_rank_of_the_launch_runs():
    """One node's 8 GPUs run as 1 x 2 ranks, four nodes' as 2 x 2, one GPU as itself; each rank of them
    with the micro-batches a step of a rank of the launch (64 documents a step: 8 a rank on 8 GPUs, 2 on
    32), at its token budget of two documents' tokens (two of the reduced length, so that a worst step's
    documents are placed two to a micro-batch as at full size), in bf16 with activation checkpointing. The
    interrupted first launch writes latest/ from several ranks, another number than the launch reads it on
    (4 then 2 shards; 2 then 2 x 2 ranks; 2 then 1), and from one where the step's micro-batches do not
    split over them."""
    import data
    from experiments import presets
    from tools import rehearse, rehearse_real
    full = presets.PRESETS["full"]
    assert full.run["micro_batch"] == 2 and full.run["balance_lengths"]
    for launch, ranks, micro, first in [((8, 1), (2, 1), 4, 4), ((8, 4), (2, 2), 1, 2), ((1, 1), (1, 1), 32, 2)]:
        run = rehearse_real.reduced_ranks(rehearse.Launch(*launch))
        assert (run.gpus, run.nodes) == ranks
        small = rehearse_real.reduced(full, rehearse.Launch(*launch), run)
        micro_batches = small.run["global_batch"] // small.run["micro_batch"]
        assert micro_batches // run.world == micro
        assert (small.run["micro_batch"], small.run["precision"], small.run["activation_checkpointing"]) == \
            (2, "bf16", True)
        T = small.data["max_len"]  # a worst step's documents, placed on a reduced rank as on one of the launch
        worst = data.token_micro_batches(np.arange(small.run["global_batch"]), np.full(small.run["global_batch"], T),
                                         small.run["micro_batch"] * T, 0, run.world)
        assert [len(docs) for docs in worst] == [2] * micro
        assert rehearse_real.first_ranks(run, micro_batches) == rehearse.Launch(first)
    assert rehearse_real.first_ranks(rehearse.Launch(1), 3) == rehearse.Launch(1)


def test_the_plans_hours_are_its_lines_and_the_balance_follows_the_lengths(monkeypatch):
    """Equal documents waste nothing, so the balance is 1 whatever the placement; lognormal ones waste
    less placed by length than in order. A grow run evaluates at each phase's start and every 2,000
    steps (3 x 26 times at full). The total is the sum of its lines."""
    from experiments import presets, suite, tables
    from plumbing import devices
    from plumbing.flops import forward_flops_per_token
    from tools import plan
    full = presets.PRESETS["full"]
    teacher = presets.teacher_shape(full)
    monkeypatch.setattr(plan, "BALANCE_STEPS", 50)
    monkeypatch.setattr(plan, "DOC_LENGTH_SIGMA", 0.0)
    assert plan.balance_factor(full, teacher, 8, False, 0) == pytest.approx(1.0, rel=1e-12)
    monkeypatch.setattr(plan, "DOC_LENGTH_SIGMA", 1.0)
    balanced, ordered = (plan.balance_factor(full, teacher, 8, way, 0) for way in (True, False))
    assert 0 < ordered < balanced < 1
    ws = suite.Workspace(full, Path("/nonexistent") / "full", Path("/nonexistent"), devices.Dist())
    runs = plan.planned_runs(ws, tables.MAIN_RUNS, 42)
    grow_run = next(r for r in runs if r.name == "post-grow")
    s_layers = [forward_flops_per_token(teacher, 3 * blocks, 972 / 2)[0] for blocks in (1, 2, 3)]
    t_layers, head = forward_flops_per_token(teacher, teacher.num_hidden_layers, 972 / 2)
    tokens = -(-full.data["val_docs"] // 8) * 8 * 972  # 605 steps of 8 ranks: the last one's 7 idle ranks wait too
    equal = np.full(full.data["val_docs"], 972)
    assert plan.evaluation_flops(grow_run, full, teacher, equal, 8) == \
        pytest.approx(sum(26 * tokens * (t_layers + s + 2 * head) for s in s_layers))
    result = plan.print_plan(ws, runs, [42], "h100", 8, suite.console)
    for way in ("separate", "lockstep"):
        lines = result[way]["hours_lines"]
        assert result[way]["gpu_hours"] == pytest.approx(sum(v for k, v in lines.items() if not k.startswith("  ")))
    assert result["lockstep"]["memory_gib"] == max(s["gib"] for s in result["lockstep"]["memory_segments"])
