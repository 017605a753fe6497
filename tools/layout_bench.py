"""The padding-free layout against the padded one (issue 56), on the toy's own documents: the student's step
(the teacher's forward, the student's forward and backward through the chunked KD loss, clipping, AdamW) and the
teacher's pretraining step, each on the same micro-batches of the toy's training shard laid out both ways.

    python -m tools.layout_bench          # alone; `repro.py bench` runs it too (results/bench.json's "layout")

The sample (docs/preregistrations.md, "the layout bench's sample and its ceiling"): 16 micro-batches at evenly
spaced steps of the toy run's first epoch, so that their share of real positions is the run's (a micro-batch's
varies with an SD of about 8 points; 16 hold the mean within 2). The ceiling: the padded step on micro-batches
of documents that fill max_len, whose rows hold no padding, so no layout does less work a token there; their
real tokens a second over padded's on the sample is the most an exact layout could gain here, up to two small
biases of opposite sign: a full-length document's attention costs more a token than a shorter one's (it reads
low), and its micro-batches hold more tokens, over which the once-a-step optimizer is spread (it reads high).

Useful FLOPs count real tokens only: each document's tokens through flops.forward_flops_per_token at half its
length (its average causal context), whatever the layout computes besides; over the seconds a step takes, and
against this CPU's best square matmul (utilization.peaks), they are the step's useful fraction of peak. The ratio
packed / padded is the same tokens' rate, round by round (utilization.interleaved, ratio_spread).
"""
import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np

import data
from experiments import presets
from plumbing import devices
from plumbing.flops import forward_flops_per_token
from tools import utilization

LAYOUTS = ("padded", "packed")
CEILING = "full-length"  # the padded step on documents that fill max_len: nothing to skip
SAMPLE_MICRO_BATCHES = 16


def epoch_micro_batches(train: data.Shard) -> list[list[int]]:
    """The documents of every micro-batch of the toy run's first epoch, as its batcher draws them."""
    run = presets.PRESETS["toy"].run
    batcher = data.Batcher(train, run["global_batch"], run["seed"], replay_docs=len(train), micro_batch=run["micro_batch"])
    return [list(ids) for ids in batcher.first_epoch_micro_batches()]


def sample(epoch: list[list[int]], count: int) -> list[list[int]]:
    """`count` micro-batches at evenly spaced steps of the epoch."""
    return [epoch[i * (len(epoch) // count)] for i in range(count)]


def full_length(train: data.Shard, epoch: list[list[int]], count: int) -> list[list[int]]:
    """`count` micro-batches of the epoch's first documents that fill max_len, as many to one as the epoch's."""
    per, fills = len(epoch[0]), train.manifest["max_len"] + 1  # tokens: max_len inputs and the last target
    ids = [i for micro in epoch for i in micro if train.lengths[i] == fills][:count * per]
    if len(ids) < per:
        raise ValueError(f"{train.path}: fewer than {per} documents fill max_len {fills - 1}; the ceiling needs them")
    return [ids[i:i + per] for i in range(0, len(ids) - per + 1, per)]


def real_fraction(micro_batches: list[list[int]], train: data.Shard) -> float:
    """Real positions over the positions of the same micro-batches right-padded to their longest document."""
    inputs = [train.lengths[ids] - 1 for ids in micro_batches]
    return sum(n.sum() for n in inputs) / sum(len(n) * n.max() for n in inputs)


def useful_flops(kind: str, step: utilization.Step, lengths: list[int]) -> float:
    """Model FLOPs of a step over documents of `lengths` real positions, no padding counted."""
    if kind == "teacher":
        return sum(3 * n * sum(forward_flops_per_token(step.shape, step.shape.num_hidden_layers, n / 2))
                   for n in lengths)
    return sum(utilization.student_step_flops(step.shape, len(step.net.layers), n, n) for n in lengths)


def bench_layout(train: data.Shard, repeats: int = 5, steps: int = SAMPLE_MICRO_BATCHES, precision: str = "fp32",
                 peak_gflops: float | None = None) -> dict:
    """Each step kind (student, teacher) padded and packed on `steps` micro-batches sampled over the toy's first
    epoch, and padded on as many of full-length documents (the ceiling), timed in turns: real tokens a second,
    useful GFLOP/s and fraction of the `precision` matmul peak (measured here unless given), packed over padded
    and the ceiling over padded with their spreads, and where the padded step's time goes."""
    dtype, clock = devices.DTYPES[precision], utilization.step_clock()[1]
    if peak_gflops is None:
        variants, _ = utilization.matmul_variants(precision, clock=clock)
        peak_gflops = utilization.peaks(utilization.interleaved(variants, repeats, pick=min, clock=clock))[precision]["best"]
    epoch = epoch_micro_batches(train)
    micro, full = sample(epoch, steps), full_length(train, epoch, steps)
    batches = {layout: [data.make_batch(train, ids, packed=layout == "packed") for ids in micro] for layout in LAYOUTS}
    batches[CEILING] = [data.make_batch(train, ids) for ids in full]
    lengths = {name: [n for b in bs for n in b.lengths.tolist()] for name, bs in batches.items()}
    out = {"precision": precision, "peak_gflops": peak_gflops, "micro_batches": steps, "documents": len(lengths["padded"]),
           "real_tokens": sum(lengths["padded"]), "padded_positions": sum(b.input_ids.numel() for b in batches["padded"]),
           "epoch_real_fraction": real_fraction(epoch, train), "full_length_tokens": sum(lengths[CEILING]),
           # what the sample's size and the ceiling rest on (docs/preregistrations.md)
           "micro_batch_real_fraction_sd": float(np.std([real_fraction([ids], train) for ids in epoch])),
           "full_length_share": float(np.mean(train.lengths == train.manifest["max_len"] + 1))}
    for kind in ("student", "teacher"):
        settings, shape, seq = utilization.distinct_steps(("toy",))[f"toy {kind}"]
        step = utilization.Step(settings, shape, seq, dtype)
        rounds = utilization.interleaved({name: (lambda bs=bs, step=step: [step(b) for b in bs], nullcontext)
                                          for name, bs in batches.items()}, repeats, pick=list, clock=clock)
        rows = {}
        for name in (*LAYOUTS, CEILING):
            seconds, tokens = min(rounds[name]), sum(lengths[name])
            rows[name] = {"seconds": seconds, "real_tokens_per_s": tokens / seconds,
                          **utilization.fraction_of_peak(useful_flops(kind, step, lengths[name]), seconds,
                                                         peak_gflops * 1e9)}
        # rates, round by round: the ceiling's tokens differ from the sample's
        rate = {name: [sum(lengths[name]) / t for t in each] for name, each in rounds.items()}
        out[kind] = {**rows, "useful_gflop": rows["packed"]["gflop"],
                     "packed_over_padded": utilization.ratio_spread([(rate["packed"], rate["padded"])]),
                     "ceiling_over_padded": utilization.ratio_spread([(rate[CEILING], rate["padded"])]),
                     "padded_profile": utilization.profile_groups(
                         lambda bs=batches["padded"][:4], step=step: [step(b) for b in bs], 1)}
    return out


def summary(measured: dict) -> list[str]:
    """bench_layout's results as the lines bench prints."""
    lines = [f"{measured['micro_batches']} toy micro-batches over the first epoch, {measured['documents']} documents: "
             f"{measured['real_tokens']:,} real tokens, {measured['padded_positions']:,} positions padded "
             f"({measured['real_tokens'] / measured['padded_positions']:.1%} real; the epoch's "
             f"{measured['epoch_real_fraction']:.1%}, SD {measured['micro_batch_real_fraction_sd']:.1%} a micro-batch), "
             f"{measured['precision']}; the ceiling: {measured['full_length_tokens']:,} tokens of full-length documents "
             f"({measured['full_length_share']:.1%} of the shard's), padded rows with no padding"]
    for kind in ("student", "teacher"):
        row = measured[kind]
        each = "; ".join(f"{name} {row[name]['real_tokens_per_s']:,.0f} real tokens/s, useful "
                         f"{row[name]['gflops']:.1f} GFLOP/s = {row[name]['fraction_of_peak']:.1%} of the peak"
                         for name in (*LAYOUTS, CEILING))
        packed, ceiling = row["packed_over_padded"]["median"], row["ceiling_over_padded"]["median"]
        reached = f"{(packed - 1) / (ceiling - 1):.0%} of the ceiling's gain" if ceiling > 1 else "no gain to reach"
        shares = ", ".join(f"{group} {share:.0%}" for group, share in row["padded_profile"].items())
        lines += [f"toy {kind} step: {each}",
                  f"  packed {utilization.spread_text(row['packed_over_padded'])} padded's real tokens a second "
                  f"(goal >= 1.3x); the ceiling {utilization.spread_text(row['ceiling_over_padded'])}; packed "
                  f"reaches {reached}",
                  f"  the padded step's time: {shares}"]
    return lines


if __name__ == "__main__":
    shard = Path("runs/toy/data/train")
    if not (shard / data.MANIFEST_FILE).is_file():
        raise SystemExit(f"{shard}: no toy training shard here; run `python repro.py data --scale toy` first")
    measured = bench_layout(data.Shard(shard))
    print("\n".join(summary(measured)))
    print(json.dumps(measured, indent=1))
