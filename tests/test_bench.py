"""bench.py's GPU check, run on the CPU at tiny dimensions so its code paths (bf16 parity, the
activation-checkpointed distillation step, FSDP2 on one rank) are exercised without a GPU."""
import math

import bench
import model


def test_gpu_check_code_paths_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "bench.json")
    tiny = model.ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    results = bench.gpu_check(device="cpu", config=tiny, batch=2, seq=32, repeats=1)
    assert results["parity_bf16"]["ok"], results["parity_bf16"]
    for key in ("paper_layer_step", "fsdp2_one_rank"):
        step = results[key]
        assert step["finite"] and step["tokens"] == 64 and step["mfu"] > 0  # a rate: no bound on timing
    assert (tmp_path / "gpu_check.json").is_file()


def test_interleaved_timing_takes_medians():
    calls = []
    seconds = bench.interleaved({"a": (lambda: calls.append("a"), bench.nullcontext),
                                 "b": (lambda: calls.append("b"), bench.nullcontext)}, repeats=3)
    assert calls == ["a", "b"] * 5  # two warm-up rounds, then three timed ones, in turns
    assert set(seconds) == {"a", "b"} and all(math.isfinite(s) and s >= 0 for s in seconds.values())


def test_train_step_bench_skips_bf16_where_it_is_emulated(monkeypatch):
    tiny = model.ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    monkeypatch.setattr(bench, "toy_shapes", lambda: (tiny, 2, 1, 2))
    why = "auto: fp32 (a bf16 matmul ran 0.03x as fast as fp32 on this CPU, below 1.5x; bf16 is emulated or slow here)"
    monkeypatch.setattr(bench.devices, "precision_choice", lambda *a, **k: (bench.torch.float32, why))
    results = bench.bench_train_step(repeats=1)
    assert results["bf16"] == f"skipped: {why}" and list(results["peak_gflops"]) == ["fp32"]
    assert not [k for k in results if "bf16" in k and k != "bf16"]  # no bf16 timing, speed-up or MFU
    assert results["kit_post_fp32_mfu"] > 0 and results["speedup_pre_fp32_vs_hf_fp32"] > 0
