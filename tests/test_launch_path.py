"""The path a cluster launch takes, on a CPU: the full preset's precision policy (bf16 parameters, fp32
gradient reduction) through the kit's own driver (grow.Run, grow.lockstep_step), with gradient
accumulation over several micro-batches, a 2-D (HSDP) mesh and clipping. The other FSDP2 tests run in
fp32, where FSDP2 skips the code these reach."""
import json
import math
import os
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import distil_config, torchrun

import data
import grow
import model
import nets
import rundir
from plumbing import devices
from plumbing.hf_qwen3 import export_hf, hf_name

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def two_replicas():
    """Two ranks on a fake process group, as two nodes of one GPU each (HSDP: mesh replicate 2 x shard 1).
    Each rank's shard is the whole tensor, so every all-gather and reduce-scatter is real arithmetic on
    real tensors in this one process (the fake group only skips the replicas' all-reduce, as if the
    other node computed the same): the numbers stay finite and the run goes on through its phases."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield devices.Dist(0, 2, torch.device("cpu"), 1, devices.mesh_for("cpu", 2, 1))
    finally:
        dist.destroy_process_group()


def fsdp_params(unit):
    return unit._get_fsdp_state()._fsdp_param_group.fsdp_params


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_bf16_params_with_fp32_reduction_through_grow_phases(tiny_shards, tiny_teacher_dir, two_replicas, tmp_path,
                                                             micro_batches):
    """Grow phase 0 (blocks 1-2 never run forward) and phase 1 (block 1 trains for the first time), with
    1 or 2 micro-batches a rank, the full preset's MixedPrecisionPolicy. Before the fixes, with 2, phase
    0's first backward raised AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'
    (gradient sync was turned off on units that never ran: devices.set_gradient_sync); with 1, phase 1's
    first reduce-scatter assigned bf16 gradients to fp32 parameters (FSDP2 had fixed block 1's reduce
    dtype while it was frozen: devices.settle_fsdp_dtypes)."""
    c = distil_config(tiny_shards, tiny_teacher_dir, precision="bf16", phase_steps=1, global_batch=4 * micro_batches,
                      micro_batch=2, eval_interval=100)
    run = grow.Run(c, tmp_path / "run", two_replicas)
    run.prepare(force=False)
    teacher = nets.load_teacher(c, two_replicas, torch.bfloat16)
    run.open(teacher, None)
    seen = []
    accumulate = run.accumulate

    def watched(micro, hidden, last=True, **teacher_terms):
        accumulate(micro, hidden, last, **teacher_terms)
        # What each layer holds at the end of this backward: unsharded sums (sync off), or, after the
        # step's last micro-batch, its reduced shard.
        seen.append((run.step, last, [[p.unsharded_accumulated_grad is not None and p.unsharded_accumulated_grad.dtype
                                       for p in fsdp_params(layer)] for layer in run.net.layers],
                     [[p.sharded_param.grad is not None and p.sharded_param.grad.dtype for p in fsdp_params(layer)]
                      for layer in run.net.layers]))
    run.accumulate = watched
    for _ in range(2):
        grow.lockstep_step([run], teacher)
    assert run.state == "training" and run.step == 2
    assert run.precision == "bf16 (set by the preset)"
    assert [(s, last) for s, last, _, _ in seen] == [(s, i == micro_batches - 1) for s in range(2)
                                                     for i in range(micro_batches)]
    for step, last, accumulated, reduced in seen:
        trained = step + 1  # layers (one a block) trained at this step: phase p trains blocks 0..p
        for i in range(3):
            n = len(fsdp_params(run.net.layers[i]))
            held = torch.float32 if i < trained else False
            if not last:  # sync off: the trained layers' sums in fp32 (the reduce dtype); the others none
                assert accumulated[i] == [held] * n, (step, i)
            else:  # reduced in fp32 into fp32 shards, nothing left unsharded
                assert accumulated[i] == [False] * n and reduced[i] == [held] * n, (step, i)
    losses = [r["loss"] for r in rundir.read_metrics(tmp_path / "run") if "loss" in r]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)



def unsharded_gradient_bytes(net) -> int:
    """Bytes of gradients `net` holds unsharded right now (FSDP2's sums between micro-batches)."""
    held = 0
    for layer in (net, *net.layers):
        for p in fsdp_params(layer):
            if p.unsharded_accumulated_grad is not None:
                held += p.unsharded_accumulated_grad.nbytes
            if hasattr(p, "_unsharded_param") and p._unsharded_param.grad is not None:
                held += p._unsharded_param.grad.nbytes
    return held


def test_lockstep_holds_one_runs_unsharded_gradients_at_a_time(tiny_shards, tiny_teacher_dir, two_replicas, tmp_path):
    """Three runs of one seed in lockstep (one teacher pass a micro-batch), 3 micro-batches a rank, the
    full preset's precision policy: at the end of every backward, one run at most holds unsharded
    gradients; the others hold their shards only. Taking micro-batch i of every run before i + 1 (the
    order before) held all three runs' at once."""
    runs = []
    for name, norm in (("a", "pre"), ("b", "post"), ("c", "sandwich")):
        c = distil_config(tiny_shards, tiny_teacher_dir, name=name, norm=norm, precision="bf16", protocol="joint",
                          phase_steps=2, global_batch=12, micro_batch=2, eval_interval=100)
        run = grow.Run(c, tmp_path / name, two_replicas)
        run.prepare(force=False)
        runs.append(run)
    teacher = nets.load_teacher(runs[0].config, two_replicas, torch.bfloat16)
    for run in runs:
        run.open(teacher, None)
    held = []
    for run in runs:
        def watched(micro, hidden, last=True, accumulate=run.accumulate, **teacher_terms):
            accumulate(micro, hidden, last, **teacher_terms)
            held.append([unsharded_gradient_bytes(r.net) for r in runs])
            assert sum(held[-1]) == max(held[-1]), held  # never two runs' at once
        run.accumulate = watched
    grow.lockstep_step(runs, teacher)
    assert len(held) == 3 * 3 and all(run.step == 1 for run in runs)
    one_run = max(max(h) for h in held)
    assert one_run > 0  # between micro-batches a run holds its sums: fp32, every layer (joint)
    assert max(sum(h) for h in held) == one_run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config_file, run_dir, nodes: int, per_node: int):
    """tests/run_grow.py on nodes x per_node gloo ranks in this machine, with the environment torchrun gives each
    rank of a several-node launch (LOCAL_WORLD_SIZE below WORLD_SIZE: devices.mesh_for builds the HSDP
    mesh); fails the test on an error."""
    world, port = nodes * per_node, free_port()
    run_grow = [sys.executable, str(ROOT / "tests" / "run_grow.py"), str(config_file), "--run-dir", str(run_dir)]
    procs = [subprocess.Popen(run_grow, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(r), "WORLD_SIZE": str(world),
                                   "LOCAL_RANK": str(r % per_node), "LOCAL_WORLD_SIZE": str(per_node),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(world)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)


@pytest.mark.slow
def test_a_two_by_two_hsdp_mesh_trains_and_clips_like_one_process(tiny_shards, tiny_teacher_dir, tmp_path):
    """4 gloo ranks as 2 nodes x 2 (HSDP: sharded within a node, replicated across), 2 micro-batches a
    rank placed by length (the full preset's balance_lengths), a clipping norm every step exceeds, all 3
    grow phases with their evaluations and checkpoints.
    Before the fix the first optimizer step raised "mesh_dim needs to be specified" (devices.clip_gradients
    took the 2-D mesh's group). Kept checkpoints are written as shards by the first node's ranks. Against
    one process: the step's 8 micro-batches are the same, so their
    losses are the same fp32 numbers, and their float64 sum is exact (8 fp32 values a few binades apart
    need far fewer than float64's 53 bits): the logged loss of step 1 is equal. Each gradient element is
    the same 8 fp32 terms added in another association (within a node's 2 micro-batches, over the node's
    2 ranks, over the 2 nodes), which moves it by a few float32 roundings (relative ~1e-7 of the terms'
    magnitudes) and the norm with it: 1e-5 bounds it with room for cancellation. The clipping
    coefficient and AdamW's update then differ by less than the weights' own float32 rounding, which
    the sum of weight and update can round either way: the weights differ by a few ulps (1.2e-7 at 1,
    the norms' gains) over three steps; 1e-6 bounds them (1.5e-7 measured)."""
    from safetensors.torch import load_file
    c = distil_config(tiny_shards, tiny_teacher_dir, norm="pre", phase_steps=1, global_batch=16, micro_batch=2,
                      grad_clip=1e-3, eval_interval=100, balance_lengths=True)
    grow.train(c, tmp_path / "single")
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(c)))
    launch(config_file, tmp_path / "hsdp", nodes=2, per_node=2)
    assert json.loads((tmp_path / "hsdp" / "provenance.json").read_text())["world_size"] == 4
    one = [r for r in rundir.read_metrics(tmp_path / "single") if "loss" in r]
    four = [r for r in rundir.read_metrics(tmp_path / "hsdp") if "loss" in r]
    assert [r["step"] for r in four] == [1, 2, 3]
    assert four[0]["loss"] == one[0]["loss"]
    assert all(r["grad_norm"] > c.grad_clip for r in four)  # every step clipped
    for a, b in zip(one, four):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), a["step"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), a["step"]
    # The kept checkpoint: written by the first node's 2 ranks as 2 files of an HF sharded checkpoint
    # (no rank held the whole model), which loads, and exports to one HF folder, with the same tensors.
    kept = tmp_path / "hsdp" / "phase-2"
    assert sorted(p.name for p in kept.glob("*.safetensors")) == ["model-00001-of-00002.safetensors",
                                                                 "model-00002-of-00002.safetensors"]
    b = {k: v for f in sorted(kept.glob("*.safetensors")) for k, v in load_file(f).items()}
    a = load_file(tmp_path / "single" / "phase-2" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    loaded = model.Student.load(kept).state_dict()
    assert all(torch.equal(loaded[k], b[k]) for k in b)
    export_hf(model.Student.load(kept), tmp_path / "export")
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert exported.keys() == {hf_name(k) for k in b}
    assert all(torch.equal(exported[hf_name(k)], b[k]) for k in b)


def step_cost(placed: list[list[list[int]]], lengths) -> int:
    """Tokens a step's slowest ranks process: the ranks' j-th micro-batches run together, each padded to
    its longest document."""
    slots = max(len(p) for p in placed)
    return sum(max(len(mb) * max(lengths[i] for i in mb) for mb in (p[j] for p in placed)) * len(placed)
               for j in range(slots))


@pytest.mark.parametrize("world, micro", [(1, 2), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1)])
def test_length_balanced_micro_batches_place_every_document_once_and_cost_least(world, micro):
    """Steps of 16 documents of lognormal lengths (the web's shape, capped), placed by length: every one
    exactly once over the ranks, each rank computing the same placement from the step's ids alone; the
    same micro-batches, as sets of documents, at every world size (one process and FSDP2 ranks sum the
    same micro-batch gradients); and a step's cost (sum over slots of the longest padded micro-batch)
    never above the contiguous placement's: sorting puts the longest documents left into each slot, the
    least any placement reaches."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(6.5, 1.0, 1000).astype(np.int64) + 2, 8192)
    plain, balanced = 0, 0
    for _ in range(20):
        ids = rng.permutation(len(lengths))[:16]
        placed = [data.rank_micro_batches(ids, lengths[ids], micro, r, world, balance=True) for r in range(world)]
        assert sorted(i for p in placed for mb in p for i in mb) == sorted(ids.tolist())
        assert all(len(mb) == micro for p in placed for mb in p)
        alone = data.rank_micro_batches(ids, lengths[ids], micro, 0, 1, balance=True)
        assert sorted(map(sorted, alone)) == sorted(sorted(mb) for p in placed for mb in p)
        # Slot j's micro-batches all hold documents at least as long as slot j + 1's.
        for j in range(len(placed[0]) - 1):
            assert min(lengths[i] for p in placed for i in p[j]) >= max(lengths[i] for p in placed for i in p[j + 1])
        contiguous = [data.rank_micro_batches(ids, lengths[ids], micro, r, world) for r in range(world)]
        plain, balanced = plain + step_cost(contiguous, lengths), balanced + step_cost(placed, lengths)
        assert step_cost(placed, lengths) <= step_cost(contiguous, lengths)
    assert balanced < plain


def test_a_batcher_with_balance_serves_its_ranks_placement(tiny_shards):
    """data.Batcher(balance=True): rank r's packed micro-batches are token_micro_batches' for r (budget
    micro_batch x max_len tokens), and a resumed batcher serves the same step. A compiled run's (fixed shapes,
    padded rows) are rank_micro_batches' by length, as before."""
    shard = tiny_shards[0]
    budget = 2 * shard.manifest["max_len"]
    batchers = [data.Batcher(shard, 8, seed=5, replay_docs=60, rank=r, world_size=2, micro_batch=2, balance=True)
                for r in range(2)]
    for step in range(3):
        ids = batchers[0].global_doc_ids(step)
        for r, batcher in enumerate(batchers):
            got = next(batcher)
            want = data.token_micro_batches(ids, shard.lengths[ids] - 1, budget, r, 2)
            assert got.doc_ids == [i for mb in want for i in mb]
            assert [mb.doc_lengths for mb in got.micro_batches if mb.doc_ids] == [
                tuple(int(shard.lengths[i]) - 1 for i in mb) for mb in want if mb]
    resumed = data.Batcher(shard, 8, seed=5, replay_docs=60, rank=1, world_size=2, micro_batch=2, balance=True)
    batchers[1].step = 2
    resumed.load_state_dict(batchers[1].state_dict())
    assert next(resumed).doc_ids == next(batchers[1]).doc_ids
    padded = data.Batcher(shard, 8, seed=5, replay_docs=60, rank=1, world_size=2, micro_batch=2, balance=True,
                          fixed_shapes=True)
    ids = padded.global_doc_ids(0)
    assert next(padded).doc_ids == [i for mb in data.rank_micro_batches(ids, shard.lengths[ids], 2, 1, 2, True)
                                    for i in mb]


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_token_placement_places_every_document_once_within_the_budget_and_balances_the_ranks(world):
    """Steps of 64 documents of lognormal lengths capped at 8,192 (the full preset's shape): every document
    exactly once, whole, in a micro-batch of at most the budget's tokens; every rank as many micro-batches (an
    empty one where it has none); and the ranks' slots closer in cost than documents taken in order, where a
    packed micro-batch costs the sum of its documents' costs (flops.document_cost)."""
    from experiments import presets
    from plumbing.flops import document_cost
    full = presets.PRESETS["full"]
    teacher, budget = presets.teacher_shape(full), 8192
    cost = lambda n: document_cost(teacher, 9, n)
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(6.4, 1.0, 5000).astype(np.int64) + 1, 8192)
    waste = {"tokens": 0.0, "order": 0.0}
    for _ in range(20):
        ids = rng.permutation(len(lengths))[:64]
        placed = [data.token_micro_batches(ids, lengths[ids], budget, r, world, cost) for r in range(world)]
        assert sorted(i for p in placed for mb in p for i in mb) == sorted(ids.tolist())
        assert len({len(p) for p in placed}) == 1
        assert all(sum(lengths[i] for i in mb) <= budget for p in placed for mb in p)
        in_order = [data.rank_micro_batches(ids, lengths[ids], 64 // world, r, world) for r in range(world)]
        for way, ranks in (("tokens", placed), ("order", in_order)):
            slots = [[sum(cost(lengths[i]) for i in mb) for mb in p] for p in ranks]
            waste[way] += sum(world * max(c) - sum(c) for c in zip(*slots))
    assert waste["tokens"] < waste["order"] or world == 1



@pytest.mark.slow
def test_bf16_fsdp2_on_two_gloo_ranks_trains_every_grow_phase(tiny_shards, tiny_teacher_dir, tmp_path):
    """`torchrun --nproc_per_node=2 tests/run_grow.py` in the full preset's precision (bf16 parameters, fp32
    reduction) with 2 micro-batches a rank, through grow's three phases. Before the fixes it died in
    phase 0 (AttributeError '_unsharded_param') or, with 1 micro-batch a rank, at phase 1's first
    reduce-scatter ("attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor with
    grad_dtype 'Float'"); so CPU ranks were forced to fp32 and no test ran this policy on real ranks."""
    c = distil_config(tiny_shards, tiny_teacher_dir, precision="bf16", phase_steps=2, global_batch=8, micro_batch=2)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(c)))
    torchrun(config_file, tmp_path / "bf16")
    provenance = json.loads((tmp_path / "bf16" / "provenance.json").read_text())
    assert provenance["world_size"] == 2 and provenance["precision"] == "bfloat16"
    rows = rundir.read_metrics(tmp_path / "bf16")
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows if "loss" in r)
    assert math.isfinite(json.loads((tmp_path / "bf16" / "done.json").read_text())["ce"])


# The command a cluster job runs, on 2 nodes' agents of 2 gloo ranks each. bf16 is set: this CPU's precision
# probe chooses fp32 (its bf16 is emulated). A global batch of 8 gives each of the 4 ranks one micro-batch of 2
# (smoke's 4 would leave each rank 1 document, which its micro-batch of 2 cannot split; the kit says so).
LAUNCH_2X2 = ["train", "--scale", "smoke", "--norm", "post", "--protocol", "grow", "--device", "cpu",
              "--set", "run.precision=bf16", "--set", "run.global_batch=8", "--set", "teacher_run.global_batch=8"]


def two_agents(runs_dir: Path, kill_at: str = "") -> list[str]:
    """`torchrun --nnodes=2 --nproc_per_node=2 repro.py ...` as two nodes' agents of one job on this machine
    (static rendezvous on a free port: LOCAL_WORLD_SIZE 2 of WORLD_SIZE 4, an HSDP mesh); their outputs."""
    port = free_port()
    cmd = lambda node: [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2",
                        f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}",
                        str(ROOT / "repro.py"), *LAUNCH_2X2, "--runs-dir", str(runs_dir)]
    agents = [subprocess.Popen(cmd(node), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1", "NORMGROW_KILL_AT": kill_at})
              for node in (0, 1)]
    outs = [agent.communicate(timeout=900)[0] for agent in agents]
    assert all(agent.returncode == 0 for agent in agents) != bool(kill_at), "\n".join(o[-3000:] for o in outs)
    return outs


@pytest.mark.slow
def test_bf16_on_a_two_by_two_mesh_through_repro_train_resumes_bit_identical(tmp_path):
    """`repro.py train` on 2 x 2 gloo ranks in bf16 (the layers gathered in bf16, gradients reduced in fp32):
    provenance says bf16 on 4 ranks; the kept checkpoint holds fp32 weights (the master copy) in the 2 files of
    the first node's ranks; killed mid phase 1 (every rank SIGKILLed after step 14, the rolling checkpoint at
    12) and launched again, the run ends bit-identical to an uninterrupted one: every logged number, done.json and
    every weight. Against one process in bf16 (the same teacher, data and initial weights; autocast on fp32
    weights, where the launch rounds the layers' weights to bf16 once and reduces across ranks in another
    order): the same computation rounded differently, every step's loss and every evaluation's CE within
    bf16's unit roundoff 2^-9 (relative); measured: 2.3e-4 at most, about 0.12 of it."""
    from safetensors.torch import load_file
    runs = tmp_path / "runs"
    one = subprocess.run([sys.executable, str(ROOT / "repro.py"), *LAUNCH_2X2, "--runs-dir", str(runs)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]  # it trains the teacher the launches share
    run_dir = next(runs.rglob("post-grow"))
    kept = {"one": run_dir.rename(tmp_path / "one")}
    outs = two_agents(runs)
    assert sum(out.count("post-grow: validation CE") for out in outs) == 1  # rank 0's line, not four ranks'
    kept["uninterrupted"] = run_dir.rename(tmp_path / "uninterrupted")
    two_agents(runs, kill_at="stepped:post-grow:14")
    assert not (run_dir / "done.json").exists() and (run_dir / "latest").is_dir()
    two_agents(runs)
    kept["resumed"] = run_dir.rename(tmp_path / "resumed")
    for name in ("uninterrupted", "resumed"):
        provenance = json.loads((kept[name] / "provenance.json").read_text())
        assert provenance["world_size"] == 4 and provenance["precision"] == "bfloat16"
    assert sorted(p.name for p in (kept["resumed"] / "phase-2").glob("*.safetensors")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weights = {name: {k: v for f in sorted((folder / "phase-2").glob("*.safetensors")) for k, v in load_file(f).items()}
               for name, folder in kept.items()}
    assert weights["resumed"].keys() == weights["uninterrupted"].keys() == weights["one"].keys()
    assert all(v.dtype == torch.float32 for v in weights["resumed"].values())
    assert all(torch.equal(weights["resumed"][k], weights["uninterrupted"][k]) for k in weights["resumed"])
    rows = {name: [{k: v for k, v in r.items() if k != "time"} for r in rundir.read_metrics(folder)]
            for name, folder in kept.items()}
    assert rows["resumed"] == rows["uninterrupted"]
    assert [r["step"] for r in rows["resumed"] if "loss" in r] == list(range(1, 25))
    assert (kept["resumed"] / "done.json").read_text() == (kept["uninterrupted"] / "done.json").read_text()
    for a, b in zip(rows["one"], rows["uninterrupted"], strict=True):  # steps, evaluations, the monitor's rows
        assert (a["step"], a.keys()) == (b["step"], b.keys())
        for key in {"loss", "ce"} & a.keys():
            assert b[key] == pytest.approx(a[key], rel=2**-9), (a["step"], key)
