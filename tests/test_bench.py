"""bench.py's GPU check, run on the CPU at tiny dimensions so its code paths (bf16 parity, the
activation-checkpointed distillation step, FSDP2 on one rank) are exercised without a GPU."""
import json
import math
from dataclasses import replace

import pytest
import torch
from bad_bench_files import BENCH_FILES, here
from conftest import TINY_MODEL

from plumbing.hf_qwen3 import ModelConfig
from tools import bench, utilization


@pytest.mark.slow
def test_gpu_check_code_paths_on_cpu(tmp_path):
    """gpucheck.py's every check on the CPU at tiny sizes (its plumbing; the numbers mean nothing here):
    each passes, and the driver really was killed after a save and resumed from it."""
    from tools import gpucheck
    results = gpucheck.gpu_check("cpu", out=tmp_path / "gpu_check.json")
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("ok") is False]
    assert not failed, {k: results[k] for k in failed}
    assert results["driver"]["killed_rc"] != 0 and results["driver"]["resumed_ce"] == results["driver"]["uninterrupted_ce"]
    assert results["throughput"]["finite"] and results["throughput"]["tokens"] == 52
    # the step-1 scenario first (grow's phase 0 alone), then every lockstep segment; the worst is the largest
    segments = results["memory_rehearsal"]["segments"]
    assert segments[0]["steps"] == "grow phase 0 alone" and len(segments) > 1
    assert results["memory_rehearsal"]["worst_gib"] == max(s["allocated_gib"] for s in segments) > 0
    assert (tmp_path / "gpu_check.json").is_file()


def test_interleaved_timing_takes_medians_or_keeps_every_round():
    calls = []
    seconds = utilization.interleaved({"a": (lambda: calls.append("a"), bench.nullcontext),
                                       "b": (lambda: calls.append("b"), bench.nullcontext)}, repeats=3)
    assert calls == ["a", "b"] * 5  # two warm-up rounds, then three timed ones, in turns
    assert set(seconds) == {"a", "b"} and all(math.isfinite(s) and s >= 0 for s in seconds.values())
    ticks = iter(range(100))  # each call of the clock one second later: every timed call takes 1 s
    rounds = utilization.interleaved({"a": (lambda: None, bench.nullcontext), "b": (lambda: None, bench.nullcontext)},
                                     repeats=3, pick=list, clock=lambda: next(ticks))
    assert rounds == {"a": [1, 1, 1], "b": [1, 1, 1]}


def test_a_ratio_is_the_median_of_paired_rounds_with_its_spread_and_verdict():
    """Two processes of three rounds: transformers' seconds over the kit's, round by round."""
    hf = ([0.30, 0.33, 0.36], [0.32, 0.30, 0.31])
    kit = ([0.20, 0.22, 0.24], [0.20, 0.20, 0.20])
    ratio = utilization.ratio_spread(list(zip(hf, kit)))  # rounds: 1.5, 1.5, 1.5; 1.6, 1.5, 1.55
    assert ratio.pop("per_process") == pytest.approx([1.5, 1.55], rel=1e-12)
    assert ratio == pytest.approx({"median": 1.5, "min": 1.5, "max": 1.6, "rounds": 6, "processes": 2, "stable": True},
                                  rel=1e-12)
    assert utilization.spread_text({**ratio, "per_process": []}) == "1.50x (1.50x-1.60x over 6 rounds in 2 processes)"
    # At the bound (UNSTABLE_SPREAD, 10% of the median either way) still a number; past it, unstable.
    assert utilization.UNSTABLE_SPREAD == 0.10
    at_bound = utilization.spread([[0.9, 1.0, 1.1]])
    assert at_bound["stable"] and utilization.spread_text(at_bound) == "1.00x (0.90x-1.10x over 3 rounds in 1 process)"
    for values in ([[0.89, 1.0, 1.1]], [[0.9, 1.0, 1.11]]):
        assert not utilization.spread(values)["stable"]
    wide = utilization.ratio_spread([([0.9, 1.5, 1.2], [1.0, 1.0, 1.0]), ([1.2], [1.0])])
    assert utilization.spread_text(wide) == "unstable (0.90x-1.50x over 4 rounds in 2 processes)"
    assert utilization.spread_text(utilization.spread([[0.41, 0.40]]), "{:.1%}".format) == \
        "40.5% (40.0%-41.0% over 2 rounds in 1 process)"
    with pytest.raises(ValueError):  # rounds that do not pair are a mistake, not a shorter ratio
        utilization.ratio_spread([([1.0, 2.0], [1.0])])


def test_a_fraction_of_peak_pairs_each_round_with_its_own_best_matmul():
    """A 2 GFLOP step in 0.1 s (20 GFLOP/s) and 0.2 s (10 GFLOP/s); the best matmul 40 GFLOP/s in both rounds,
    the 1024 one in the first and the 2048 one in the second: 50% and 25%."""
    mm1024, mm2048 = 2 * 1024**3, 2 * 2048**3
    fractions = utilization.round_fractions(2e9, [0.1, 0.2], {"matmul 1024 fp32": [mm1024 / 40e9, mm1024 / 20e9],
                                                              "matmul 2048 fp32": [mm2048 / 20e9, mm2048 / 40e9]})
    assert fractions == pytest.approx([0.5, 0.25], rel=1e-12)


def test_the_train_step_runs_in_fresh_processes_under_each_allocator_policy(monkeypatch):
    """At tiny shapes, one process a policy: each worker ran with exactly its policy's malloc settings (none of
    this process's own, which a user's fresh process would not have), the bf16 variants are skipped where the
    parent's probe finds bf16 emulated, and the speed-ups and seconds carry their spreads."""
    tiny = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    why = "auto: fp32 (a bf16 matmul ran 0.03x as fast as fp32 on this CPU, below 1.5x; bf16 is emulated or slow here)"
    monkeypatch.setattr(bench.devices, "precision_choice", lambda *a, **k: (bench.torch.float32, why))
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")  # the parent's own: reaches neither policy's worker
    results = bench.bench_train_step(repeats=1, processes=1, shapes=(tiny, 2, 1, 2))
    assert results["bf16"] == f"skipped: {why}" and "kit_post_bf16_s" not in results
    policies = results["policies"]
    assert policies["glibc default"]["allocator"] == [{}]
    assert policies["heap reused"]["allocator"] == [bench.ALLOCATOR_POLICIES["heap reused"]]
    for measured in policies.values():
        assert set(measured["seconds"]) == {"hf_fp32", "kit_pre_fp32", "kit_post_fp32"}
        assert set(measured["speedups"]) == {"pre_fp32_vs_hf_fp32", "post_fp32_vs_hf_fp32"}
        assert all(r["rounds"] == 1 and r["processes"] == 1 and r["median"] > 0 for r in measured["speedups"].values())
        assert all(n >= 0 for n in measured["minor_faults_per_step"].values())
    assert results["kit_post_fp32_s"] == policies["glibc default"]["seconds"]["kit_post_fp32"]["median"] > 0
    lines = bench.train_step_lines(results)
    assert lines[1].startswith("under glibc default (no malloc settings), 1 fresh processes; minor page faults")
    assert any(line.startswith("  pre: eager fp32 ") and "over 1 round in 1 process" in line for line in lines)


@pytest.mark.slow
def test_kd_loss_bench_smoke():
    r = bench.bench_loss(tokens=512, vocab=32768, hidden=32, repeats=1, chunk_size=64, processes=1)
    assert math.isfinite(r["memory_ratio"]) and r["memory_ratio"] > 0 and r["time_ratio"]["median"] > 0, str(r)
    assert math.isclose(r["chunked"][0]["loss"], r["naive"][0]["loss"], rel_tol=1e-4)
    # naive holds several 64 MiB [512 x 32768] fp32 tensors; chunked two 8 MiB buffers and small blocks
    assert r["chunked"][0]["peak_bytes"] < 0.5 * r["naive"][0]["peak_bytes"]


@pytest.mark.slow
def test_the_whole_bench_runs_at_tiny_sizes(tmp_path, monkeypatch):
    """`make bench`'s code path end to end (every row: train step, KD loss, tokenizer, loader, lockstep,
    compile) on a tiny model and a small toy shard, from a folder that is not the repository's."""
    from experiments import prepare_shards
    from plumbing import tokenizer
    tiny = replace(TINY_MODEL, vocab_size=4097)  # the toy tokenizer's vocabulary
    monkeypatch.setattr(bench, "toy_shapes", lambda: (tiny, 3, 1, 4))
    monkeypatch.chdir(tmp_path)
    prepare_shards.prepare("toy", tmp_path / "shard", tokenizer.qwen3_tokenizer(4096), max_len=32, n_train_docs=400,
                           n_val_docs=16, seed=42, workers=1, progress=False)
    sizes = {"kd": dict(tokens=256, vocab=4096, hidden=32, repeats=1, chunk_size=64, processes=1),
             "tokenizer_documents": 50, "lockstep_steps": 2, "loader_steps": 5, "cold_compile": False,
             "utilization_scales": ("smoke",), "train_step_processes": 1, "lockstep_processes": 1, "layout_steps": 1}
    results = bench.main(repeats=1, data_dir=tmp_path / "shard", sizes=sizes, out=tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(json.dumps(results))
    assert results["lockstep"]["identical_results"] and results["tokenizer"]["identical"]
    assert results["lockstep"]["lockstep_teacher_forwards"] < results["lockstep"]["separate_teacher_forwards"]
    assert results["lockstep"]["speedup"]["rounds"] == 1 and results["lockstep"]["separate_process_s"]["median"] > 0
    assert results["compile"]["max_relative_loss_difference"] < 1e-3  # fp32 compiled vs eager: reordered sums
    layout = results["layout"]
    assert layout["documents"] == 16 and layout["real_tokens"] < layout["padded_positions"]
    assert all(layout[kind][way]["seconds"] > 0 for kind in ("student", "teacher") for way in ("padded", "packed"))
    assert results["kd_loss"]["chunked"][0]["loss"] == pytest.approx(results["kd_loss"]["naive"][0]["loss"], rel=1e-4)
    for ratio in (results["tokenizer"]["ratio"], results["loader"]["loader_over_train_step"],
                  results["compile"]["speedup"], results["kd_loss"]["time_ratio"]):
        assert set(ratio) == {"median", "min", "max", "per_process", "rounds", "processes", "stable"}


# ----------------------------------------------------------------------------------------------
# The steps against the matmul peak (tools/utilization.py): rows from FLOPs and seconds, groups that sum to 1

def test_toy_and_mini_share_steps_whose_model_flops_are_counted_by_hand():
    """A toy layer: 2 FLOPs per weight (q, k, v, o: 128 x (128 + 64 + 64 + 128) = 49,152; the MLP 3 x 128 x 384
    = 147,456) and causal attention, 4 x 128 x 64 (QK^T and AV over the mean context, 128 / 2): 425,984 a
    token. The head: 2 x 128 x 4,097 = 1,048,832. A student step: the teacher's 12 layers and head forward,
    the student's 3 layers and head forward and backward; a teacher step: its own forward and backward."""
    steps = utilization.distinct_steps(("toy", "mini"))
    assert list(steps) == ["toy, mini student", "toy, mini teacher"]  # mini is the toy's step, run longer
    layer, head = 425_984, 1_048_832
    student = utilization.Step(*steps["toy, mini student"], torch.float32)
    teacher = utilization.Step(*steps["toy, mini teacher"], torch.float32)
    assert (student.tokens, teacher.tokens) == (16 * 128, 32 * 128)  # the presets' micro-batches, full length
    assert student.flops() == 16 * 128 * (12 * layer + head + 3 * (3 * layer + head)) == 26_912_751_616
    assert teacher.flops() == 32 * 128 * 3 * (12 * layer + head) == 75_701_944_320
    row = utilization.fraction_of_peak(26_912_751_616, 0.5, 86e9)
    assert row == pytest.approx({"gflop": 26.912751616, "seconds": 0.5, "gflops": 53.825503232,
                                 "fraction_of_peak": 53.825503232 / 86}, rel=1e-15)


def test_the_peak_is_the_best_square_matmul_of_each_precision():
    seconds = {"matmul 1024 fp32": 0.025, "matmul 2048 fp32": 0.25, "matmul 1024 bf16": 4.0, "toy student fp32": 1.0}
    peaks = utilization.peaks(seconds)
    assert peaks["fp32"] == pytest.approx({"1024": 85.89934592, "2048": 68.719476736, "best": 85.89934592}, rel=1e-15)
    assert peaks["bf16"] == pytest.approx({"1024": 0.536870912, "best": 0.536870912}, rel=1e-15)


def test_profile_groups_sum_to_the_whole():
    elementwise, python = utilization.ELEMENTWISE, utilization.PYTHON
    operators = [(("aten::mm", "aten::matmul", "_ChunkedLoss"), 0.30),  # the head's matmul belongs to the loss
                 (("aten::mm", "aten::matmul", "aten::linear"), 0.20),
                 (("autograd::engine::evaluate_function: MmBackward0",), 0.05),
                 (("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention"), 0.10),
                 (("aten::add_", "Optimizer.step#AdamW.step", "optimizer"), 0.05), (("aten::mul",), 0.10)]
    groups = utilization.grouped(operators, wall_s=1.0)
    assert groups == pytest.approx({"vocabulary head and loss": 0.30, "optimizer": 0.05, "attention": 0.10,
                                    "linear layers": 0.25, elementwise: 0.10, python: 0.20}, rel=1e-12)
    assert sum(groups.values()) == pytest.approx(1.0, rel=1e-15)
    # The profiler's own times can sum past the clock's: the whole is then their sum, and Python nothing.
    over = utilization.grouped(operators, wall_s=0.5)
    assert over[python] == 0 and over["linear layers"] == pytest.approx(0.25 / 0.8, rel=1e-12)


def test_a_profiled_step_is_split_into_every_group():
    settings, shape, seq = utilization.distinct_steps(("smoke",))["smoke student"]
    groups = utilization.profile_groups(utilization.Step(settings, shape, seq, torch.float32), steps=1)
    assert sum(groups.values()) == pytest.approx(1.0, rel=1e-12)
    assert all(fraction > 0 for fraction in groups.values()), groups


# ----------------------------------------------------------------------------------------------
# The dry run's one estimate for this CPU (tools/cpu_estimate.py): the bench's step, else a short one timed now

@pytest.fixture
def quiet(monkeypatch):
    """A machine whose 1-minute load is 0: no busy warning, whatever else runs where the tests do."""
    monkeypatch.setattr(utilization.os, "getloadavg", lambda: (0.0, 0.0, 0.0))


def test_the_estimate_reads_the_benchs_step_and_times_nothing(tmp_path, monkeypatch, quiet):
    """The bench's toy step on this CPU: 2 GFLOP in 0.5 s is 4 GFLOP/s, so 360 GFLOP take 90 s; nothing is timed."""
    from tools import cpu_estimate
    monkeypatch.setattr(utilization, "step_rate", lambda *a, **k: pytest.fail("timed a step beside bench.json"))
    bench_file = tmp_path / "bench.json"
    bench_file.write_text(json.dumps({"environment": {**here(), "date": "2026-12-02"}, "train_step": {
        "step_gflop": 2.0, "kit_post_fp32_s": 0.5}}))
    assert cpu_estimate.cpu_estimate(360e9, "fp32", bench_file) == (
        f"about 1.5 min on this CPU (4.0 GFLOP/s: the kit's fp32 toy step as {bench_file} measured it on "
        "2026-12-02), on a quiet machine")


@pytest.mark.parametrize(("content", "why"), BENCH_FILES)
def test_a_bench_json_that_cannot_be_used_is_named_and_a_step_timed_now(content, why, tmp_path, monkeypatch, quiet):
    """Issue 59, class 2: a hostile bench.json (tests/bad_bench_files.py) is never a traceback or a silly number:
    the step is timed now (12 GFLOP/s here, so 360 GFLOP take 30 s) and the line says why the file was not used."""
    from tools import cpu_estimate
    monkeypatch.setattr(utilization, "step_rate", lambda dtype: 12e9 if dtype == torch.float32 else pytest.fail())
    bench_file = tmp_path / "bench.json"
    bench_file.write_text(content if isinstance(content, str) else json.dumps(content(here())))
    assert cpu_estimate.bench_rate(bench_file, "fp32")[0] is None
    text = cpu_estimate.cpu_estimate(360e9, "fp32", bench_file)
    assert text.startswith(f"about 30 s on this CPU (12.0 GFLOP/s: the kit's fp32 toy step timed now; {bench_file} "
                           f"not used: {why}") and text.endswith("), on a quiet machine"), text


def test_bfloat16_runs_are_priced_at_bfloat16s_rate(tmp_path, monkeypatch, quiet):
    """Issue 59, class 2: where the probe measured bf16 at 0.019x fp32, 4 bf16 runs were priced at the fp32 step's
    39.7 GFLOP/s. Now: emulated, the fp32 step's rate times 0.019 (timed now, or from an fp32-only bench.json);
    native, the bench's bf16 step itself."""
    from tools import cpu_estimate
    monkeypatch.setattr(bench.devices, "cpu_bf16_speedup", lambda: 0.019)
    monkeypatch.setattr(utilization, "step_rate", lambda dtype: 39.7e9 if dtype == torch.float32 else pytest.fail())
    text = cpu_estimate.cpu_estimate(36e12, "bf16", tmp_path / "none.json")  # 36 TFLOP at 0.7543 GFLOP/s: 13.3 h
    assert text == ("about 13.3 h on this CPU (0.8 GFLOP/s: the kit's fp32 toy step timed now, times bf16's 0.019x "
                    "of fp32 in this CPU's matmul probe), on a quiet machine")
    auto = cpu_estimate.cpu_estimate(36e12, "auto", tmp_path / "none.json")  # "auto" here trains in fp32
    assert auto.startswith("about 15.1 min on this CPU (39.7 GFLOP/s")
    fp32_only = tmp_path / "bench.json"
    fp32_only.write_text(json.dumps({"environment": {**here(), "date": "2026-12-02"},
                                     "train_step": {"step_gflop": 2.0, "kit_post_fp32_s": 0.5}}))
    assert cpu_estimate.bench_rate(fp32_only, "bf16") == pytest.approx((4e9 * 0.019, (
        f"the kit's fp32 toy step as {fp32_only} measured it on 2026-12-02, times bf16's 0.019x of fp32 in this "
        "CPU's matmul probe")))
    monkeypatch.setattr(bench.devices, "cpu_bf16_speedup", lambda: 3.5)
    both = tmp_path / "bench-bf16.json"
    both.write_text(json.dumps({"environment": here(), "train_step": {"step_gflop": 2.0, "kit_post_fp32_s": 0.5,
                                                                      "kit_post_bf16_s": 0.25}}))
    assert cpu_estimate.bench_rate(both, "bf16")[0] == 8e9 and cpu_estimate.bench_rate(both, "fp32")[0] == 4e9


def test_without_the_bench_the_estimate_times_a_few_real_toy_steps(tmp_path, monkeypatch, quiet):
    """No bench.json: the toy student step (utilization.Step) on 4 documents in the runs' precision, one untimed
    call, then the best of two: 3 GFLOP in 0.4 s then 0.25 s is 12 GFLOP/s, so 720 GFLOP take 60 s."""
    from tools import cpu_estimate
    made, calls, ticks = [], [], iter([10.0, 10.4, 20.0, 20.25])

    class Step:  # the real step's interface; its FLOPs and the clock are given
        def __init__(self, settings, shape, seq, dtype):
            made.append((settings.micro_batch, settings.global_batch, shape.num_hidden_layers, seq, dtype))

        def flops(self):
            return 3e9

        def __call__(self):
            calls.append(1)
    monkeypatch.setattr(utilization, "Step", Step)
    monkeypatch.setattr(utilization, "step_clock", lambda: ("fake", lambda: next(ticks)))
    text = cpu_estimate.cpu_estimate(720e9, "fp32", tmp_path / "bench.json")
    assert text == "about 1.0 min on this CPU (12.0 GFLOP/s: the kit's fp32 toy step timed now), on a quiet machine"
    assert made == [(4, 4, 12, 128, torch.float32)] and len(calls) == 3  # the toy teacher's 12 layers, 128 positions
    stale = tmp_path / "old-bench.json"  # written before bench recorded the step's FLOPs: timed now as well
    stale.write_text(json.dumps({"environment": here(), "train_step": {"kit_post_fp32_s": 0.5}}))
    ticks = iter([0.0, 0.5, 1.0, 1.5])
    assert cpu_estimate.cpu_estimate(720e9, "fp32", stale).startswith("about 2.0 min on this CPU (6.0 GFLOP/s")


def test_the_estimate_warns_when_other_processes_hold_the_cores(tmp_path, monkeypatch):
    """8 cores, torch on 4 threads: the 4 others (and half a core of slack) may be busy, not more."""
    from tools import cpu_estimate
    bench_file = tmp_path / "bench.json"
    monkeypatch.setattr(utilization.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(utilization.torch, "get_num_threads", lambda: 4)
    bench_file.write_text(json.dumps({"environment": here(), "train_step": {"step_gflop": 2.0, "kit_post_fp32_s": 0.5}}))
    for load, busy in ((0.0, False), (4.4, False), (4.6, True), (30.0, True)):
        monkeypatch.setattr(utilization.os, "getloadavg", lambda load=load: (load, 1.0, 1.0))
        text = cpu_estimate.cpu_estimate(360e9, "fp32", bench_file)
        assert text.startswith("about 1.5 min on this CPU (4.0 GFLOP/s") and text.count("about") == 1
        assert text.endswith(f"on a quiet machine; busy now (load {load:.1f} on 8 cores), so longer" if busy
                             else "on a quiet machine"), (load, text)


def test_the_gpu_rehearsals_allocator_reading_can_be_made_and_entered(monkeypatch):
    """The rehearsal's tracker on a GPU (rehearse.CudaPeak), with the allocator's readings stood in for: no other test
    reaches it without a GPU, and a refactor that left its __exit__ abstract failed make gpu-check on an H200."""
    from types import SimpleNamespace

    from tools import rehearse
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 5 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 7 * 2**30)
    with rehearse.memory_tracker([], [], SimpleNamespace(device="cuda:0"), on_gpu=True) as tracker:
        assert calls == ["empty_cache", ("reset", "cuda:0")]  # a segment's peak starts from nothing cached
    assert tracker.get_tracker_snapshot("peak") == {"cuda:0": {"Total": 5 * 2**30, "Reserved": 7 * 2**30}}


def test_the_layout_benchs_useful_flops_count_real_tokens_only():
    """A packed toy micro-batch's useful FLOPs are each document's tokens through the model at its own half
    length (no padding), for the student's step (the teacher's layers and both heads forward, the student's
    layers and head forward and backward) and the teacher's (its layers and head, forward and backward); the
    padded layout's positions are the rows times the longest document."""
    from experiments import presets
    from plumbing.flops import forward_flops_per_token
    from tools import layout_bench
    shape = presets.teacher_shape(presets.PRESETS["toy"])
    lengths = [3, 128, 40]

    class Fake:  # what useful_flops reads of a step
        net = type("Net", (), {"layers": [None] * 3})()
    Fake.shape = shape
    def per_token(layers, n):
        return forward_flops_per_token(shape, layers, n / 2)
    student = sum(n * (per_token(12, n)[0] + per_token(12, n)[1] + 3 * (per_token(3, n)[0] + per_token(3, n)[1]))
                  for n in lengths)
    teacher = sum(3 * n * (per_token(12, n)[0] + per_token(12, n)[1]) for n in lengths)
    assert layout_bench.useful_flops("student", Fake, lengths) == pytest.approx(student, rel=1e-12)
    assert layout_bench.useful_flops("teacher", Fake, lengths) == pytest.approx(teacher, rel=1e-12)


def test_the_layout_benchs_sample_spans_the_epoch_and_its_ceiling_is_full_length_documents():
    """The sample is every (epoch // count)-th micro-batch; the ceiling takes the epoch's documents that fill max_len
    (max_len + 1 tokens), in the epoch's order, as many to a micro-batch as the epoch's; the real fraction is real
    positions over rows x longest, by hand: (3 + 5) / (2 x 5) and (5 + 5) / (2 x 5)."""
    from types import SimpleNamespace

    import numpy as np

    from tools import layout_bench
    train = SimpleNamespace(lengths=np.array([4, 6, 6, 2, 6, 6, 3, 6]), manifest={"max_len": 5}, path="shard")
    epoch = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout_bench.sample(epoch, 2) == [[0, 1], [4, 5]] and layout_bench.sample(epoch, 4) == epoch
    assert layout_bench.full_length(train, epoch, 2) == [[1, 2], [4, 5]]
    assert layout_bench.full_length(train, epoch, 1) == [[1, 2]]
    assert layout_bench.real_fraction([[0, 1]], train) == pytest.approx(8 / 10, rel=1e-15)
    assert layout_bench.real_fraction([[0, 1], [4, 5]], train) == pytest.approx(18 / 20, rel=1e-15)
    with pytest.raises(ValueError, match="fewer than 2 documents fill max_len 6"):
        layout_bench.full_length(SimpleNamespace(**{**vars(train), "manifest": {"max_len": 6}}), epoch, 1)
