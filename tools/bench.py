"""Benchmarks: the kit against references, measured in one run on one machine, reported as ratios.

    python bench.py                  # or `make bench` / `python repro.py bench`; writes results/bench.json
    python gpucheck.py               # `make gpu-check`: what a first cluster run would hit, on one GPU

CPU bench, each line a ratio measured in this run (OMP_NUM_THREADS sets the threads, as for a run):
1. the toy and mini student and teacher steps as fractions of this CPU's fp32 and bf16 matmul peak, and
   where the rest of their time goes (tools/utilization.py);
2. train step (teacher forward + student forward/backward + AdamW) at the toy configuration, kit vs
   transformers' Qwen3ForCausalLM of the same dimensions doing the same work with a naive KD loss;
   eager fp32 for both, then the kit's best CPU setting (bf16 autocast where the probe picks it);
3. the chunked KD loss against a naive full-logit one: peak memory and time (bench_loss);
4. tokenization MB/s against HF tokenizers loading Qwen3's tokenizer.json;
5. the data loader's batches/s against the train step's steps/s;
6. the six replay runs of a seed trained one after the other against in lockstep (grow.train_together):
   wall time, teacher forward passes counted, results compared;
7. the toy step with its layers compiled for the fixed shapes of its padded batches against eager (on the
   same padded batches, and on batches as wide as their documents): compile time, step time, how many steps
   pay the compile back.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext, suppress
from dataclasses import replace
from functools import partial
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

import config
import data
import grow
import kd
import model
import nets
import prepare_shards
from experiments import presets, suite
from plumbing import checkpoint, corpora, devices, tokenizer
from plumbing.hf_qwen3 import ModelConfig, save_qwen3
from tools import utilization
from tools.utilization import interleaved, length_batch

RESULTS = Path("results") / "bench.json"


# ----------------------------------------------------------------------------------------------
# 2. The train step, kit vs transformers

def toy_shapes() -> tuple[ModelConfig, int, int, int]:
    """(teacher config, student blocks, layers per block, batch tokens) of the toy preset."""
    preset = presets.PRESETS["toy"]
    return presets.teacher_shape(preset), preset.run["blocks"], preset.run["layers_per_block"], preset.run["global_batch"]


def kit_step(teacher, student, optimizer, ids, mask, chunk):
    with torch.no_grad():
        teacher_hidden = teacher(ids, output_fn=nets.hidden_only)
    loss, _, _ = student(ids, output_fn=partial(kd.kd_loss, teacher_hidden=teacher_hidden,
                                                teacher_head_weight=teacher.head_weight, targets=ids, mask=mask,
                                                chunk_size=chunk))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def hf_step(teacher, student, optimizer, ids):
    with torch.no_grad():
        teacher_logits = teacher(ids).logits
    naive_loss(student(ids).logits, teacher_logits, ids).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def bench_train_step(repeats: int) -> dict:
    dtype, why = devices.precision_choice("auto", torch.device("cpu"))
    bf16_native = dtype == torch.bfloat16
    config, blocks, per_block, batch = toy_shapes()
    seq = presets.PRESETS["toy"].data["max_len"]
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    mask = torch.ones_like(ids, dtype=torch.bool)
    teacher = toy_teacher().eval().requires_grad_(False)
    import transformers
    hf_config = {k: v for k, v in config.to_hf().items() if k not in ("architectures", "model_type")}
    hf_teacher = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_config)).eval().requires_grad_(False)
    hf_student = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**hf_config, "tie_word_embeddings": False,
                                                                           "num_hidden_layers": blocks * per_block}))
    hf_student.model.embed_tokens.requires_grad_(False)
    hf_opt = torch.optim.AdamW([p for p in hf_student.parameters() if p.requires_grad], lr=1e-4)
    # bf16 variants only where bf16 is native: emulated, one bf16 step takes minutes (devices.precision_choice).
    dtypes = ["fp32"] + (["bf16"] if bf16_native else [])
    contexts = {"fp32": nullcontext, "bf16": partial(torch.autocast, "cpu", dtype=torch.bfloat16)}
    hf = partial(hf_step, hf_teacher, hf_student, hf_opt, ids)
    variants = {f"hf_{d}": (hf, contexts[d]) for d in dtypes}
    for norm in ("pre", "post"):
        student = model.Student.from_teacher(teacher, blocks, per_block, norm, seed=0)
        opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-4)
        kit = partial(kit_step, teacher, student, opt, ids, mask, presets.PRESETS["toy"].run["loss_chunk"])
        variants.update({f"kit_{norm}_{d}": (kit, contexts[d]) for d in dtypes})
    seconds = interleaved(variants, repeats)
    results = {"config": {"hidden": config.hidden_size, "teacher_layers": config.num_hidden_layers,
                          "student_layers": blocks * per_block, "vocab": config.vocab_size, "batch": batch, "seq": seq},
               # the kit's step in model FLOPs: the dry run's estimate for this CPU divides by its seconds
               "step_gflop": utilization.student_step_flops(config, blocks * per_block, batch * seq, seq) / 1e9,
               "bf16": why if bf16_native else f"skipped: {why}"}
    for name, s in seconds.items():
        results.update({f"{name}_s": s, f"{name}_tokens_per_s": batch * seq / s})
    for norm in ("pre", "post"):
        results[f"speedup_{norm}_fp32_vs_hf_fp32"] = seconds["hf_fp32"] / seconds[f"kit_{norm}_fp32"]
        if bf16_native:
            results[f"speedup_{norm}_bf16_vs_hf_fp32"] = seconds["hf_fp32"] / seconds[f"kit_{norm}_bf16"]
            results[f"speedup_{norm}_bf16_vs_hf_bf16"] = seconds["hf_bf16"] / seconds[f"kit_{norm}_bf16"]
    return results


# ----------------------------------------------------------------------------------------------
# 6-7. Lockstep against separate runs; the compiled toy step against eager

LOCKSTEP_RUNS = tuple(suite.RunName(norm, protocol) for protocol in ("joint", "grow", "freeze") for norm in ("pre", "post"))


def toy_teacher() -> model.Qwen3:
    """A toy-shaped Qwen3 with random weights: speed does not depend on what the teacher knows."""
    config, _, _, _ = toy_shapes()
    teacher = model.Qwen3(config)
    teacher.init_weights(0)
    return teacher


def lockstep_jobs(root: Path, teacher: Path, steps: int, data_dir: Path) -> list[tuple[config.RunConfig, Path]]:
    """The replay runs of one seed at the toy preset's settings, `steps` per phase, as the suite runs them,
    in a workspace at `root` whose data folder is `data_dir` (linked, not copied)."""
    run = {**presets.PRESETS["toy"].run, "phase_steps": steps, "eval_interval": steps, "checkpoint_interval": steps,
           "snapshot_interval": 0}
    ws = suite.Workspace(replace(presets.PRESETS["toy"], run=run), root, root / "results", devices.Dist())
    root.mkdir(parents=True, exist_ok=True)
    ws.data_dir.symlink_to(data_dir.resolve(), target_is_directory=True)
    return [(suite.run_config(ws, run, 42, teacher=teacher), ws.run_dir(run, 42)) for run in LOCKSTEP_RUNS]


def bench_lockstep(data_dir: Path, steps: int = 12) -> dict:
    """The six replay runs of one seed (toy shapes and data, `steps` per phase) trained one after the
    other and in lockstep: wall time, teacher forward passes (counted) and whether results are equal."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        teacher_dir = tmp / "teacher"
        save_qwen3(toy_teacher(), teacher_dir)
        ctx = devices.Dist()
        jobs = {way: lockstep_jobs(tmp / way, teacher_dir, steps, data_dir) for way in ("separate", "lockstep")}
        net = nets.load_teacher(jobs["separate"][0][0], ctx, torch.float32).net
        start = time.perf_counter()
        alone = [nets.Teacher(net, nets.TEACHER_CACHE_BYTES) for _ in jobs["separate"]]
        separate = [grow.train(config, run_dir, ctx=ctx, teacher=teacher)
                    for (config, run_dir), teacher in zip(jobs["separate"], alone)]
        separate_s = time.perf_counter() - start
        shared = nets.Teacher(net, nets.TEACHER_CACHE_BYTES)
        start = time.perf_counter()
        together = grow.train_together(jobs["lockstep"], ctx=ctx, teacher=shared)
        lockstep_s = time.perf_counter() - start
    return {"runs": [run.name for run in LOCKSTEP_RUNS], "steps_per_phase": steps, "separate_s": separate_s,
            "lockstep_s": lockstep_s, "speedup": separate_s / lockstep_s,
            "separate_teacher_forwards": sum(t.forwards for t in alone), "lockstep_teacher_forwards": shared.forwards,
            "identical_results": separate == together}


def bench_compile(repeats: int, cold: bool = True, scale: str = "toy") -> dict:
    """A scale's student step (bf16 where native) over micro-batches of the lengths LENGTH_FRACTIONS, three ways:
    eager on batches as wide as their documents (an eager run), eager and compiled (the layers, for fixed shapes)
    on batches padded to their buckets (a compiled run: data.fixed_shape): compile time, step time, and the loss
    difference. Inductor compiles into an empty cache folder (`cold`), so the compile time is what a first run
    pays; the tests reuse the usual cache instead, since they time nothing."""
    if cold:
        with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}):
            torch._dynamo.reset()
            return bench_compile(repeats, False, scale)
    dtype, _ = devices.precision_choice("auto", torch.device("cpu"))
    settings, shape, seq = utilization.distinct_steps((scale,))[f"{scale} student"]
    lengths = [max(1, round(f * seq)) for f in LENGTH_FRACTIONS]
    ways = {"eager": False, "eager at fixed shapes": False, "compiled": True}
    steps = {way: utilization.Step(replace(settings, compile=compiled), shape, seq, dtype) for way, compiled in ways.items()}
    batches = {way: [length_batch(settings.micro_batch, n, seq, shape.vocab_size, fixed=way != "eager") for n in lengths]
               for way in ways}
    losses, first = {way: [] for way in ways}, {}
    for way, step in steps.items():  # the first pass over every length: the compile, for the compiled one
        start = time.perf_counter()
        losses[way] = [step(batch) for batch in batches[way]]
        first[way] = time.perf_counter() - start
    loss_diff = max(abs(a - b) / abs(a) for a, b in zip(losses["eager"], losses["compiled"]))
    seconds = interleaved({way: (lambda way=way: [steps[way](b) for b in batches[way]], nullcontext) for way in ways},
                          repeats, pick=min, clock=utilization.step_clock()[1])
    per_step = {way: s / len(lengths) for way, s in seconds.items()}
    saving = per_step["eager"] - per_step["compiled"]
    compile_s = first["compiled"] - first["eager at fixed shapes"]
    return {"precision": str(dtype).removeprefix("torch."), "lengths": lengths,
            "widths": [b.input_ids.shape[1] for b in batches["compiled"]], "eager_step_s": per_step["eager"],
            "eager_fixed_step_s": per_step["eager at fixed shapes"], "compiled_step_s": per_step["compiled"],
            "speedup": per_step["eager"] / per_step["compiled"],
            "speedup_at_fixed_shapes": per_step["eager at fixed shapes"] / per_step["compiled"],
            "compile_s": compile_s, "break_even_steps": compile_s / saving if saving > 0 else None,
            "max_relative_loss_difference": loss_diff}


# Documents' lengths in the compiled step's micro-batches, as fractions of max_len (toy: 128, 116, 96, 128, 101,
# 88): varied, as micro-batches of fewer or shorter documents than the toy's are (the toy's own are all 128
# wide: one document in four fills max_len).
LENGTH_FRACTIONS = (1.0, 0.91, 0.75, 1.0, 0.79, 0.69)


# ----------------------------------------------------------------------------------------------
# 3. The chunked KD loss against a naive full-logit one, loss + backward, each in a fresh process


def naive_loss(student_logits, teacher_logits, targets, alpha=0.7, gamma=0.3, tau=1.0):
    """The reference the benchmarks compare against: what one writes without chunking, full
    [tokens x V] logits (any leading dims) in fp32, autograd does the rest; mean over all tokens."""
    z_S, z_T = student_logits.flatten(0, -2).float(), teacher_logits.flatten(0, -2).float()
    log_q_S, log_q_T = F.log_softmax(z_S / tau, -1), F.log_softmax(z_T / tau, -1)
    kl = F.kl_div(log_q_S, log_q_T, log_target=True, reduction="sum") * tau**2
    ce = F.cross_entropy(z_S, targets.flatten(), reduction="sum")
    return (alpha * kl + gamma * ce) / targets.numel()


def _peak_rss_bytes():
    """The resident-set high-water mark: VmHWM on Linux (ru_maxrss there also keeps the marks of exited
    threads, which clear_refs does not lower), else ru_maxrss (bytes on macOS)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak_rss():
    """Makes the RSS high-water mark the memory live now and returns it, so the peak measured next is
    growth above the live footprint. Linux/glibc: free heap pages go back to the OS (else the loss could
    reuse them unseen) and the mark is lowered to the current RSS (clear_refs 5). Elsewhere the mark so
    far is the baseline, which can hide part of a small peak."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _peak_rss_bytes()


def _bench_worker(variant, tokens, vocab, hidden, repeats, chunk_size, threads, dtype):
    """Runs in its own process: times `repeats` loss + backward passes of one variant and reports the
    growth of the RSS high-water mark above the inputs' footprint. torch's CPU allocations go straight to
    malloc (invisible to tracemalloc) and every buffer here is written, so resident memory is what the
    loss really holds; both variants also hold the gradients of h_S and W_S they return."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dtype = getattr(torch, dtype)
    h_S = torch.randn(tokens, hidden, dtype=dtype, requires_grad=True)
    W_S = torch.randn(vocab, hidden, dtype=dtype).mul_(hidden**-0.5).requires_grad_()
    h_T = torch.randn(tokens, hidden, dtype=dtype)
    W_T = torch.randn(vocab, hidden, dtype=dtype).mul_(hidden**-0.5)
    y = torch.randint(vocab, (tokens,))
    mask = torch.ones(tokens, dtype=torch.bool)
    before = _reset_peak_rss()
    seconds = []
    for _ in range(repeats):
        h_S.grad = W_S.grad = None
        t0 = time.perf_counter()
        if variant == "naive":
            loss = naive_loss(h_S @ W_S.T, h_T @ W_T.T, y)
        else:
            loss = kd.kd_loss(h_S, W_S, h_T, W_T, y, mask, chunk_size=chunk_size)[0]
        loss.backward()
        seconds.append(time.perf_counter() - t0)
    print(json.dumps({"peak_bytes": _peak_rss_bytes() - before, "seconds": sorted(seconds)[len(seconds) // 2],
                      "loss": loss.item()}))


def bench_loss(tokens=4096, vocab=151936, hidden=256, repeats=3, chunk_size=kd.DEFAULT_CHUNK_SIZE, threads=None,
               dtype="float32"):
    """Peak memory and median wall time of loss + backward, chunked (kd_loss) vs naive full logits,
    same inputs, dtype and threads, each variant in a fresh process so neither sees the other's peak.
    Returns both measurements and the ratios chunked / naive (goal: memory <= 0.2, time <= 1.15)."""
    threads = threads or torch.get_num_threads()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
    result = {"tokens": tokens, "vocab": vocab, "hidden": hidden, "chunk_size": chunk_size,
              "threads": threads, "dtype": dtype, "repeats": repeats}
    for variant in ("naive", "chunked"):
        code = (f"import sys; sys.path.insert(0, {here!r}); from tools import bench; bench._bench_worker({variant!r}, "
                f"{tokens}, {vocab}, {hidden}, {repeats}, {chunk_size}, {threads}, {dtype!r})")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        result[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    result["memory_ratio"] = result["chunked"]["peak_bytes"] / result["naive"]["peak_bytes"]
    result["time_ratio"] = result["chunked"]["seconds"] / result["naive"]["seconds"]
    return result


# ----------------------------------------------------------------------------------------------
# 4. The tokenizer

def bench_tokenizer(repeats: int = 3, documents: int | None = None) -> dict:
    """MB/s of the kit's tokenizer (tiktoken, NFC included) and of HF tokenizers loading Qwen3's real
    tokenizer.json, both batched over threads, on the toy corpus (its first `documents`; None: all of
    it), timed in turns."""
    from tokenizers import Tokenizer as HFTokenizer  # test-only dependency
    enc = tokenizer.qwen3_tokenizer()
    hf = HFTokenizer.from_file(str(tokenizer.qwen3_tokenizer_json()))
    documents = corpora.toy_paragraphs()[:documents]
    megabytes = sum(len(d.encode("utf-8")) for d in documents) / 1e6
    ours = lambda: enc.encode_batch(documents)
    theirs = lambda: [e.ids for e in hf.encode_batch(documents, add_special_tokens=False)]
    seconds = interleaved({"tiktoken": (ours, nullcontext), "hf_tokenizers": (theirs, nullcontext)}, repeats)
    return {"documents": len(documents), "megabytes": round(megabytes, 2),
            "tiktoken_mb_s": megabytes / seconds["tiktoken"], "hf_tokenizers_mb_s": megabytes / seconds["hf_tokenizers"],
            "ratio": seconds["hf_tokenizers"] / seconds["tiktoken"], "identical": ours() == theirs()}


# ----------------------------------------------------------------------------------------------
# 5. The data loader

def bench_loader_data(data_dir: Path) -> data.Shard:
    """The training shard in data_dir (runs/toy/data by default), prepared there with the toy preset's
    settings if there is none."""
    if (data_dir / "train" / data.MANIFEST_FILE).is_file():
        return data.Shard(data_dir / "train")
    preset = presets.PRESETS["toy"]
    enc = corpora.vocabulary(preset.data)
    train, _ = prepare_shards.prepare("toy", data_dir, enc, max_len=preset.data["max_len"], n_train_docs=None,
                                      n_val_docs=preset.data["val_docs"], seed=preset.run["seed"], progress=False)
    return train


def bench_loader(train: data.Shard, step_seconds: float, steps: int = 200) -> dict:
    """Batches/s of the toy preset's batcher over the prepared toy shard."""
    preset = presets.PRESETS["toy"]
    batcher = data.Batcher(train, preset.run["global_batch"], 0, replay_docs=len(train),
                           micro_batch=preset.run["micro_batch"])
    seconds = utilization.timed(lambda: [next(batcher) for _ in range(steps)], repeats=3, warmup=1) / steps
    return {"loader_batches_per_s": 1 / seconds, "train_steps_per_s": 1 / step_seconds,
            "loader_over_train_step": step_seconds / seconds}


def profile_step(steps: int = 5, rows: int = 20):
    """torch.profiler's table of the kit's toy student step in fp32, heaviest operators first."""
    settings, shape, seq = utilization.distinct_steps(("toy",))["toy student"]
    prof, _ = utilization.profiled(utilization.Step(settings, shape, seq, torch.float32), steps)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


# ----------------------------------------------------------------------------------------------

def environment() -> dict:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return {"cpu": names[0] if names else platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "capability": devices.cpu_instructions(), "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


# The measured sizes: the KD loss at a paper-sized vocabulary (kd.bench_loss's defaults), the whole toy
# corpus, 12 steps per phase for the six lockstep runs. tests/test_bench.py runs the same code at tiny sizes.
SIZES = {"kd": {}, "tokenizer_documents": None, "lockstep_steps": 12, "loader_steps": 200, "cold_compile": True,
         "utilization_scales": utilization.SCALES}


def main(repeats: int = 5, data_dir: Path = Path("runs/toy/data"), sizes: dict = SIZES, out: Path = RESULTS):
    """Every benchmark, in one run; the toy shard is prepared in data_dir if it is not there."""
    train = bench_loader_data(data_dir)
    results = {"environment": environment()}
    print(f"the steps against this CPU's matmul peak, {torch.get_num_threads()} thread(s) ...", flush=True)
    results["utilization"] = used = utilization.measure(repeats, sizes["utilization_scales"])
    for line in utilization.summary(used):
        print(f"  {line}")
    print("train step: kit vs transformers Qwen3ForCausalLM ...", flush=True)
    results["train_step"] = step = bench_train_step(repeats)
    print(f"  bf16: {step['bf16']}")
    for norm in ("pre", "post"):
        print(f"  {norm}: eager fp32 {step[f'speedup_{norm}_fp32_vs_hf_fp32']:.2f}x transformers fp32 (goal >= 1.0)")
        if "kit_post_bf16_s" in step:
            print(f"  {norm}: bf16 autocast {step[f'speedup_{norm}_bf16_vs_hf_fp32']:.2f}x transformers fp32 "
                  f"(goal >= 1.3), {step[f'speedup_{norm}_bf16_vs_hf_bf16']:.2f}x transformers bf16")
    kd_shape = {**dict(tokens=4096, vocab=151936, hidden=256), **sizes["kd"]}
    print(f"chunked KD loss vs naive ({kd_shape['tokens']} tokens x vocab {kd_shape['vocab']:,} x hidden "
          f"{kd_shape['hidden']}) ...", flush=True)
    results["kd_loss"] = loss = bench_loss(**sizes["kd"])
    print(f"  peak memory {loss['memory_ratio']:.1%} of naive (goal <= 20%), time {loss['time_ratio']:.2f}x (goal <= 1.15x)")
    print("tokenizer vs HF tokenizers on the toy corpus ...", flush=True)
    results["tokenizer"] = tok = bench_tokenizer(documents=sizes["tokenizer_documents"])
    print(f"  {tok['tiktoken_mb_s']:.1f} MB/s vs {tok['hf_tokenizers_mb_s']:.1f} MB/s: {tok['ratio']:.2f}x, "
          f"identical ids: {tok['identical']}")
    results["loader"] = loader = bench_loader(train, step.get("kit_post_bf16_s", step["kit_post_fp32_s"]),
                                              sizes["loader_steps"])
    print(f"  data loader: {loader['loader_batches_per_s']:,.0f} batches/s, "
          f"{loader['loader_over_train_step']:,.0f}x the train step's rate")
    print("the six replay runs of a seed, one after the other and in lockstep ...", flush=True)
    results["lockstep"] = lock = bench_lockstep(data_dir, sizes["lockstep_steps"])
    print(f"  lockstep {lock['speedup']:.2f}x as fast ({lock['separate_s']:.0f} s -> {lock['lockstep_s']:.0f} s); "
          f"teacher forwards {lock['separate_teacher_forwards']} -> {lock['lockstep_teacher_forwards']}; "
          f"identical results: {lock['identical_results']}")
    print("compiled toy step (fixed shapes) vs eager ...", flush=True)
    results["compile"] = comp = bench_compile(repeats, sizes["cold_compile"], sizes["utilization_scales"][0])
    even = f"{comp['break_even_steps']:,.0f} steps" if comp["break_even_steps"] else "never (not faster here)"
    print(f"  compiled {comp['speedup_at_fixed_shapes']:.2f}x eager at the same fixed shapes (goal >= 1.3x), "
          f"{comp['speedup']:.2f}x eager on batches as wide as their documents; compile {comp['compile_s']:.0f} s, "
          f"pays back after {even}; loss within {comp['max_relative_loss_difference']:.1e} (relative)")
    out.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_json(out, results)
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's table of the train step")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.profile:
        profile_step()
    else:
        main(args.repeats)
