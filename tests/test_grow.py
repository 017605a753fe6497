"""grow.py: phase plans, schedules, accumulation, resume, shared prefixes, FSDP2 under torchrun."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import distil_config, make_config, torchrun

import config
import grow
import kd
import model
import nets
import rundir
from plumbing import checkpoint, devices, errors, locks
from plumbing.hf_qwen3 import ModelConfig

ROOT = Path(__file__).resolve().parents[1]


# ---- phase plans and schedules ----------------------------------------------------------------

def test_grow_phase_plan():
    phases = config.plan_phases(make_config(protocol="grow"))
    assert [(p.active_blocks, p.trainable_blocks, p.trains_head, p.first_step) for p in phases] == [
        (1, (0,), True, 0), (2, (0, 1), True, 200), (3, (0, 1, 2), True, 400)]


def test_joint_freeze_and_long_plans():
    assert [(p.active_blocks, p.trainable_blocks) for p in config.plan_phases(make_config(protocol="joint"))] == [
        (3, (0, 1, 2))]
    freeze = config.plan_phases(make_config(protocol="freeze"))
    assert [(p.active_blocks, p.trainable_blocks, p.trains_head) for p in freeze] == [
        (1, (0,), True), (2, (1,), False), (3, (2,), False)]
    keep_head = config.plan_phases(make_config(protocol="freeze", freeze_trains_head=True))
    assert [p.trains_head for p in keep_head] == [True, True, True]
    long = config.plan_phases(make_config(protocol="joint-long", joint_phases=3))
    assert [(p.active_blocks, p.first_step, p.steps) for p in long] == [(3, 0, 200), (3, 200, 200), (3, 400, 200)]


def test_learning_rate_warmup_cosine_and_restart():
    c = make_config(phase_steps=200, warmup_frac=0.05, lr=1e-3, min_lr=1e-5)  # warmup = 10 steps
    assert config.learning_rate(c, 0) == pytest.approx(1e-4)
    assert config.learning_rate(c, 9) == pytest.approx(1e-3)          # warmup end: peak
    assert config.learning_rate(c, 10) == pytest.approx(1e-3)         # cosine starts at peak
    assert config.learning_rate(c, 105) == pytest.approx((1e-3 + 1e-5) / 2)  # halfway through the cosine
    assert config.learning_rate(c, 199) == pytest.approx(1e-5, abs=2e-7)     # phase end: near the minimum
    # The paper's schedule: 750 warmup steps in a 50k-step phase.
    paper = make_config(phase_steps=50_000, warmup_frac=0.015, lr=1e-4, min_lr=1e-6)
    assert config.learning_rate(paper, 749) == pytest.approx(1e-4)
    assert config.learning_rate(paper, 374) == pytest.approx(5e-5)


@pytest.fixture
def tiny_student():
    teacher = model.Qwen3(ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    teacher.init_weights(0)
    return model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="post", seed=1)


@pytest.mark.parametrize("protocol", ["grow", "freeze"])
def test_trainable_parameters_per_phase(tiny_student, protocol):
    phases = config.plan_phases(make_config(protocol=protocol))
    per_layer = sum(p.numel() for p in tiny_student.layers[0].parameters())
    head_and_norm = tiny_student.lm_head.weight.numel() + tiny_student.norm.weight.numel()
    counts = []
    for phase in phases:
        params = grow.trainable_parameters(tiny_student, phase)
        optimizer = grow.build_optimizer(make_config(), params)
        counts.append(sum(p.numel() for g in optimizer.param_groups for p in g["params"]))
        assert not tiny_student.embed_tokens.weight.requires_grad
        assert all(p.requires_grad for p in params)
        assert sum(p.numel() for p in tiny_student.parameters() if p.requires_grad) == counts[-1]
    if protocol == "grow":
        assert counts == [2 * per_layer + head_and_norm, 4 * per_layer + head_and_norm, 6 * per_layer + head_and_norm]
    else:
        assert counts == [2 * per_layer + head_and_norm, 2 * per_layer, 2 * per_layer]


# ---- runs on tiny shards and a tiny teacher ---------------------------------------------------

def test_accumulation_equals_whole_batch(tiny_shards, tiny_teacher_dir):
    """One step over 4 micro-batches equals one step over the whole batch (float64)."""
    import data
    c = distil_config(tiny_shards, tiny_teacher_dir)
    teacher = model.load_qwen3(tiny_teacher_dir, dtype=torch.float64)
    phase = config.plan_phases(c)[1]
    results = []
    for micro in (2, 8):
        student = model.Student.from_teacher(teacher, 3, 1, "post", seed=3, dtype=torch.float64)
        params = grow.trainable_parameters(student, phase)
        step = next(data.Batcher(tiny_shards[0], 8, seed=0, replay_docs=40, micro_batch=micro))
        assert len(step.micro_batches) == 8 // micro
        total = 0.0
        for mb in step.micro_batches:
            hidden = teacher(mb.input_ids, output_fn=nets.hidden_only)
            loss, _, _ = nets.loss_fn(c, mb, hidden, teacher.head_weight, phase, step.global_targets, student)
            loss.backward()
            total += loss.item()
        results.append((total, [p.grad.clone() for p in params]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-12)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)


def phase_weights(run_dir, phase):
    """A phase checkpoint's tensors: model.safetensors (one process) or the files of its HF index (FSDP2)."""
    return kept_weights(Path(run_dir) / f"phase-{phase}")


def kept_weights(folder: Path) -> dict:
    from safetensors.torch import load_file
    return {k: v for file in sorted(set(checkpoint.tensor_files(folder).values())) for k, v in load_file(file).items()}


def block_tensors(state, block):
    return {k: v for k, v in state.items() if k.startswith(f"layers.{block}.")}


def test_freeze_keeps_earlier_blocks_and_grow_retrains_them(tiny_shards, tiny_teacher_dir, tmp_path):
    grow.train(distil_config(tiny_shards, tiny_teacher_dir, protocol="freeze"), tmp_path / "freeze")
    grow.train(distil_config(tiny_shards, tiny_teacher_dir, protocol="grow"), tmp_path / "grow")
    freeze = [phase_weights(tmp_path / "freeze", p) for p in range(3)]
    grown = [phase_weights(tmp_path / "grow", p) for p in range(3)]
    for block in (0, 1):  # a frozen block is bit-identical in every later phase
        for later in range(block + 1, 3):
            assert all(torch.equal(v, freeze[later][k]) for k, v in block_tensors(freeze[block], block).items())
    assert torch.equal(freeze[0]["lm_head.weight"], freeze[2]["lm_head.weight"])  # the paper: only the new block
    assert not torch.equal(grown[0]["lm_head.weight"], grown[2]["lm_head.weight"])
    assert not torch.equal(grown[0]["layers.0.mlp.up_proj.weight"], grown[2]["layers.0.mlp.up_proj.weight"])
    # Phase 0 is the same in both protocols (the cache shares it), and an appended block enters with
    # the weights it was built with: block 2 is untouched until phase 2.
    assert all(torch.equal(v, grown[0][k]) for k, v in freeze[0].items())
    assert all(torch.equal(v, grown[1][k]) for k, v in block_tensors(grown[0], 2).items())
    rows = rundir.read_metrics(tmp_path / "grow")
    steps = [r for r in rows if "eval" not in r]
    assert [r["step"] for r in steps] == list(range(1, 19))
    assert steps[-1]["active_layer_tokens"] == sum(r["tokens"] * (r["phase"] + 1) for r in steps)
    evals = [r for r in rows if r.get("eval") and not r.get("phase_start")]
    assert [r["step"] for r in evals] == [3, 6, 9, 12, 15, 18]
    starts = [(r["step"], r["phase"]) for r in rows if r.get("phase_start")]
    assert starts == [(0, 0), (6, 1), (12, 2)]  # every phase is evaluated before its first update
    assert all(math.isfinite(r["ce"]) and r["ppl"] == pytest.approx(math.exp(r["ce"])) for r in evals)


def test_finished_run_is_reused_and_other_config_refused(tiny_shards, tiny_teacher_dir, tmp_path):
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", phase_steps=3)
    first = grow.train(c, tmp_path / "r")
    mtime = (tmp_path / "r" / "phase-0" / "model.safetensors").stat().st_mtime_ns
    assert grow.train(c, tmp_path / "r") == first
    assert (tmp_path / "r" / "phase-0" / "model.safetensors").stat().st_mtime_ns == mtime
    with pytest.raises(errors.TrainingError, match="differs in lr.*--force"):
        grow.train(replace(c, lr=1e-2), tmp_path / "r")
    again = grow.train(replace(c, lr=1e-2), tmp_path / "r", force=True)
    assert again["ce"] != first["ce"]


def strict_json(path):
    """The file parsed as strict JSON: NaN or Infinity anywhere fails."""
    def refuse(constant):
        raise AssertionError(f"{path}: {constant} is not JSON")
    return json.loads(Path(path).read_text(), parse_constant=refuse)


def test_a_non_finite_loss_is_a_divergence_recorded_with_its_step(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    """A NaN loss at step 5: done.json records the divergence (step, why, the values as text, the last good
    checkpoint, which stays), its numbers are null and the file is strict JSON; a rerun reuses the outcome."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint")
    real = kd.kd_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss, kd_term, ce_term = real(*args, **kwargs)
        return (loss * float("nan"), kd_term, ce_term) if calls["n"] > 2 * 4 else (loss, kd_term, ce_term)

    monkeypatch.setattr(kd, "kd_loss", poisoned)
    result = grow.train(c, tmp_path / "r")
    done = strict_json(tmp_path / "r" / "done.json")
    assert result == done and done["ce"] is None and done["ppl"] is None and done["step"] == 4  # steps taken
    record = done["diverged"]
    assert record["step"] == 5 and "non-finite loss" in record["why"] and record["values"]["loss"] == "nan"
    assert record["last_good_checkpoint"] == "latest"
    assert json.loads((tmp_path / "r" / "latest" / "trainer_state.json").read_text())["step"] == 4
    assert all(math.isfinite(r["loss"]) for r in rundir.read_metrics(tmp_path / "r") if "loss" in r)
    monkeypatch.setattr(kd, "kd_loss", real)
    assert grow.train(c, tmp_path / "r") == done  # an outcome: reused, not retrained


@pytest.mark.parametrize("on_divergence", ["stop", "continue"])
def test_a_validation_ce_above_the_ceiling_is_a_divergence(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch,
                                                          on_divergence):
    """The evaluation at step 3 reads log V + 1.5 (worse than uniform by more than the margin of 1): recorded
    as diverged at step 3; "stop" ends there, "continue" trains to the end and still records it."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", on_divergence=on_divergence)
    real = nets.evaluate

    def inflated(config, net, *args, **kwargs):
        scores = real(config, net, *args, **kwargs)
        inflate = inflated.calls == 2  # the start, then step 3
        return {**scores, "ce": math.log(net.embed_tokens.num_embeddings) + 1.5} if inflate else scores
    inflated.calls = 0

    def counting(*args, **kwargs):
        inflated.calls += 1
        return inflated(*args, **kwargs)

    monkeypatch.setattr(nets, "evaluate", counting)
    done = grow.train(c, tmp_path / "r")
    assert done["ce"] is None and done["diverged"]["step"] == 3 and "uniform" in done["diverged"]["why"]
    assert done["step"] == (3 if on_divergence == "stop" else c.phase_steps)
    assert strict_json(tmp_path / "r" / "done.json") == done


def test_a_run_that_ends_far_above_its_best_is_a_divergence(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    """The endpoint 1.2 above the run's best evaluation (margin 1; the ceiling out of the way)."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", diverged_above_uniform=100.0)
    real = nets.evaluate
    evaluations = []

    def worse_at_the_end(config, net, *args, **kwargs):
        scores = real(config, net, *args, **kwargs)
        evaluations.append(scores["ce"])
        return {**scores, "ce": scores["ce"] + 1.2} if len(evaluations) == 3 else scores  # start, step 3, step 6

    monkeypatch.setattr(nets, "evaluate", worse_at_the_end)
    done = grow.train(c, tmp_path / "r")
    assert len(evaluations) == 3 and done["diverged"]["step"] == 6 and "above its best" in done["diverged"]["why"]


def start_run(config_file, run_dir):
    return subprocess.Popen([sys.executable, str(ROOT / "grow.py"), str(config_file), "--run-dir", str(run_dir)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_when(proc, condition, timeout=120):
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def logged_steps(run_dir):
    return max([r["step"] for r in rundir.read_metrics(run_dir)], default=0)


@pytest.mark.slow
def test_sigkill_mid_phase_and_at_transition_resumes_bit_identical(tiny_shards, tiny_teacher_dir, tmp_path):
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=5, checkpoint_interval=2)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(c)))
    reference = grow.train(c, tmp_path / "reference")

    run_dir = tmp_path / "killed"
    grow.train(c, run_dir, stop_after_step=1)  # stopped before its first checkpoint: a rerun starts at step 0
    assert rundir.newest_checkpoint(run_dir) is None and logged_steps(run_dir) == 1
    kill_when(start_run(config_file, run_dir), lambda: logged_steps(run_dir) >= 3)  # mid-phase 0
    assert not (run_dir / "done.json").exists()
    kill_when(start_run(config_file, run_dir), lambda: (run_dir / "phase-1").is_dir())  # right at a transition
    assert not (run_dir / "done.json").exists()
    proc = start_run(config_file, run_dir)
    assert proc.wait() == 0, proc.stderr.read().decode()[-3000:]

    assert json.loads((run_dir / "done.json").read_text()) == reference
    for p in range(3):
        a, b = phase_weights(tmp_path / "reference", p), phase_weights(run_dir, p)
        assert all(torch.equal(a[k], b[k]) for k in a), f"phase {p} differs"
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert strip(rundir.read_metrics(run_dir)) == strip(rundir.read_metrics(tmp_path / "reference"))


HOLD = ("import sys, time\nfrom plumbing import locks\nwith locks.held([sys.argv[1]]):\n    print('held', flush=True)\n"
        "    time.sleep(600)\n")


def test_a_held_folder_is_waited_for_or_refused_and_a_killed_holder_releases_it(tmp_path):
    """Another process holds a run folder: --no-wait stops in one line naming its pid; a waiter says who
    it waits for and takes the folder once the holder is SIGKILLed; nothing is left beside the folder."""
    import threading
    folder = tmp_path / "runs" / "smoke" / "s42" / "pre-grow"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(errors.TrainingError, match=f"in use by process {holder.pid} .*without --no-wait"):
            with locks.held([folder], wait=False):
                pass
        said = []
        threading.Timer(1.0, holder.send_signal, (signal.SIGKILL,)).start()
        with locks.held([folder], say=said.append):
            assert holder.wait(timeout=5) == -signal.SIGKILL  # we got the folder only after the kill
            assert locks.lock_file(folder).read_text().startswith(f"process {os.getpid()} ")
        assert len(said) == 1 and f"in use by process {holder.pid}" in said[0] and "waiting" in said[0]
    finally:
        holder.kill()
    assert not list((tmp_path / "runs").rglob("*.lock"))  # the lock file went with its last holder


def test_a_finished_run_is_reused_while_another_process_holds_it(tiny_shards, tiny_teacher_dir, tmp_path):
    """Two experiments that both reuse the suite's finished runs never wait on each other: a done run
    with the same config is read without being held; one of another config is still held (and refused
    under --no-wait while another process holds it)."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", phase_steps=2)
    done = grow.train(c, tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert grow.train(c, tmp_path / "run", wait=False) == done
        with pytest.raises(errors.TrainingError, match=f"in use by process {holder.pid}"):
            grow.train(replace(c, lr=1e-3), tmp_path / "run", force=True, wait=False)
    finally:
        holder.kill()


@pytest.mark.slow
def test_two_trains_of_one_run_at_once_end_as_one_run_even_when_the_holder_is_killed(tiny_shards, tiny_teacher_dir,
                                                                                       tmp_path):
    """The same run started twice at once: the second waits, then finds it done; a holder SIGKILLed mid-run
    is taken over by its waiter, which resumes. Both end with the weights and complete metrics log of one
    uninterrupted run."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=5, checkpoint_interval=2)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(c)))
    reference = grow.train(c, tmp_path / "reference")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    for name, kill_first in (("together", False), ("killed", True)):
        run_dir = tmp_path / name
        first = start_run(config_file, run_dir)
        while logged_steps(run_dir) < 3:
            assert first.poll() is None, first.stderr.read().decode()[-2000:]
            time.sleep(0.01)
        if kill_first:
            first.send_signal(signal.SIGSTOP)  # held mid-run: it cannot finish before the kill
        second = start_run(config_file, run_dir)
        if kill_first:
            time.sleep(1.0)  # the second is waiting on the lock by now (or about to)
            first.send_signal(signal.SIGKILL)
        assert [p.wait() for p in (first, second)] == [-signal.SIGKILL if kill_first else 0, 0]
        assert json.loads((run_dir / "done.json").read_text()) == reference
        assert strip(rundir.read_metrics(run_dir)) == strip(rundir.read_metrics(tmp_path / "reference"))
        for p in range(3):
            a, b = phase_weights(tmp_path / "reference", p), phase_weights(run_dir, p)
            assert all(torch.equal(a[k], b[k]) for k in a), f"{name}: phase {p} differs"
        assert not list(tmp_path.glob(".*.lock"))


@pytest.mark.slow
def test_fsdp2_two_ranks_match_one_process_and_resume(tiny_shards, tiny_teacher_dir, tmp_path):
    """Two ranks, stopped and resumed, end bit-identical to one process: each rank's micro-batch is one
    of the process's two (8 documents, 4 per micro-batch), so each gradient is the same sum of the same
    terms, and the clipping coefficient is the same float32 (devices.clip_gradients)."""
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


# ---- precision: decided by what the machine does --------------------------------------------------

def test_auto_precision_follows_the_measured_speed(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu = torch.device("cpu")
    probes = []
    for measured, expected in ((0.04, torch.float32), (1.2, torch.float32), (2.4, torch.bfloat16)):
        devices.cpu_bf16_speedup.cache_clear()
        (tmp_path / "normgrow" / "cpu-precision.json").unlink(missing_ok=True)
        monkeypatch.setattr(devices, "matmul_speedup_bf16", lambda m=measured: probes.append(m) or m)
        dtype, why = devices.precision_choice("auto", cpu)
        assert dtype == expected and f"{measured:.1f}" in why
        assert why.startswith("auto: bf16" if expected == torch.bfloat16 else "auto: fp32")
    assert probes == [0.04, 1.2, 2.4]
    # Cached per machine: a new process (cache cleared) reads the file instead of probing again.
    devices.cpu_bf16_speedup.cache_clear()
    monkeypatch.setattr(devices, "matmul_speedup_bf16", lambda: pytest.fail("probed again"))
    assert devices.precision_choice("auto", cpu)[0] == torch.bfloat16
    # Set by the preset: no probe; CUDA: the GPU's bf16 support decides.
    assert devices.precision_choice("fp32", cpu) == (torch.float32, "fp32 (set by the preset)")
    assert devices.precision_choice("bf16", cpu)[0] == torch.bfloat16
    for supported, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        assert devices.precision_choice("auto", torch.device("cuda"))[0] == expected
    devices.cpu_bf16_speedup.cache_clear()
    with pytest.raises(errors.ConfigError, match="precision 'fp16' is unknown"):
        make_config(precision="fp16")


def test_the_precision_choice_is_recorded(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    devices.cpu_bf16_speedup.cache_clear()
    monkeypatch.setattr(devices, "matmul_speedup_bf16", lambda: 0.03)  # bf16 emulated: fp32
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", phase_steps=2, precision="auto")
    grow.train(c, tmp_path / "r")
    devices.cpu_bf16_speedup.cache_clear()
    prov = json.loads((tmp_path / "r" / "provenance.json").read_text())
    assert prov["precision"] == "float32" and "0.03x as fast as fp32" in prov["precision_reason"]


def test_device_auto_picks_cuda_then_mps_then_cpu(monkeypatch):
    for cuda, mps, expected in ((True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda c=cuda: c)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda m=mps: m)
        assert devices.choose_device("auto").type == expected
        assert devices.choose_device("cpu").type == "cpu"
    with pytest.raises(errors.TrainingError, match="--device cuda: this machine has no such device"):
        devices.choose_device("cuda")
    with pytest.raises(errors.TrainingError, match="--device mps"):
        devices.choose_device("mps")
    # bf16 autocast only where the device supports it: never on MPS.
    assert devices.precision_choice("auto", torch.device("mps"))[0] == torch.float32


def test_tracker_gets_the_same_rows_as_metrics_jsonl(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    """W&B (a recording stand-in for the package) receives every step's loss, LR and gradient norm and
    every evaluation, at the log's steps and with the log's values."""
    import types
    calls = {"log": [], "init": None, "finished": 0}

    class Run:
        def log(self, values, step):
            calls["log"].append((step, values))

        def finish(self):
            calls["finished"] += 1

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls.__setitem__("init", kwargs) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    rundir.check_tracker("wandb")
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=3)
    grow.train(c, tmp_path / "r", tracker="wandb")
    assert calls["init"]["project"] == "normgrow" and calls["init"]["config"]["lr"] == c.lr and calls["finished"] == 1
    expected = []
    for row in rundir.read_metrics(tmp_path / "r"):
        kind = "phase_start" if row.get("phase_start") else "eval" if row.get("eval") else "train"
        expected.append((row["step"], {f"{kind}/{k}": v for k, v in row.items()
                                       if k not in ("step", "eval", "phase_start") and not isinstance(v, bool)}))
    assert calls["log"] == expected
    assert {"train/loss", "train/lr", "train/grad_norm"} <= set(calls["log"][1][1])
    assert any("eval/ce" in values for _, values in calls["log"])


def test_missing_tracker_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(errors.TrainingError, match="--log tensorboard: the tensorboard package is not installed; "
                                                 "pip install tensorboard"):
        rundir.check_tracker("tensorboard")


def test_damaged_run_files_are_one_line_errors_naming_the_file(tiny_shards, tiny_teacher_dir, tmp_path):
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", phase_steps=2)
    done = grow.train(c, tmp_path / "r")
    (tmp_path / "r" / "done.json").write_text('{"step": 2}')
    with pytest.raises(errors.TrainingError, match=r"done\.json: lacks ce, ppl, kd"):
        grow.train(c, tmp_path / "r")
    (tmp_path / "r" / "config.json").write_text("{not json")
    with pytest.raises(errors.TrainingError, match=r"r/config\.json: not valid JSON .*--force"):
        grow.train(c, tmp_path / "r")
    assert grow.train(c, tmp_path / "r", force=True) == done  # the kit's own damaged run is redone
    assert nets.perplexity(800.0) == math.inf and nets.perplexity(1.0) == pytest.approx(math.e)


def test_disk_full_while_checkpointing_says_so_and_resumes(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    import errno
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=3, checkpoint_interval=2)
    reference = grow.train(c, tmp_path / "reference")
    real = checkpoint.write_weights

    def full_disk(folder, *args, **kwargs):
        if Path(folder).name == "phase-1.tmp":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "write_weights", full_disk)
    with pytest.raises(errors.TrainingError, match=r"no space left on device while writing .*phase-1; the previous "
                                                 r"checkpoint .*latest is intact: free some space"):
        grow.train(c, tmp_path / "r")
    monkeypatch.setattr(checkpoint, "write_weights", real)  # space freed
    assert grow.train(c, tmp_path / "r") == reference


@pytest.mark.slow
def test_a_file_size_limit_while_checkpointing_says_so_and_resumes(tiny_shards, tiny_teacher_dir, tmp_path):
    """A real limit, not a mock: the run's process under `ulimit -f` (RLIMIT_FSIZE) too small for a
    checkpoint fails with one line naming the folder and the limit; rerun without it, it ends as an
    uninterrupted run."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=3, checkpoint_interval=2)
    reference = grow.train(c, tmp_path / "reference")
    script = ("import json, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY)); "
              "import config, grow; grow.train(config.RunConfig(**json.loads(sys.argv[1])), sys.argv[2])")
    limited = subprocess.run([sys.executable, "-c", script, json.dumps(asdict(c)), str(tmp_path / "r")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert limited.returncode != 0
    assert "a file-size limit (ulimit -f) was reached while writing" in limited.stderr.splitlines()[-1]
    assert grow.train(c, tmp_path / "r") == reference


@pytest.mark.slow
def test_compiled_layers_match_eager_and_compile_once_for_every_length(tiny_shards, tiny_teacher_dir):
    """--compile: one dynamic-shape compile of the layers serves every padded length of a run, and
    its outputs and gradients equal eager ones within fp32 rounding."""
    from torch._dynamo.utils import counters
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint")
    ctx = devices.Dist()
    teacher = nets.load_teacher(c, ctx, torch.float32)
    eager = nets.build_model(c, teacher, ctx, torch.float32)
    compiled = nets.build_model(replace(c, compile=True), teacher, ctx, torch.float32)
    torch._dynamo.reset()
    counters.clear()
    for length in (9, 17, 31):
        ids = torch.randint(0, 500, (2, length), generator=torch.Generator().manual_seed(length))
        outputs = []
        for net in (eager, compiled):
            net.zero_grad(set_to_none=True)
            hidden = net(ids, output_fn=nets.hidden_only)
            hidden.pow(2).mean().backward()
            outputs.append((hidden.detach(), [p.grad for p in net.parameters() if p.requires_grad]))
        (a, grads_a), (b, grads_b) = outputs
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        for ga, gb in zip(grads_a, grads_b):
            torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-6)
    # One graph for the layers' forward (all layers share it), compiled once for all three lengths.
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_long_controls_can_carry_adams_moments_across_lr_restarts(tiny_shards, tiny_teacher_dir, tmp_path):
    """restart_optimizer=False: the second phase continues the first one's AdamW (same first phase,
    another second one), and a run stopped right at the restart resumes to the same result."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint-long", joint_phases=2, phase_steps=4,
                   checkpoint_interval=3, restart_optimizer=False)
    keep = grow.train(c, tmp_path / "keep")
    restart = grow.train(replace(c, restart_optimizer=True), tmp_path / "restart")
    assert all(torch.equal(v, phase_weights(tmp_path / "restart", 0)[k]) for k, v in
               phase_weights(tmp_path / "keep", 0).items())
    assert keep["ce"] != restart["ce"]
    grow.train(c, tmp_path / "stopped", stop_after_step=4)  # the first phase's end
    assert json.loads((tmp_path / "stopped" / "latest" / "trainer_state.json").read_text())["step"] == 4
    assert grow.train(c, tmp_path / "stopped") == keep
    a, b = phase_weights(tmp_path / "keep", 1), phase_weights(tmp_path / "stopped", 1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert strip(rundir.read_metrics(tmp_path / "stopped")) == strip(rundir.read_metrics(tmp_path / "keep"))


def test_resume_reads_no_pickle(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    """latest/ is safetensors and JSON: a resume with every unpickling entry point disabled reaches the
    same result as an uninterrupted run."""
    import pickle
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    reference = grow.train(c, tmp_path / "reference")
    grow.train(c, tmp_path / "r", stop_after_step=7)  # a rolling checkpoint at step 6, mid phase 1
    latest = sorted(p.name for p in (tmp_path / "r" / "latest").iterdir())
    assert latest == sorted((*rundir.latest_files(1), checkpoint.CHECKSUMS))

    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    assert grow.train(c, tmp_path / "r") == reference
    a, b = phase_weights(tmp_path / "reference", 2), phase_weights(tmp_path / "r", 2)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_rolling_checkpoint_of_an_older_kit_is_one_line(tiny_shards, tiny_teacher_dir, tmp_path):
    """latest/ as older versions wrote it (DCP files, or gathered safetensors; no index, no checksums):
    one line, never unpickled."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint", checkpoint_interval=2)
    grow.train(c, tmp_path / "r", stop_after_step=3)
    latest = tmp_path / "r" / "latest"
    for name in (checkpoint.CHECKSUMS, checkpoint.SHARDED_INDEX, *(p.name for p in latest.glob("*.safetensors"))):
        (latest / name).unlink()
    (latest / ".metadata").write_bytes(b"\x80\x04not read")
    (latest / "model.safetensors").write_bytes(b"\x80\x04not read either")
    with pytest.raises(errors.TrainingError, match=r"latest: lacks index.json .* move the folder"):
        grow.train(c, tmp_path / "r")


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


def test_a_damaged_newest_checkpoint_is_passed_over_for_an_older_one(tiny_shards, tiny_teacher_dir, tmp_path, capsys):
    """Every checkpoint carries checksums of its files: a latest/ whose weights changed on disk is named
    in a one-line warning and the run resumes from phase-0/ instead, to the uninterrupted result."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    reference = grow.train(c, tmp_path / "reference")
    grow.train(c, tmp_path / "r", stop_after_step=7)  # latest/ at step 6, phase-0/ at step 4
    weights = tmp_path / "r" / "latest" / "model.rank0-of-1.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in a tensor
    weights.write_bytes(bytes(data))
    assert grow.train(c, tmp_path / "r") == reference
    assert "latest: damaged (model.rank0-of-1.safetensors does not match its checksum); resuming from an older " \
        "checkpoint" \
        in capsys.readouterr().out
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert strip(rundir.read_metrics(tmp_path / "r")) == strip(rundir.read_metrics(tmp_path / "reference"))


# ---- corruption of each file kind, with fallback -------------------------------------------------------

def flip_a_byte(file: Path):
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


DAMAGES = {"flipped": flip_a_byte, "truncated": lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
           "deleted": lambda f: f.unlink()}


@pytest.fixture(scope="module")
def stopped_run(tiny_shards, tiny_teacher_dir, tmp_path_factory):
    """(config, an uninterrupted run's folder and result, a run stopped at step 7: latest/ at step 6,
    phase-0/ at step 4)."""
    base = tmp_path_factory.mktemp("corruption")
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3)
    reference = grow.train(c, base / "reference")
    grow.train(c, base / "stopped", stop_after_step=7)
    return c, base / "reference", reference, base / "stopped"


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", [*rundir.latest_files(1), checkpoint.CHECKSUMS])
def test_each_damaged_file_of_the_rolling_checkpoint_falls_back_to_the_same_result(stopped_run, tmp_path, capsys,
                                                                                  name, damage):
    """Any file of latest/ flipped, truncated or deleted: the run names latest/ in a one-line warning,
    resumes from phase-0/ and ends with the uninterrupted run's result and metrics. (A deleted
    checksums.json reads as a checkpoint from before checksums: its intact files are used, same result.)"""
    c, reference_dir, reference, stopped = stopped_run
    run_dir = tmp_path / "r"
    shutil.copytree(stopped, run_dir)
    DAMAGES[damage](run_dir / "latest" / name)
    assert grow.train(c, run_dir) == reference
    warnings = [line for line in capsys.readouterr().out.splitlines() if ": damaged (" in line]
    if (name, damage) == (checkpoint.CHECKSUMS, "deleted"):
        assert not warnings
    else:
        assert len(warnings) == 1 and warnings[0].startswith(f"{run_dir / 'latest'}: damaged (")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert strip(rundir.read_metrics(run_dir)) == strip(rundir.read_metrics(reference_dir))


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "trainer_state.json"])
def test_each_damaged_file_of_a_kept_checkpoint_is_refused_on_load(stopped_run, tmp_path, name, damage):
    """A kept checkpoint (what eval, export, sample and the diagnostics read) with any file changed is
    a one-line CheckpointError naming the folder, never a silently different model."""
    _, reference_dir, _, _ = stopped_run
    ckpt = tmp_path / "phase-1"
    shutil.copytree(reference_dir / "phase-1", ckpt)
    DAMAGES[damage](ckpt / name)
    with pytest.raises(errors.CheckpointError) as error:
        model.Student.load(ckpt)
    assert len(str(error.value).splitlines()) == 1 and str(ckpt) in str(error.value)


def test_with_latest_and_the_phase_checkpoint_damaged_a_snapshot_is_the_resume_point(tiny_shards, tiny_teacher_dir,
                                                                                    tmp_path, capsys):
    """step-<n>/ is a resume point of last resort: weights only, so the run says that AdamW's moments
    restart there, and finishes."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", phase_steps=4, checkpoint_interval=3,
                   snapshot_interval=2)
    grow.train(c, tmp_path / "r", stop_after_step=7)   # latest/ 6, step-6/ 6, phase-0/ 4, step-2/ 2
    flip_a_byte(tmp_path / "r" / "latest" / "model.rank0-of-1.safetensors")
    result = grow.train(c, tmp_path / "r")
    out = capsys.readouterr().out
    assert "latest: damaged (model.rank0-of-1.safetensors does not match its checksum)" in out
    assert "step-6 holds weights but no AdamW state; its moments restart at step 6" in out
    assert math.isfinite(result["ce"]) and (tmp_path / "r" / "done.json").is_file()


# ---- sharded rolling checkpoints: each rank writes its own rows; any number of ranks reads them back ---

RESHARD = """
import json, sys
from pathlib import Path
import torch
import config, grow, nets, rundir
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
rundir.load_latest_checkpoint(source / "latest", net, optimizer, ctx)
target.mkdir(exist_ok=True)
rundir.write_latest_checkpoint(target, net, optimizer, state, ctx)
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


@pytest.mark.parametrize("boundary", ["rescale-fwd", "rescale-detached", "norm"])
def test_a_freeze_mode_intervention_leaves_every_prefix_weight_bit_identical(tiny_shards, tiny_teacher_dir, tmp_path,
                                                                             boundary):
    """Under freeze no gradient reaches the prefix: with any boundary intervention, blocks trained in an
    earlier phase end every later phase bit-identical, so only the forward boundary the appended block
    reads can differ from a run without it."""
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="freeze", phase_steps=3, boundary=boundary)
    grow.train(c, tmp_path / "r")
    phases = [phase_weights(tmp_path / "r", p) for p in range(3)]
    for p in (1, 2):
        for name, tensor in phases[p - 1].items():
            if name.startswith("layers.") and int(name.split(".")[1]) < p:
                assert torch.equal(tensor, phases[p][name]), (p, name)
    assert not torch.equal(phases[1]["layers.2.mlp.down_proj.weight"], phases[2]["layers.2.mlp.down_proj.weight"])


def test_a_transplant_adopts_the_other_placements_prefix_and_keeps_it_frozen(tiny_shards, tiny_teacher_dir, tmp_path):
    """The transplant factorial's post-norm prefix under pre-norm appended blocks: the freeze run adopts
    post-grow's phase 0, whose only norm (`norm`) is its entry norm, as its `entry_norm`, and reads
    nothing into its final norm, which post-norm lacks; block 0 and the entry norm stay bit-identical
    through every later phase."""
    grow.train(distil_config(tiny_shards, tiny_teacher_dir, protocol="grow", norm="post", phase_steps=3),
               tmp_path / "post-grow")
    source = phase_weights(tmp_path / "post-grow", 0)
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="freeze", norm="post,pre,pre", phase_steps=3,
                      start_from=str(tmp_path / "post-grow" / "phase-0"))
    grow.train(c, tmp_path / "transplant")
    for p in (1, 2):
        got = phase_weights(tmp_path / "transplant", p)
        assert torch.equal(got["entry_norm.weight"], source["norm.weight"]), p
        assert all(torch.equal(got[k], v) for k, v in block_tensors(source, 0).items()), p
    # the same schedule's own names are read as they are (no transplant: nothing renamed or skipped)
    net = model.Student.load(tmp_path / "transplant" / "phase-2")
    assert net.names_in("post,pre,pre")("norm.weight") == "norm.weight"
    assert net.names_in("post")("norm.weight") is None and net.names_in("post")("entry_norm.weight") == "norm.weight"
