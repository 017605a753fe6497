"""bench.py's GPU check, run on the CPU at tiny dimensions so its code paths (bf16 parity, the
activation-checkpointed distillation step, FSDP2 on one rank) are exercised without a GPU."""
import json
import math
from dataclasses import replace

import pytest
from conftest import TINY_MODEL

from plumbing.hf_qwen3 import ModelConfig
from tools import bench


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


def test_interleaved_timing_takes_medians():
    calls = []
    seconds = bench.interleaved({"a": (lambda: calls.append("a"), bench.nullcontext),
                                 "b": (lambda: calls.append("b"), bench.nullcontext)}, repeats=3)
    assert calls == ["a", "b"] * 5  # two warm-up rounds, then three timed ones, in turns
    assert set(seconds) == {"a", "b"} and all(math.isfinite(s) and s >= 0 for s in seconds.values())


def test_train_step_bench_skips_bf16_where_it_is_emulated(monkeypatch):
    tiny = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    monkeypatch.setattr(bench, "toy_shapes", lambda: (tiny, 2, 1, 2))
    why = "auto: fp32 (a bf16 matmul ran 0.03x as fast as fp32 on this CPU, below 1.5x; bf16 is emulated or slow here)"
    monkeypatch.setattr(bench.devices, "precision_choice", lambda *a, **k: (bench.torch.float32, why))
    results = bench.bench_train_step(repeats=1)
    assert results["bf16"] == f"skipped: {why}" and list(results["peak_gflops"]) == ["fp32"]
    assert not [k for k in results if "bf16" in k and k != "bf16"]  # no bf16 timing, speed-up or MFU
    assert results["kit_post_fp32_mfu"] > 0 and results["speedup_pre_fp32_vs_hf_fp32"] > 0


@pytest.mark.slow
def test_kd_loss_bench_smoke():
    r = bench.bench_loss(tokens=512, vocab=32768, hidden=32, repeats=1, chunk_size=64)
    assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("memory_ratio", "time_ratio")), str(r)
    assert math.isclose(r["chunked"]["loss"], r["naive"]["loss"], rel_tol=1e-4)
    # naive holds several 64 MiB [512 x 32768] fp32 tensors; chunked two 8 MiB buffers and small blocks
    assert r["chunked"]["peak_bytes"] < 0.5 * r["naive"]["peak_bytes"]


@pytest.mark.slow
def test_the_whole_bench_runs_at_tiny_sizes(tmp_path, monkeypatch):
    """`make bench`'s code path end to end (every row: train step, KD loss, tokenizer, loader, lockstep,
    compile) on a tiny model and a small toy shard, from a folder that is not the repository's."""
    import data
    from plumbing import tokenizer
    tiny = replace(TINY_MODEL, vocab_size=4097)  # the toy tokenizer's vocabulary
    monkeypatch.setattr(bench, "toy_shapes", lambda: (tiny, 3, 1, 4))
    monkeypatch.chdir(tmp_path)
    data.prepare("toy", tmp_path / "shard", tokenizer.qwen3_tokenizer(4096), max_len=32, n_train_docs=400,
                 n_val_docs=16, seed=42, workers=1, progress=False)
    sizes = {"kd": dict(tokens=256, vocab=4096, hidden=32, repeats=1, chunk_size=64), "tokenizer_documents": 50,
             "lockstep_steps": 2, "loader_steps": 5, "cold_compile": False}
    results = bench.main(repeats=1, data_dir=tmp_path / "shard", sizes=sizes, out=tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(json.dumps(results))
    assert results["lockstep"]["identical_results"] and results["tokenizer"]["identical"]
    assert results["lockstep"]["lockstep_teacher_forwards"] < results["lockstep"]["separate_teacher_forwards"]
    assert results["compile"]["max_relative_loss_difference"] < 1e-3  # fp32 compiled vs eager: reordered sums
    assert results["kd_loss"]["chunked"]["loss"] == pytest.approx(results["kd_loss"]["naive"]["loss"], rel=1e-4)
