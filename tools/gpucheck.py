"""`make gpu-check`: what a first cluster run would hit, checked on one GPU in a few minutes, before any
cluster hours are spent:

    python -m tools.gpucheck                  # one CUDA GPU; writes results/gpu_check.json
    python -m tools.gpucheck --device cpu     # the same code on the CPU at tiny sizes: its plumbing only

(a) the teacher against transformers' Qwen3, and the chunked loss against a naive one, in bf16;
(b) attention at the full scale's longest document with its grouped-query heads, forward and backward,
    on a fused SDPA kernel (flash, memory-efficient or cuDNN): the check fails if only the math kernel
    runs, which would hold the whole T x T attention matrix of every head; and a packed micro-batch's
    attention at the full scale's token budget (documents of the longest length end to end: varlen_attn)
    against each document alone, with the layer's parameters as FSDP2 holds them (bf16) and as one GPU
    does (fp32 under autocast);
(c) the full-size rehearsal (rehearse.py) with real bf16 tensors on this GPU, the other 7 ranks a fake
    group, first grow's phase 0 (what crashed at step 1), then every lockstep segment of table1, each on
    the worst step a rank can be given (packed micro-batches of the full token budget): the allocator's
    peak (max_memory_allocated) and reserved bytes against the plan's count for each;
(d) the real driver under torchrun --nproc_per_node=1 (NCCL bound to the GPU, a sharded rolling
    checkpoint) stopped by a kill after a save and resumed to the end;
(e) tokens/s and MFU of a paper-size student block over packed micro-batches as the full scale's ranks
    take them: a full token budget of the longest documents, and a rank's share of a mean step;
(f) how fast a rank writes a checkpoint shard (fsynced) where the runs folder is.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

import config
import kd
import model
from experiments import presets, suite, tables
from plumbing import checkpoint, devices
from plumbing.hf_qwen3 import ModelConfig
from tools import bench, lockstep_plan, memory, plan, rehearse, utilization

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("results") / "gpu_check.json"
PAPER_LAYER = ModelConfig(num_hidden_layers=3)  # hidden 4096, 32/8 heads, intermediate 12288, vocab 151,936


def check_parity_bf16(device) -> dict:
    """The teacher against transformers' Qwen3 and the chunked loss against a naive one, in bf16."""
    import transformers
    torch.manual_seed(0)
    hf_config = transformers.Qwen3Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                         num_attention_heads=8, num_key_value_heads=2, head_dim=64)
    hf = transformers.Qwen3ForCausalLM(hf_config).to(device, torch.bfloat16).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = model.load_qwen3(tmp, dtype=torch.bfloat16, device=device)
    ids = torch.randint(0, 1000, (2, 64), device=device)
    with torch.no_grad():
        a, b = ours(ids).float(), hf(ids).logits.float()
    logits_rel = ((a - b).abs().max() / b.abs().max()).item()
    bf16 = {"device": device, "dtype": torch.bfloat16}
    h_s, w_s = torch.randn(512, 256, **bf16, requires_grad=True), torch.randn(1000, 256, **bf16, requires_grad=True)
    h_t, w_t = torch.randn(512, 256, **bf16), torch.randn(1000, 256, **bf16)
    y = torch.randint(0, 1000, (512,), device=device)
    mask = torch.ones(512, dtype=torch.bool, device=device)
    loss, _, _ = kd.kd_loss(h_s, w_s, h_t, w_t, y, mask, chunk_size=100)
    reference = bench.naive_loss(h_s.float() @ w_s.float().T, h_t.float() @ w_t.float().T, y)
    return {"teacher_logits_max_rel_diff": logits_rel, "kd_loss": loss.item(), "kd_loss_naive_fp32": reference.item(),
            "ok": logits_rel < 2e-2 and abs(loss.item() - reference.item()) < 2e-2 * abs(reference.item())}


def paper_layer_step(device, config: ModelConfig, micro_batches: list[list[int]], repeats: int) -> dict:
    """A distillation step of one student block of 3 layers at the paper's dimensions over packed micro-batches
    of documents of these lengths (full_scale_micro_batches: a full token budget, a rank's share of a mean step):
    bf16 autocast on a GPU (fp32 on a CPU, where bf16 is emulated), activation checkpointing, the chunked KD loss
    over the 151,936-token head. Tokens/s, and MFU against this device's measured bf16 matmul peak."""
    torch.manual_seed(0)
    teacher = model.Qwen3(config).to(device)
    teacher.init_weights(0)
    teacher = teacher.to(torch.bfloat16).eval().requires_grad_(False)
    student = model.Student.from_teacher(teacher, 1, config.num_hidden_layers, "post", seed=0)
    student.checkpoint_layers = True
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-4)
    micro = [torch.randint(0, config.vocab_size, (1, sum(lengths)), device=device) for lengths in micro_batches]
    context = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    losses = []

    def step():
        for ids, lengths in zip(micro, micro_batches):
            with context:
                losses.append(float(bench.kit_step(teacher, student, optimizer, ids, None, 4096, tuple(lengths))))
        torch.cuda.synchronize(device) if device.type == "cuda" else None

    torch.cuda.reset_peak_memory_stats(device) if device.type == "cuda" else None
    seconds = utilization.timed(step, repeats)
    tokens = sum(map(sum, micro_batches))
    flops = sum(utilization.student_step_flops(config, config.num_hidden_layers, n, n)
                for lengths in micro_batches for n in lengths)
    peak = matmul_peak_on(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    return {"tokens": tokens, "micro_batches": micro_batches, "step_s": seconds, "tokens_per_s": tokens / seconds,
            "mfu": flops / seconds / peak, "peak_tflops": peak / 1e12,
            "max_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "finite": all(map(math.isfinite, losses))}


def full_scale_micro_batches(preset) -> list[list[int]]:
    """Documents of the micro-batches a full-scale rank on 8 GPUs takes: a full token budget of the longest
    documents (micro_batch x max_len: the worst case), and its share of a mean step (global_batch / 8 documents
    of the mean length) in one micro-batch, as token placement puts it (data.token_micro_batches)."""
    longest, mean = preset.data["max_len"], round(preset.doc_tokens)
    return [[longest] * preset.run["micro_batch"], [mean] * (preset.run["global_batch"] // 8)]


def matmul_peak_on(device, dtype, n: int = 8192) -> float:
    """FLOP/s of a large square matmul on the device (1024 on a CPU): the practical peak an MFU is measured against."""
    n = 1024 if device.type == "cpu" else n
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda _: None)
    return 2 * n ** 3 / utilization.timed(lambda: (a @ b, wait(device)), 20)


def attention_kernel(config: ModelConfig, length: int, device) -> dict:
    """Forward and backward of causal GQA attention at `length` tokens on a fused kernel."""
    problem = devices.fused_attention_problem(config, length, device)
    return {"length": length, "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
            "problem": problem, "ok": not problem}


def packed_attention(config: ModelConfig, lengths: list[int], device) -> dict:
    """model.Attention over one packed row of documents of `lengths` (on a GPU varlen_attn's path, one kernel for
    the row), forward and backward, against each document alone (causal SDPA over its own row): its layer's
    parameters as FSDP2 gathers them (bf16) and as one GPU holds them (fp32, under bf16 autocast on a GPU). The
    largest difference relative to the largest output, each way; a way the kernel refuses fails with its error."""
    out, x = {"lengths": lengths}, torch.randn(1, sum(lengths), config.hidden_size, device=device)
    context = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    for way, dtype in (("bf16 parameters (FSDP2)", torch.bfloat16), ("fp32 parameters (one GPU)", torch.float32)):
        torch.manual_seed(0)
        attention = model.Attention(config).to(device)
        for p in attention.parameters():  # the projections as an initialised model's, the norms ones
            torch.nn.init.normal_(p, std=0.02) if p.dim() == 2 else torch.nn.init.ones_(p)
        attention.to(dtype)
        try:
            with context():
                attention.doc_lengths = tuple(lengths)
                packed = attention(x.to(dtype), *model.rope_cos_sin(config, x.shape[1], device, tuple(lengths)))
                packed.float().square().sum().backward()
                attention.doc_lengths = None
                alone = torch.cat([attention(part, *model.rope_cos_sin(config, part.shape[1], device))
                                   for part in x.to(dtype).split(lengths, dim=1)], dim=1)
            grads = all(torch.isfinite(p.grad).all() for p in attention.parameters() if p.grad is not None)
            diff = ((packed.float() - alone.float()).abs().max() / alone.float().abs().max()).item()
            out[way] = {"max_rel_diff": diff, "finite_gradients": bool(grads), "ok": diff < 2e-2 and bool(grads)}
        except RuntimeError as error:
            out[way] = {"ok": False, "error": " ".join(str(error).split())[:300]}
    out["kernel"] = "varlen_attn" if device.type == "cuda" and model.varlen_attn is not None else "sdpa per document"
    return {**out, "ok": all(out[way]["ok"] for way in out if isinstance(out[way], dict))}


def memory_rehearsal(scale: str, gpus: int, device: str) -> dict:
    """rehearse.py on this device (real bf16 tensors on a GPU, the other ranks a fake group; fake tensors
    on the CPU), each step beside the plan's count (memory.py): first grow's phase 0 alone (the step-1
    scenario: blocks that never run, accumulation with gradient sync off, bf16 parameters with fp32
    reduction), then every lockstep segment of table1. On a GPU the allocator's peak and reserved bytes. In
    bf16, as on the GPU (the smoke's fp32 would reach varlen_attn's kernel, which refuses it, as the rehearsal does)."""
    preset = replace(presets.PRESETS[scale], run={**presets.PRESETS[scale].run, "precision": "bf16"})
    ws = suite.Workspace(preset, Path("runs") / scale, Path("results") / scale, devices.Dist())
    launch, shape = rehearse.Launch(gpus), presets.teacher_shape(preset)
    phase0 = config.plan_phases(suite.run_config(ws, suite.RunName("post", "grow"), preset.run["seed"]))[0]
    step1 = rehearse.rehearse(ws, launch, [phase0], device=device)
    rows = [{"steps": "grow phase 0 alone", "runs": ["post-grow phase 0"], "rehearsal": step1,
             "plan_gib": memory.step_peak(preset, shape, gpus, 1, [phase0])["total"] / 2**30}]
    rows += rehearse.rehearse_segments(ws, launch, tables.TABLES["table1"].runs, device=device)
    out = [{"steps": r["steps"], "runs": r["runs"], "plan_gib": r["plan_gib"],
            "allocated_gib": r["rehearsal"]["peak_gib"]["per-rank peak"],
            "reserved_gib": r["rehearsal"]["peak_gib"].get("Reserved"),
            "left_gathered": r["rehearsal"]["left_gathered"]} for r in rows]
    worst = max(r["allocated_gib"] for r in out)
    return {"scale": scale, "gpus": gpus, "segments": out, "worst_gib": worst,
            "ok": worst <= lockstep_plan.MEMORY_HEADROOM * plan.GPU_MEMORY_GIB["h100"]
            and not any(v for r in out for v in r["left_gathered"].values())}


def driver(device: str, runs: Path) -> dict:
    """The kit's own command under torchrun on one rank: killed right after a rolling checkpoint, then
    rerun, it resumes and finishes; the uninterrupted run's CE beside it."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
               str(ROOT / "repro.py"), "train", "--scale", "smoke", "--norm", "post", "--protocol", "grow",
               "--device", device]
    def run(folder: str, **env) -> subprocess.CompletedProcess:
        return subprocess.run([*command, "--runs-dir", str(runs / folder)], capture_output=True, text=True,
                              timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, cwd=ROOT)
    killed = run("stopped", NORMGROW_KILL_AT="saved:post-grow:12")
    resumed = run("stopped")
    whole = run("whole")
    done = lambda folder: json.loads((folder / "smoke" / "s42" / "post-grow" / "done.json").read_text())["ce"]
    ok = killed.returncode != 0 and resumed.returncode == 0 and whole.returncode == 0 and \
        "resuming at step 12" in resumed.stdout
    return {"killed_rc": killed.returncode, "resumed_rc": resumed.returncode, "ok": ok,
            "resumed_ce": done(runs / "stopped") if ok else None, "uninterrupted_ce": done(runs / "whole") if ok else None,
            "tail": "" if ok else (resumed.stdout + resumed.stderr)[-2000:]}


def write_throughput(folder: Path, gib: float, device) -> dict:
    """GB/s of a shard written (checkpoint.stage_rows, write_rows: safetensors, fsynced) of `gib` GiB on `device`."""
    tensor = torch.zeros(int(gib * 2**30 / 4), dtype=torch.float32, device=device)
    write = lambda: checkpoint.write_rows(folder, "probe", checkpoint.stage_rows({"weights": tensor}), 0, 1)
    seconds = utilization.timed_once(write)
    return {"gib": gib, "seconds": seconds, "gb_per_s": gib * 2**30 / 1e9 / seconds}


CHECKS = ("parity_bf16", "attention", "packed_attention", "memory_rehearsal", "driver", "throughput", "checkpoint_write")


def gpu_check(device: str = "cuda", out: Path = RESULTS, names: tuple[str, ...] = CHECKS) -> dict:
    """The named checks in that order, on one CUDA GPU at the paper's sizes (or, device "cpu", at tiny ones).
    A check that raises is a failed check with its error, and the others still run: a GPU lease is too
    dear to learn one failure per launch. results/gpu_check.json is rewritten after each check, so a
    session stopped by its time limit keeps what finished."""
    on_gpu = device == "cuda"
    dev = torch.device(device)
    tiny = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    full = presets.PRESETS["full"]
    results = {"environment": {**bench.environment(), "device": torch.cuda.get_device_name(dev) if on_gpu else "cpu"}}
    checks = {"parity_bf16": lambda: check_parity_bf16(dev),
              "attention": lambda: attention_kernel(PAPER_LAYER if on_gpu else tiny,
                                                    full.data["max_len"] if on_gpu else 256, dev),
              "packed_attention": lambda: packed_attention(PAPER_LAYER if on_gpu else tiny,
                                                           full_scale_micro_batches(full)[0] if on_gpu else [32, 20], dev),
              "memory_rehearsal": lambda: memory_rehearsal("full" if on_gpu else "smoke", 8 if on_gpu else 2, device),
              "driver": lambda: driver(device, Path(tempfile.mkdtemp(dir="runs" if Path("runs").is_dir() else None))),
              "throughput": lambda: paper_layer_step(dev, PAPER_LAYER if on_gpu else tiny,
                                                     full_scale_micro_batches(full) if on_gpu else [[16, 16], [20]],
                                                     3 if on_gpu else 1),
              "checkpoint_write": lambda: write_throughput(Path(tempfile.mkdtemp()), 1.0 if on_gpu else 0.01, dev)}
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        started = time.perf_counter()
        try:
            results[name] = {**checks[name](), "check_s": time.perf_counter() - started}
        except Exception as error:  # noqa: BLE001 -- a check's failure is its result; the next check still runs
            results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000],
                             "traceback": traceback.format_exc()[-4000:], "check_s": time.perf_counter() - started}
        print(f"{name}: {results[name]}", flush=True)
        checkpoint.write_json(out, results, default=str)
    failed = [name for name in results if isinstance(results[name], dict) and results[name].get("ok") is False]
    print(f"wrote {out}; " + (f"FAILED: {', '.join(failed)}" if failed else "every check passed"))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--checks", type=lambda text: tuple(text.split(",")), default=CHECKS,
                        help=f"a comma-separated subset, run in that order (default: {','.join(CHECKS)})")
    args = parser.parse_args()
    if unknown := [name for name in args.checks if name not in CHECKS]:
        parser.error(f"--checks: no check named {', '.join(unknown)}; the checks are {', '.join(CHECKS)}")
    if args.device == "cuda" and not torch.cuda.is_available():  # before any check: one line, not an AssertionError
        sys.exit("Error: no CUDA device here (torch.cuda.is_available() is False); the check needs one CUDA GPU and a "
                 "CUDA build of torch: run it on the GPU node, or `python -m tools.gpucheck --device cpu` for its "
                 "plumbing at tiny sizes")
    result = gpu_check(args.device, names=args.checks)
    sys.exit(1 if any(isinstance(v, dict) and v.get("ok") is False for v in result.values()) else 0)
