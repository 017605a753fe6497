"""grow.py under torchrun: FSDP2 on two gloo ranks ends bit-identical to one process, two torchruns share a
machine, and a sharded rolling checkpoint is read back on any number of ranks."""
import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import distil_config, phase_weights, torchrun

import grow
import nets
import rundir

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fsdp2_two_ranks_match_one_process_and_resume(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    """Two ranks, stopped and resumed, end bit-identical to one process: each rank's micro-batch is one
    of the process's two (8 documents, 4 per micro-batch), so each gradient is the same sum of the same
    terms, and the clipping coefficient is the same float32 (devices.clip_gradients). The process runs the
    teacher on each micro-batch as ranks do (nets.FIRST_EPOCH_BYTES is one CPU process's)."""
    monkeypatch.setattr(nets, "FIRST_EPOCH_BYTES", 0)
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    single = grow.train(c, tmp_path / "single")
    # The sharded run also recomputes activations (the paper's setting): neither may change a number.
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(replace(c, activation_checkpointing=True))))
    torchrun(config_file, tmp_path / "fsdp", "--stop-after-step", "7")  # stops mid-phase 1, after a sharded save
    assert (tmp_path / "fsdp" / "latest").is_dir() and not (tmp_path / "fsdp" / "done.json").exists()
    assert json.loads((tmp_path / "fsdp" / "provenance.json").read_text())["world_size"] == 2
    torchrun(config_file, tmp_path / "fsdp")
    losses = lambda d: [(r["step"], r.get("eval", False), r["loss"] if "loss" in r else r["ce"])
                        for r in rundir.read_metrics(d)]
    one, two = losses(tmp_path / "single"), losses(tmp_path / "fsdp")
    assert [r[:2] for r in one] == [r[:2] for r in two]
    assert one == two
    assert json.loads((tmp_path / "fsdp" / "done.json").read_text())["ce"] == single["ce"]
    # The phase-end checkpoints, gathered from the shards, hold the same weights.
    a, b = phase_weights(tmp_path / "single", 2), phase_weights(tmp_path / "fsdp", 2)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_torchruns_at_once_do_not_collide_on_ports(tmp_path):
    """torchrun --standalone lets the OS pick its rendezvous port: two jobs started together both finish."""
    script = tmp_path / "ranks.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "t = torch.ones(1) * (dist.get_rank() + 1)\n"
                      "dist.all_reduce(t)\n"
                      "assert t.item() == 3.0\n"
                      "dist.destroy_process_group()\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outputs = [job.communicate(timeout=300)[0].decode() for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], outputs


# ---- sharded rolling checkpoints: each rank writes its own rows; any number of ranks reads them back ---

RESHARD = """
import json, sys
from pathlib import Path
import torch
import checkpointing, config, grow, nets
from plumbing import devices
source, target = Path(sys.argv[1]), Path(sys.argv[2])
ctx = devices.setup_distributed("cpu")
import pickle  # from here on, nothing may be unpickled: loading and writing the checkpoint need none
def refuse(*args, **kwargs):
    raise AssertionError("something was unpickled")
class Refused(pickle.Unpickler):
    __init__ = refuse
pickle.load, pickle.loads, pickle.Unpickler, torch.load = refuse, refuse, Refused, refuse
c = config.RunConfig(**json.loads((source / "config.json").read_text())).resolved(source)
state = json.loads((source / "latest" / "trainer_state.json").read_text())
teacher = nets.load_teacher(c, ctx, torch.float32)
net = nets.build_model(c, teacher, ctx, torch.float32)
params = grow.trainable_parameters(net, config.plan_phases(c)[state["phase"]])
optimizer = grow.build_optimizer(c, params)
checkpointing.load_latest_checkpoint(source / "latest", net, optimizer, ctx)
target.mkdir(exist_ok=True)
checkpointing.save_checkpoint(target, net, state, ctx, "latest", optimizer)
"""


def whole_tensors(latest: Path) -> dict:
    """Every tensor of a sharded latest/, its writers' rows put back together (by the index alone)."""
    from safetensors import safe_open
    index = json.loads((latest / "index.json").read_text())
    out = {}
    for key, entry in index["tensors"].items():
        pieces = []
        for shard in sorted(entry["shards"], key=lambda s: s["offset"]):
            with safe_open(latest / shard["file"], framework="pt") as f:
                pieces.append(f.get_tensor(key))
            if shard["rows"] is None:  # a scalar: every writer holds it
                break
        out[key] = pieces[0] if entry["shards"][0]["rows"] is None else torch.cat(pieces)
    return out


@pytest.mark.slow
def test_two_ranks_save_and_one_two_or_three_read_back_every_byte(tiny_shards, tiny_teacher_dir, tmp_path):
    """latest/ written by 2 FSDP2 ranks (each its own rows of the weights and AdamW's moments) and read
    back on 1, 2 and 3 ranks holds the same bytes when written again: resharding moves rows, never
    changes them. No rank unpickles anything, and the 2-rank resume ends bit-identical to an
    uninterrupted 2-rank run (test_fsdp2_two_ranks_match_one_process_and_resume)."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3,
                      global_batch=6, micro_batch=1)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(c)))
    torchrun(config_file, tmp_path / "two", "--stop-after-step", "6")   # latest/ at step 6, mid phase 1
    saved = tmp_path / "two" / "latest"
    assert sorted(p.name for p in saved.glob("*.safetensors")) == [
        "model.rank0-of-2.safetensors", "model.rank1-of-2.safetensors", "optimizer.rank0-of-2.safetensors",
        "optimizer.rank1-of-2.safetensors"]
    (tmp_path / "two" / "config.json").write_text(json.dumps(asdict(c)))
    script = tmp_path / "reshard.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + RESHARD)
    want = whole_tensors(saved)
    assert any("exp_avg_sq" in k for k in want) and any(k.endswith("/step") for k in want)
    for ranks in (1, 2, 3):
        target = tmp_path / f"again-{ranks}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", str(script),
               str(tmp_path / "two"), str(target)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
        assert len(list((target / "latest").glob("model.rank*"))) == ranks
        got = whole_tensors(target / "latest")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), ranks
