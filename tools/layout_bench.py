"""The padding-free layout against the padded one (issue 56), on the toy's own documents: the student's step
(the teacher's forward, the student's forward and backward through the chunked KD loss, clipping, AdamW) and the
teacher's pretraining step, each on the same micro-batches of the toy's training shard laid out both ways.

    python -m tools.layout_bench          # alone; `repro.py bench` runs it too (results/bench.json's "layout")

Useful FLOPs count real tokens only: each document's tokens through flops.forward_flops_per_token at half its
length (its average causal context), whatever the layout computes besides; over the seconds a step takes, and
against this CPU's best square matmul (utilization.peaks), they are the step's useful fraction of peak. The ratio
packed / padded is the same tokens' rate, round by round (utilization.interleaved, ratio_spread).
"""
import json
from contextlib import nullcontext
from pathlib import Path

import data
from experiments import presets
from plumbing import devices
from plumbing.flops import forward_flops_per_token
from tools import utilization

LAYOUTS = ("padded", "packed")


def toy_micro_batches(train: data.Shard, steps: int) -> list[list[int]]:
    """The documents of the toy's first `steps` training steps, one micro-batch each, as a toy run draws them."""
    run = presets.PRESETS["toy"].run
    batcher = data.Batcher(train, run["global_batch"], run["seed"], replay_docs=len(train), micro_batch=run["micro_batch"])
    return [batcher.global_doc_ids(step).tolist() for step in range(steps)]


def useful_flops(kind: str, step: utilization.Step, lengths: list[int]) -> float:
    """Model FLOPs of a step over documents of `lengths` real positions, no padding counted."""
    if kind == "teacher":
        return sum(3 * n * sum(forward_flops_per_token(step.shape, step.shape.num_hidden_layers, n / 2))
                   for n in lengths)
    return sum(utilization.student_step_flops(step.shape, len(step.net.layers), n, n) for n in lengths)


def bench_layout(train: data.Shard, repeats: int = 5, steps: int = 4, precision: str = "fp32",
                 peak_gflops: float | None = None) -> dict:
    """Each step kind (student, teacher) padded and packed on the same `steps` micro-batches of the toy shard,
    timed in turns: real tokens a second, useful GFLOP/s and fraction of the `precision` matmul peak (measured
    here unless given), and packed over padded with its spread."""
    dtype, clock = devices.DTYPES[precision], utilization.step_clock()[1]
    if peak_gflops is None:
        variants, _ = utilization.matmul_variants(precision, clock=clock)
        peak_gflops = utilization.peaks(utilization.interleaved(variants, repeats, pick=min, clock=clock))[precision]["best"]
    micro = toy_micro_batches(train, steps)
    batches = {layout: [data.make_batch(train, ids, packed=layout == "packed") for ids in micro] for layout in LAYOUTS}
    lengths = [n for b in batches["packed"] for n in b.doc_lengths]
    out = {"precision": precision, "peak_gflops": peak_gflops, "micro_batches": steps, "documents": len(lengths),
           "real_tokens": sum(lengths), "padded_positions": sum(b.input_ids.numel() for b in batches["padded"])}
    for kind in ("student", "teacher"):
        settings, shape, seq = utilization.distinct_steps(("toy",))[f"toy {kind}"]
        step = utilization.Step(settings, shape, seq, dtype)
        rounds = utilization.interleaved({layout: (lambda bs=bs, step=step: [step(b) for b in bs], nullcontext)
                                          for layout, bs in batches.items()}, repeats, pick=list, clock=clock)
        flops = useful_flops(kind, step, lengths)
        rows = {}
        for layout in LAYOUTS:
            seconds = min(rounds[layout])
            rows[layout] = {"seconds": seconds, "real_tokens_per_s": sum(lengths) / seconds,
                            **utilization.fraction_of_peak(flops, seconds, peak_gflops * 1e9)}
        out[kind] = {**rows, "useful_gflop": flops / 1e9,
                     "packed_over_padded": utilization.ratio_spread([(rounds["padded"], rounds["packed"])])}
    return out


def summary(measured: dict) -> list[str]:
    """bench_layout's results as the lines bench prints."""
    lines = [f"{measured['micro_batches']} toy micro-batches, {measured['documents']} documents: "
             f"{measured['real_tokens']:,} real tokens, {measured['padded_positions']:,} positions padded "
             f"({measured['real_tokens'] / measured['padded_positions']:.0%} real), {measured['precision']}"]
    for kind in ("student", "teacher"):
        row = measured[kind]
        each = "; ".join(f"{layout} {row[layout]['real_tokens_per_s']:,.0f} real tokens/s, useful "
                         f"{row[layout]['gflops']:.1f} GFLOP/s = {row[layout]['fraction_of_peak']:.1%} of the peak"
                         for layout in LAYOUTS)
        lines.append(f"toy {kind} step: {each}; packed {utilization.spread_text(row['packed_over_padded'])} "
                     f"padded's real tokens a second (goal >= 1.3x)")
    return lines


if __name__ == "__main__":
    shard = Path("runs/toy/data/train")
    if not (shard / data.MANIFEST_FILE).is_file():
        raise SystemExit(f"{shard}: no toy training shard here; run `python repro.py data --scale toy` first")
    measured = bench_layout(data.Shard(shard))
    print("\n".join(summary(measured)))
    print(json.dumps(measured, indent=1))
