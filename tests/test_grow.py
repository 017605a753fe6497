"""grow.py: phase plans, schedules, accumulation, the protocols' trainable blocks, divergence, precision,
trackers, compiled layers, interventions under freeze. Resume and checkpoints: test_resume.py; FSDP2 on
torchrun ranks: test_fsdp2.py."""
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import distil_config, make_config, phase_weights

import checkpointing
import config
import grow
import kd
import model
import nets
import rundir
from plumbing import devices, errors
from plumbing.hf_qwen3 import ModelConfig

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



@pytest.mark.parametrize("decay_gains", [True, False])
def test_weight_decay_reaches_the_gains_only_when_asked(tiny_student, decay_gains):
    """With every gradient zero, AdamW's step is its decay alone (the moments are zero, so the Adam update
    is 0 / (0 + eps) = 0): each decayed parameter is multiplied by exactly (1 - lr * wd) in fp32 (one
    rounding of one product, the same as the reference below), and an exempt one is left bit for bit."""
    c = make_config(lr=0.25, weight_decay=0.5, decay_gains=decay_gains)
    params = grow.trainable_parameters(tiny_student, config.plan_phases(c)[0])
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    grow.build_optimizer(c, params).step()
    gains = [p.ndim == 1 for p in params]
    assert sum(gains) >= 4 and not all(gains)  # q/k norms, the layers' norms and the final norm; the matrices
    for p, old, gain in zip(params, before, gains):
        factor = 1.0 if gain and not decay_gains else 1 - 0.25 * 0.5
        assert torch.equal(p.detach(), old * factor)

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
            hidden = teacher(mb.input_ids, output_fn=nets.hidden_only, doc_lengths=mb.doc_lengths)
            loss, _, _ = nets.loss_fn(c, mb, hidden, teacher.head_weight, phase, step.global_targets, student)
            loss.backward()
            total += loss.item()
        results.append((total, [p.grad.clone() for p in params]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-12)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)


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


# ---- precision: decided by what the machine does --------------------------------------------------

def test_auto_precision_follows_the_measured_speed(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu = torch.device("cpu")
    probes = []
    # emulated bf16 (AVX2), bf16 no faster, AVX-512 bf16 (~2-4x), AMX (~14x)
    for measured, expected in ((0.04, torch.float32), (1.2, torch.float32), (2.4, torch.bfloat16), (13.7, torch.bfloat16)):
        devices.cpu_bf16_speedup.cache_clear()
        (tmp_path / "normgrow" / "cpu-precision.json").unlink(missing_ok=True)
        monkeypatch.setattr(devices, "matmul_speedup_bf16", lambda m=measured: probes.append(m) or m)
        dtype, why = devices.precision_choice("auto", cpu)
        assert dtype == expected and f"{measured:.1f}" in why
        assert why.startswith("auto: bf16" if expected == torch.bfloat16 else "auto: fp32")
    assert probes == [0.04, 1.2, 2.4, 13.7]
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


def test_the_instruction_line_names_the_bf16_matmul_units(monkeypatch):
    """provenance.json's instruction line: torch's capability, then the bf16 units an AVX-512 build reaches
    through oneDNN (AMX multiplies bf16 ~14x as fast as fp32: the probe then picks bf16), unless
    ONEDNN_MAX_CPU_ISA holds oneDNN below them (as a run restricted to AVX2 sets it, beside ATEN_CPU_CAPABILITY)."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    for capability, expected in (("AVX512", "AVX512 + AVX512-BF16 + AMX"), ("AVX2", "AVX2"), ("DEFAULT", "DEFAULT")):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert devices.cpu_instructions() == expected
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    for limit, expected in (("AVX512_CORE", "AVX512"), ("avx512_core_bf16", "AVX512 + AVX512-BF16"),
                            ("AVX512_CORE_AMX", "AVX512 + AVX512-BF16 + AMX"), ("ALL", "AVX512 + AVX512-BF16 + AMX")):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
        assert devices.cpu_instructions() == expected
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)  # a Zen 4 or Cooper Lake
    assert devices.cpu_instructions() == "AVX512 + AVX512-BF16"


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


# ---- interventions under freeze, transplants -----------------------------------------------------


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
    assert checkpointing.names_in(net, "post,pre,pre")("norm.weight") == "norm.weight"
    stored_post = checkpointing.names_in(net, "post")
    assert stored_post("norm.weight") is None and stored_post("entry_norm.weight") == "norm.weight"


# ---- progress: "run i of n", the time left, nothing shown before it is measured ------------------------------

def test_runs_are_numbered_across_a_lockstep_group_and_across_seeds(tiny_shards, tiny_teacher_dir, tmp_path, capsys):
    """Seed 1's grow, freeze (from grow's phase 0) and joint in one lockstep group, then seed 2's each alone: six
    runs of one command, numbered in the order they start (freeze once grow's phase 0 is written); a done run
    found again keeps its number. Steps
    planned: grow 3 phases x 2, freeze the 2 x 2 after the phase it shares, joint 2."""
    import re

    from plumbing import progress
    counted = progress.Runs()

    def jobs(seed):
        folder = tmp_path / f"s{seed}"
        return [(distil_config(tiny_shards, tiny_teacher_dir, name=f"{protocol}-s{seed}", protocol=protocol, seed=seed,
                               phase_steps=2, start_from=str(folder / "grow" / "phase-0") if protocol == "freeze" else ""),
                 folder / protocol) for protocol in ("grow", "freeze", "joint")]
    counted.plan(jobs(1) + jobs(2))
    assert sorted(counted.left.values()) == [2, 2, 4, 4, 6, 6] and counted.seconds_left() is None
    grow.train_together(jobs(1), counted=counted)
    for job in jobs(2):
        grow.train_together([job], counted=counted)
    grow.train_together(jobs(1), counted=counted)  # found done: nothing trains, nothing is counted again
    labels = re.findall(r"^run (\d) of (\d): (\S+): ", capsys.readouterr().out, re.MULTILINE)
    assert labels == [("1", "6", "grow-s1"), ("2", "6", "joint-s1"), ("3", "6", "freeze-s1"),
                      ("4", "6", "grow-s2"), ("5", "6", "freeze-s2"), ("6", "6", "joint-s2")]
    assert counted.finished() == 6 and counted.seconds_left() == 0.0


def test_the_time_left_is_the_steps_left_at_the_rate_measured_after_the_first_step():
    """Two runs in lockstep, a grow of 12 steps and a freeze of 8 of its own, a step of each every 3 s (the
    first pays the warm-up and is not measured): after 3 steps each, a has 9 left (27 s), b 5 (15 s); all of
    the command's 14 steps left at 7 s over 5 run-steps, 19.6 s."""
    from plumbing import progress
    ticks = iter([100.0, 101.0, 103.0, 104.0, 106.0, 107.0])
    counted = progress.Runs(clock=lambda: next(ticks))
    counted.plan([(make_config(phase_steps=4), "a"), (make_config(phase_steps=4, protocol="freeze",
                                                                  start_from="a/phase-0"), "b")])
    counted.opened("a", 0, 12), counted.opened("b", 4, 12)
    counted.stepped("a")
    assert counted.seconds_left("a") is None and counted.seconds_left() is None  # one step: no rate yet
    for run in "bababb"[:5]:
        counted.stepped(run)
    assert counted.left == {Path("a").absolute(): 9, Path("b").absolute(): 5}
    assert counted.seconds_left("a") == pytest.approx(27.0) and counted.seconds_left("b") == pytest.approx(15.0)
    assert counted.seconds_left() == pytest.approx(14 * 7 / 5) and counted.label("b") == "run 2 of 2"
    assert progress.clock_text(6465.0) == "1:47:45" and progress.clock_text(None) == "--"


def test_a_bar_shows_dashes_not_nan_before_its_first_step():
    """Before: "loss --  -- tok/s  -- left" (it said "loss nan  0 tok/s"); after one step the loss and rate, the
    time left only after a second."""
    import io

    from rich.console import Console

    from plumbing import progress
    ticks = iter([0.0, 2.0])
    bars = progress.Bars(devices.Dist(), progress.Runs(clock=lambda: next(ticks)),
                         [(make_config(phase_steps=4), "a"), (make_config(phase_steps=4), "b")])
    bars.rich = progress.rich_progress()  # as on a terminal

    def shown():
        out = io.StringIO()
        Console(file=out, width=200).print(bars.rich.get_renderable())
        return out.getvalue()
    bars.add("a", "pre-grow", 0, 12)
    assert "run 1 of 2: pre-grow" in shown() and "loss --  -- tok/s  -- left" in shown() and "nan" not in shown()
    bars.step("a", 5.25, 1234.4)
    assert "loss 5.2500  1,234 tok/s  -- left" in shown()
    bars.step("a", 5.0, 1300.0)
    assert "loss 5.0000  1,300 tok/s  0:00:20 left" in shown()  # 10 steps left at 2 s
