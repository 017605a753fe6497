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
        assert step["finite"] and step["tokens"] == 64 and 0 < step["mfu"] < 2
    assert (tmp_path / "gpu_check.json").is_file()


def test_interleaved_timing_takes_medians():
    calls = []
    seconds = bench.interleaved({"a": (lambda: calls.append("a"), bench.nullcontext),
                                 "b": (lambda: calls.append("b"), bench.nullcontext)}, repeats=3)
    assert calls == ["a", "b"] * 5  # two warm-up rounds, then three timed ones, in turns
    assert set(seconds) == {"a", "b"} and all(math.isfinite(s) and s >= 0 for s in seconds.values())
