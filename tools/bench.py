"""Benchmarks: the kit against references, measured on one machine, reported as ratios with their spreads.

    python repro.py bench            # or `make bench`; writes results/bench.json

Each ratio is measured in this run (OMP_NUM_THREADS sets the threads, as for a run), variants timed in turns,
and printed with its spread over every round of every process (utilization.ratio_spread), or as unstable. The
rows are main's: utilization.py's and layout_bench.py's, then the kit's train step against transformers',
the chunked KD loss, tokenization, the data loader, lockstep runs and the compiled step, each against a reference.
"""

import ctypes
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

import config
import data
import grow
import kd
import model
import nets
from experiments import prepare_shards, presets, suite
from plumbing import checkpoint, corpora, devices, tokenizer
from plumbing.hf_qwen3 import ModelConfig, save_qwen3
from tools import layout_bench, utilization
from tools.utilization import interleaved

RESULTS = Path("results") / "bench.json"


# The train step, kit vs transformers

def toy_shapes() -> tuple[ModelConfig, int, int, int]:
    """(teacher config, student blocks, layers per block, batch tokens) of the toy preset."""
    preset = presets.PRESETS["toy"]
    return presets.teacher_shape(preset), preset.run["blocks"], preset.run["layers_per_block"], preset.run["global_batch"]


def kit_step(teacher, student, optimizer, ids, mask, chunk, doc_lengths: tuple[int, ...] | None = None):
    """The kit's distillation step; with `doc_lengths`, on a packed micro-batch: documents end to end in `ids` (1, N)."""
    with torch.no_grad():
        teacher_hidden = teacher(ids, output_fn=nets.hidden_only, doc_lengths=doc_lengths)
    loss, _, _ = student(ids, doc_lengths=doc_lengths, output_fn=partial(
        kd.kd_loss, teacher_hidden=teacher_hidden, teacher_head_weight=teacher.head_weight, targets=ids, mask=mask,
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


# The allocator policies the train step is timed under, each set in fresh worker processes' environment (issue
# 60). transformers' step allocates full [batch x seq x vocab] fp32 logits, log-softmaxes and gradients (33.6 MB
# each at the toy's shapes), which glibc's default mmaps and munmaps afresh every step (2.4M minor faults in five
# steps of a fresh process), while a process whose earlier work left a heap they fit in reuses it. "heap reused"
# pins both thresholds above any buffer of the step: on glibc 2.36 (20 rounds of two 33.6 MB tensors and their
# sum) the default made 492k faults, MALLOC_MMAP_THRESHOLD_ alone 82k (the freed top is still trimmed),
# MALLOC_TRIM_THRESHOLD_ alone 492k, both 0. 1e9: above the largest buffer and within mallopt's int (older glibc
# ignored values above 32 MiB: the workers' minor faults in bench.json then show the two policies alike).
ALLOCATOR_POLICIES = {"glibc default": {},
                      "heap reused": {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "1000000000"}}
ROOT = Path(__file__).resolve().parents[1]


def allocator_settings(environ=os.environ) -> dict:
    """The glibc malloc settings an environment holds (MALLOC_*_ and GLIBC_TUNABLES)."""
    return {k: v for k, v in environ.items() if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"}


def in_fresh_process(worker: str, *args, env_settings: dict | None = None) -> dict:
    """bench.<worker>(*args, out=a file) run in a fresh interpreter, so that nothing of this process's history (its
    heap, threads, caches) reaches the measurement; the JSON it writes there. `env_settings`, where given, replace
    this environment's malloc settings."""
    env = None if env_settings is None else \
        {**{k: v for k, v in os.environ.items() if k not in allocator_settings()}, **env_settings}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tools import bench; " \
               f"bench.{worker}(*{args!r}, out={str(out)!r})"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"bench.{worker} failed in its own process:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


@contextmanager
def faults_counted(context, counts: list):
    """context(), with the process's minor page faults while inside it appended to `counts`."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with context():
        yield
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)


def train_step_variants(shapes: dict) -> dict:
    """{"hf_fp32": (step, context), "kit_pre_fp32": ...}: transformers' and the kit's steps on the same batch."""
    config, blocks, per_block = ModelConfig(**shapes["config"]), shapes["blocks"], shapes["per_block"]
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (shapes["batch"], shapes["seq"]))
    mask = torch.ones_like(ids, dtype=torch.bool)
    teacher = toy_teacher(config).eval().requires_grad_(False)
    import transformers
    hf_config = {k: v for k, v in config.to_hf().items() if k not in ("architectures", "model_type")}
    hf_teacher = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_config)).eval().requires_grad_(False)
    hf_student = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**hf_config, "tie_word_embeddings": False,
                                                                           "num_hidden_layers": blocks * per_block}))
    hf_student.model.embed_tokens.requires_grad_(False)
    hf_opt = torch.optim.AdamW([p for p in hf_student.parameters() if p.requires_grad], lr=1e-4)
    contexts = {"fp32": nullcontext, "bf16": partial(torch.autocast, "cpu", dtype=torch.bfloat16)}
    hf = partial(hf_step, hf_teacher, hf_student, hf_opt, ids)
    variants = {f"hf_{d}": (hf, contexts[d]) for d in shapes["precisions"]}
    for norm in ("pre", "post"):
        student = model.Student.from_teacher(teacher, blocks, per_block, norm, seed=0)
        opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-4)
        kit = partial(kit_step, teacher, student, opt, ids, mask, presets.PRESETS["toy"].run["loss_chunk"])
        variants.update({f"kit_{norm}_{d}": (kit, contexts[d]) for d in shapes["precisions"]})
    return variants


def _train_step_worker(shapes: dict, repeats: int, threads: int, out: str):
    """In its own process: every variant timed in turns, with its minor page faults and malloc settings."""
    torch.set_num_threads(threads)
    variants = train_step_variants(shapes)
    faults = {name: [] for name in variants}
    counted = {name: (fn, partial(faults_counted, context, faults[name])) for name, (fn, context) in variants.items()}
    seconds = interleaved(counted, repeats, pick=list)
    checkpoint.write_json(Path(out), {"seconds": seconds, "allocator": allocator_settings(),
                                      "minor_faults_per_step": {n: statistics.median(f[2:]) for n, f in faults.items()}})


def bench_train_step(repeats: int, processes: int = 2, policies: dict = ALLOCATOR_POLICIES,
                     shapes: tuple | None = None) -> dict:
    """The kit's step against transformers' (toy_shapes(), or `shapes`), in `processes` fresh processes per
    allocator policy, the policies in turns: each variant's seconds and minor faults a step, and each speed-up
    with its spread over every round of every process."""
    dtype, why = devices.precision_choice("auto", torch.device("cpu"))
    bf16_native = dtype == torch.bfloat16
    config, blocks, per_block, batch = shapes or toy_shapes()
    seq = presets.PRESETS["toy"].data["max_len"]
    # bf16 variants only where bf16 is native: emulated, one bf16 step takes minutes (devices.precision_choice).
    precisions = ["fp32"] + (["bf16"] if bf16_native else [])
    spec = {"config": asdict(config), "blocks": blocks, "per_block": per_block, "batch": batch, "seq": seq,
            "precisions": precisions}
    runs = {policy: [] for policy in policies}
    for _ in range(processes):
        for policy, settings in policies.items():  # in turns, so drift in the machine lands on both
            runs[policy].append(in_fresh_process("_train_step_worker", spec, repeats, torch.get_num_threads(),
                                                 env_settings=settings))
    results = {"config": {"hidden": config.hidden_size, "teacher_layers": config.num_hidden_layers,
                          "student_layers": blocks * per_block, "vocab": config.vocab_size, "batch": batch, "seq": seq},
               # the kit's step in model FLOPs: the dry run's estimate for this CPU divides by its seconds
               "step_gflop": utilization.student_step_flops(config, blocks * per_block, batch * seq, seq) / 1e9,
               "bf16": why if bf16_native else f"skipped: {why}", "threads": torch.get_num_threads(),
               "policies": {policy: policy_results(each, precisions) for policy, each in runs.items()}}
    first = results["policies"][next(iter(policies))]  # glibc's default: what a user's fresh process gets
    results.update({f"kit_post_{d}_s": first["seconds"][f"kit_post_{d}"]["median"] for d in precisions})
    return results


def policy_results(runs: list[dict], precisions: list[str]) -> dict:
    """One policy's processes: their settings, each variant's seconds and minor faults, and the speed-ups."""
    names = list(runs[0]["seconds"])
    pairs = [("fp32", "fp32")] + ([("bf16", "fp32"), ("bf16", "bf16")] if "bf16" in precisions else [])
    return {"allocator": [run["allocator"] for run in runs], "processes": len(runs),
            "seconds": {name: utilization.spread([run["seconds"][name] for run in runs]) for name in names},
            "minor_faults_per_step": {name: statistics.median(run["minor_faults_per_step"][name] for run in runs)
                                      for name in names},
            "speedups": {f"{norm}_{kit}_vs_hf_{hf}": utilization.ratio_spread(
                [(run["seconds"][f"hf_{hf}"], run["seconds"][f"kit_{norm}_{kit}"]) for run in runs])
                for norm in ("pre", "post") for kit, hf in pairs}}


# Lockstep against separate runs

LOCKSTEP_RUNS = tuple(suite.RunName(norm, protocol) for protocol in ("joint", "grow", "freeze") for norm in ("pre", "post"))


def toy_teacher(config: ModelConfig | None = None) -> model.Qwen3:
    """A toy-shaped Qwen3 (or one of `config`) with random weights: speed does not depend on what it knows."""
    teacher = model.Qwen3(config or toy_shapes()[0])
    teacher.init_weights(0)
    return teacher


def lockstep_jobs(root: Path, teacher: Path, steps: int, data_dir: Path) -> list[tuple[config.RunConfig, Path]]:
    """The replay runs of one seed at the toy's settings, `steps` per phase, reading `data_dir`."""
    run = {**presets.PRESETS["toy"].run, "phase_steps": steps, "eval_interval": steps, "checkpoint_interval": steps,
           "snapshot_interval": 0}
    ws = suite.Workspace(replace(presets.PRESETS["toy"], run=run), root, root / "results", devices.Dist())
    root.mkdir(parents=True, exist_ok=True)
    ws.data_dir.symlink_to(data_dir.resolve(), target_is_directory=True)
    return [(suite.run_config(ws, run, 42, teacher=teacher), ws.run_dir(run, 42)) for run in LOCKSTEP_RUNS]


def _lockstep_worker(way: str, teacher_dir: str, data_dir: str, steps: int, threads: int, out: str):
    """In its own process: the six replay runs trained `way` ("separate" or "lockstep"), timed."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        jobs, ctx = lockstep_jobs(Path(tmp), Path(teacher_dir), steps, Path(data_dir)), devices.Dist()
        net = nets.load_teacher(jobs[0][0], ctx, torch.float32).net
        teachers = [nets.Teacher(net, nets.TEACHER_CACHE_BYTES, nets.SHARED_LOG_PROBS_BYTES, nets.FIRST_EPOCH_BYTES)
                    for _ in (jobs if way == "separate" else [0])]
        start = time.perf_counter()
        if way == "separate":
            results = [grow.train(config, run_dir, ctx=ctx, teacher=t) for (config, run_dir), t in zip(jobs, teachers)]
        else:
            results = grow.train_together(jobs, ctx=ctx, teacher=teachers[0])
        seconds = time.perf_counter() - start
    checkpoint.write_json(Path(out), {"seconds": seconds, "teacher_forwards": sum(t.forwards for t in teachers),
                                      "results": results})


def bench_lockstep(data_dir: Path, steps: int = 12, runs: int = 3) -> dict:
    """The six replay runs of one seed (toy shapes and data, `steps` per phase) one after the other and in
    lockstep, each way `runs` times as a whole process in turns (what a user waits for): each way's seconds, the
    speed-up's spread, the same for the training alone, teacher forward passes and whether the results agree."""
    ways = {"separate": [], "lockstep": []}
    with tempfile.TemporaryDirectory() as tmp:
        save_qwen3(toy_teacher(), Path(tmp) / "teacher")
        for _ in range(runs):
            for way, done in ways.items():
                start = time.perf_counter()
                done.append(in_fresh_process("_lockstep_worker", way, str(Path(tmp) / "teacher"),
                                             str(data_dir.resolve()), steps, torch.get_num_threads()))
                done[-1]["process_s"] = time.perf_counter() - start
    whole = {way: [run["process_s"] for run in done] for way, done in ways.items()}
    trained = {way: [run["seconds"] for run in done] for way, done in ways.items()}
    pairs = lambda seconds: [([s], [t]) for s, t in zip(seconds["separate"], seconds["lockstep"])]  # a pair a round
    return {"runs": [run.name for run in LOCKSTEP_RUNS], "steps_per_phase": steps, "processes_each": runs,
            "separate_process_s": utilization.spread([whole["separate"]]),
            "lockstep_process_s": utilization.spread([whole["lockstep"]]),
            "speedup": utilization.ratio_spread(pairs(whole)),
            "in_process_speedup": utilization.ratio_spread(pairs(trained)),
            "separate_teacher_forwards": ways["separate"][0]["teacher_forwards"],
            "lockstep_teacher_forwards": ways["lockstep"][0]["teacher_forwards"],
            "identical_results": all(run["results"] == ways["separate"][0]["results"]
                                     for done in ways.values() for run in done)}


# The chunked KD loss against a naive full-logit one, loss + backward, each in a fresh process

def naive_loss(student_logits, teacher_logits, targets, alpha=0.7, gamma=0.3, tau=1.0):
    """The reference the benchmarks compare against: full [tokens x V] fp32 logits, autograd does the rest."""
    z_S, z_T = student_logits.flatten(0, -2).float(), teacher_logits.flatten(0, -2).float()
    log_q_S, log_q_T = F.log_softmax(z_S / tau, -1), F.log_softmax(z_T / tau, -1)
    kl = F.kl_div(log_q_S, log_q_T, log_target=True, reduction="sum") * tau**2
    ce = F.cross_entropy(z_S, targets.flatten(), reduction="sum")
    return (alpha * kl + gamma * ce) / targets.numel()


def _peak_rss_bytes():
    """The resident-set high-water mark: VmHWM on Linux (clear_refs does not lower ru_maxrss), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak_rss():
    """Makes the RSS high-water mark the memory live now and returns it: on Linux free heap pages go back to the
    OS (else the loss could reuse them unseen) and the mark is lowered (clear_refs 5); elsewhere the mark so far
    is the baseline, which can hide part of a small peak."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _peak_rss_bytes()


def _bench_worker(variant, tokens, vocab, hidden, repeats, chunk_size, threads, dtype, out):
    """In its own process: `repeats` loss + backward passes of one variant, timed, and the growth of the RSS
    high-water mark above the inputs' (torch's CPU allocations are invisible to tracemalloc, and every buffer
    here is written, so resident memory is what the loss holds)."""
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
    checkpoint.write_json(Path(out), {"peak_bytes": _peak_rss_bytes() - before, "seconds": seconds,
                                      "loss": loss.item()})


def bench_loss(tokens=4096, vocab=151936, hidden=256, repeats=3, chunk_size=kd.DEFAULT_CHUNK_SIZE, threads=None,
               dtype="float32", processes=2):
    """Peak memory and time of loss + backward, chunked (kd_loss) vs naive full logits, each in `processes` fresh
    processes in turns: each process's measurement, the memory ratio chunked / naive (goal <= 0.2) and the time
    ratio's spread, a chunked process's rounds paired with the naive one's before it (goal <= 1.15)."""
    threads = threads or torch.get_num_threads()
    result = {"tokens": tokens, "vocab": vocab, "hidden": hidden, "chunk_size": chunk_size,
              "threads": threads, "dtype": dtype, "repeats": repeats, "naive": [], "chunked": []}
    for _ in range(processes):
        for variant in ("naive", "chunked"):
            result[variant].append(in_fresh_process("_bench_worker", variant, tokens, vocab, hidden, repeats,
                                                    chunk_size, threads, dtype))
    # Resident memory is the same in every process (unlike time): the medians' ratio, with no spread to report.
    peak = {v: statistics.median(run["peak_bytes"] for run in result[v]) for v in ("naive", "chunked")}
    result["memory_ratio"] = peak["chunked"] / peak["naive"]
    result["time_ratio"] = utilization.ratio_spread([(chunked["seconds"], naive["seconds"])
                                                     for chunked, naive in zip(result["chunked"], result["naive"])])
    return result


def bench_tokenizer(repeats: int = 3, documents: int | None = None) -> dict:
    """MB/s of the kit's tokenizer and of HF tokenizers on the toy corpus (its first `documents`), in turns."""
    from tokenizers import Tokenizer as HFTokenizer  # test-only dependency
    enc = tokenizer.qwen3_tokenizer()
    hf = HFTokenizer.from_file(str(tokenizer.qwen3_tokenizer_json()))
    documents = corpora.toy_paragraphs()[:documents]
    megabytes = sum(len(d.encode("utf-8")) for d in documents) / 1e6
    ours = lambda: enc.encode_batch(documents)
    theirs = lambda: [e.ids for e in hf.encode_batch(documents, add_special_tokens=False)]
    rounds = interleaved({"tiktoken": (ours, nullcontext), "hf_tokenizers": (theirs, nullcontext)}, repeats, pick=list)
    seconds = {name: statistics.median(each) for name, each in rounds.items()}
    return {"documents": len(documents), "megabytes": round(megabytes, 2),
            "tiktoken_mb_s": megabytes / seconds["tiktoken"], "hf_tokenizers_mb_s": megabytes / seconds["hf_tokenizers"],
            "ratio": utilization.ratio_spread([(rounds["hf_tokenizers"], rounds["tiktoken"])]),
            "identical": ours() == theirs()}


def bench_loader_data(data_dir: Path) -> data.Shard:
    """The training shard in data_dir, prepared there with the toy preset's settings if there is none."""
    if (data_dir / "train" / data.MANIFEST_FILE).is_file():
        return data.Shard(data_dir / "train")
    preset = presets.PRESETS["toy"]
    enc = corpora.vocabulary(preset.data)
    train, _ = prepare_shards.prepare("toy", data_dir, enc, max_len=preset.data["max_len"], n_train_docs=None,
                                      n_val_docs=preset.data["val_docs"], seed=preset.run["seed"], progress=False)
    return train


def bench_loader(train: data.Shard, step_seconds: float, steps: int = 200, repeats: int = 3) -> dict:
    """Batches/s of the toy's batcher over the toy shard, and its rate over the train step's (`step_seconds`)."""
    preset = presets.PRESETS["toy"]
    batcher = data.Batcher(train, preset.run["global_batch"], 0, replay_docs=len(train),
                           micro_batch=preset.run["micro_batch"])
    rounds = interleaved({"loader": (lambda: [next(batcher) for _ in range(steps)], nullcontext)}, repeats,
                         pick=list)["loader"]
    return {"loader_batches_per_s": steps / statistics.median(rounds), "train_steps_per_s": 1 / step_seconds,
            "loader_over_train_step": utilization.ratio_spread([([step_seconds] * repeats, [s / steps for s in rounds])])}


def environment() -> dict:
    return {"cpu": devices.cpu_model(), "threads": torch.get_num_threads(), "capability": devices.cpu_instructions(),
            "torch": torch.__version__, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def train_step_lines(step: dict) -> list[str]:
    """bench_train_step's results as the lines bench prints, per allocator policy."""
    lines = [f"bf16: {step['bf16']}"]
    goals = {"fp32_vs_hf_fp32": "eager fp32 {} transformers fp32 (goal >= 1.0)",
             "bf16_vs_hf_fp32": "bf16 autocast {} transformers fp32 (goal >= 1.3)",
             "bf16_vs_hf_bf16": "bf16 autocast {} transformers bf16"}
    for policy, measured in step["policies"].items():
        settings = " ".join(f"{k}={v}" for k, v in measured["allocator"][0].items()) or "no malloc settings"
        faults = ", ".join(f"{name} {n:,.0f}" for name, n in measured["minor_faults_per_step"].items())
        lines.append(f"under {policy} ({settings}), {measured['processes']} fresh processes; minor page faults a "
                     f"step: {faults}")
        for name, ratio in measured["speedups"].items():
            norm, pair = name.split("_", 1)
            each = ", ".join(f"{r:.2f}x" for r in ratio["per_process"])
            lines.append(f"  {norm}: {goals[pair].format(utilization.spread_text(ratio))}; per process {each}")
    return lines


# The measured sizes (tests/test_bench.py runs the same code at tiny ones): the KD loss at a paper-sized vocabulary,
# the whole toy corpus, 12 steps a phase for the lockstep runs.
SIZES = {"kd": {}, "tokenizer_documents": None, "lockstep_steps": 12, "loader_steps": 200, "cold_compile": True,
         "utilization_scales": utilization.SCALES, "train_step_processes": 2, "lockstep_processes": 3,
         "layout_steps": layout_bench.SAMPLE_MICRO_BATCHES}


def main(repeats: int = 5, data_dir: Path = Path("runs/toy/data"), sizes: dict = SIZES, out: Path = RESULTS):
    """Every benchmark, in one run; the toy shard is prepared in data_dir if it is not there."""
    train = bench_loader_data(data_dir)
    results, ratio = {"environment": environment()}, utilization.spread_text
    print(f"the steps against this CPU's matmul peak, {torch.get_num_threads()} thread(s) ...", flush=True)
    results["utilization"] = used = utilization.measure(repeats, sizes["utilization_scales"])
    print("\n".join(f"  {line}" for line in utilization.summary(used)))
    print("the padding-free layout against padded rows, on the toy's own documents ...", flush=True)
    results["layout"] = layout = layout_bench.bench_layout(train, repeats, sizes["layout_steps"], precision="fp32",
                                                           peak_gflops=used["peak_gflops"]["fp32"]["best"])
    print("\n".join(f"  {line}" for line in layout_bench.summary(layout)))
    print("train step: kit vs transformers Qwen3ForCausalLM, in fresh processes ...", flush=True)
    results["train_step"] = step = bench_train_step(repeats, sizes["train_step_processes"])
    print("\n".join(f"  {line}" for line in train_step_lines(step)))
    kd_shape = {**dict(tokens=4096, vocab=151936, hidden=256), **sizes["kd"]}
    print(f"chunked KD loss vs naive ({kd_shape['tokens']} tokens x vocab {kd_shape['vocab']:,} x hidden "
          f"{kd_shape['hidden']}) ...", flush=True)
    results["kd_loss"] = loss = bench_loss(**sizes["kd"])
    print(f"  peak memory {loss['memory_ratio']:.1%} of naive (goal <= 20%; resident memory, the same in every "
          f"process), time {ratio(loss['time_ratio'])} (goal <= 1.15x)")
    print("tokenizer vs HF tokenizers on the toy corpus ...", flush=True)
    results["tokenizer"] = tok = bench_tokenizer(documents=sizes["tokenizer_documents"])
    print(f"  {tok['tiktoken_mb_s']:.1f} MB/s vs {tok['hf_tokenizers_mb_s']:.1f} MB/s: {ratio(tok['ratio'])}, "
          f"identical ids: {tok['identical']}")
    results["loader"] = loader = bench_loader(train, step.get("kit_post_bf16_s", step["kit_post_fp32_s"]),
                                              sizes["loader_steps"])
    print(f"  data loader: {loader['loader_batches_per_s']:,.0f} batches/s, "
          f"{ratio(loader['loader_over_train_step'], '{:,.0f}x'.format)} the train step's rate")
    print("the six replay runs of a seed, one after the other and in lockstep, as whole processes ...", flush=True)
    results["lockstep"] = lock = bench_lockstep(data_dir, sizes["lockstep_steps"], sizes["lockstep_processes"])
    whole = lambda way: "{min:.0f}/{median:.0f}/{max:.0f} s".format(**lock[f"{way}_process_s"])
    print(f"  lockstep {ratio(lock['speedup'])} as fast, whole processes (min/median/max: {whole('separate')} -> "
          f"{whole('lockstep')}); training alone {ratio(lock['in_process_speedup'])}; teacher forwards "
          f"{lock['separate_teacher_forwards']} -> {lock['lockstep_teacher_forwards']}; identical results: "
          f"{lock['identical_results']}")
    print("compiled toy step (fixed shapes) vs eager ...", flush=True)
    results["compile"] = comp = utilization.bench_compile(repeats, sizes["cold_compile"], sizes["utilization_scales"][0])
    even = f"{comp['break_even_steps']:,.0f} steps" if comp["break_even_steps"] else "never (not faster here)"
    print(f"  compiled {ratio(comp['speedup_at_fixed_shapes'])} eager at the same fixed shapes (goal >= 1.3x), "
          f"{ratio(comp['speedup'])} eager on batches as wide as their documents; compile {comp['compile_s']:.0f} "
          f"s, pays back after {even}; loss within {comp['max_relative_loss_difference']:.1e} (relative)")
    out.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_json(out, results)
    print(f"wrote {out}")
    return results

