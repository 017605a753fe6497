"""What the kit does when a grow or freeze run appends a block (issue 33; the settings and their reasons
are pre-registered in docs/preregistrations.md, 2026-12-02). Each is a RunConfig option, off by default:

    append_init matched          the new block's norm gains start at the RMS of the stream it reads (idea 2)
    append_init preserve-output  a new post-norm block's output norm starts from the previous block's gain
    importance_remedy reinit     a prefix block whose removal costs < identity_threshold nats is re-drawn (3)
    boundary_correction norm     an RMSNorm at the new block's input where the reading fires (idea 5)
    norm auto                    each appended block post-norm where the reading fires, else pre (idea 7)

The reading (at_transition), at phase p's first step before any update, fires where a statistic of the stream
block p reads passes its monitor threshold; each transition is an "event" row of metrics.jsonl.
"""

import math
from functools import partial
from typing import Callable

import torch

import kd
import model
from config import Phase, RunConfig
from interventions.placements import residual_scale
from nets import release
from plumbing.devices import on_meta_device

GROWING = ("grow", "freeze")


def acts(config: RunConfig) -> bool:
    return ((config.norm == "auto" and config.protocol in GROWING) or config.append_init != "default"
            or config.importance_remedy != "none" or config.boundary_correction != "none")


def reading(streams: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], total: Callable[[list], list]) -> dict:
    """The monitor's statistics of per-token RMS over the real tokens of (stream, mask, first) triples, summed over
    ranks by `total` in two passes (the kurtosis from centred moments, which a near-constant RMS would lose)."""
    parts = []
    for h, mask, first in streams:
        rms, mask = h.float().pow(2).mean(-1).sqrt().double(), mask.bool()
        parts.append((rms[mask], rms[mask & first], rms[mask & ~first]))
    r, first, others = (torch.cat(column) for column in zip(*parts))
    n, s, n_first, s_first, n_others, s_others = total(
        [r.numel(), r.sum().item(), first.numel(), first.sum().item(), others.numel(), others.sum().item()])
    mean = s / n
    m2, m4 = total([(r - mean).pow(2).sum().item(), (r - mean).pow(4).sum().item()])
    others_mean = s_others / n_others if n_others else math.nan
    return {"mean": mean, "kurtosis": (m4 / n) / (m2 / n) ** 2 if m2 > 0 else math.nan,
            "boundary_over_others": (s_first / n_first) / others_mean if n_first and n_others else math.nan,
            "others_mean": others_mean}


@torch.no_grad()
def removal_costs(net: model.Student, batches: list, active: int, chunk: int, total) -> dict[int, float]:
    """CE with each of blocks 0..active-1 bypassed minus the full CE, token-weighted over ranks."""
    def ce(skip):
        sums = [0.0, 0.0]
        for micro in batches:
            s = net(micro.input_ids, active_blocks=active, skip_block=skip, doc_lengths=micro.doc_lengths, output_fn=partial(
                kd.kd_sums, teacher_hidden=None, teacher_head_weight=None, targets=micro.targets, mask=micro.mask,
                chunk_size=chunk))
            sums = [sums[0] + float(s["ce"]), sums[1] + float(s["n"])]
        loss, n = total(sums)
        return loss / max(n, 1.0)
    base = ce(None)
    return {q: ce(q) - base for q in range(active)}


@torch.no_grad()
def at_transition(net: model.Student, config: RunConfig, phase: Phase, batches: list,
                  total: Callable[[list], list]) -> dict:
    """Read the stream block p reads and act as the run's options say; the event, what a resume re-applies in "keep"."""
    p = phase.index
    event: dict = {"event": "transition", "block": p}
    streams = []
    for micro in batches:  # the stream block p reads: the prefix's output after the boundary intervention
        layout = micro.doc_lengths  # a packed micro-batch's documents; None for padded rows
        profile = net.profile_source(micro.input_ids, p + 1, layout) if net.boundary == "mirror-fwd" else None
        _, bounds = net(micro.input_ids, active_blocks=p, output_fn=lambda h, w: None, return_boundaries=True,
                        doc_lengths=layout)
        streams.append((net.enter_block(p, bounds[p], profile), micro.mask, micro.first_positions().to(micro.mask.device)))
    stats = reading(streams, total)
    release(net)
    limits = {"mean": config.monitor_rms_warn, "kurtosis": config.monitor_kurtosis_warn,
              "boundary_over_others": config.monitor_ratio_warn}
    fires = [key for key, limit in limits.items() if stats[key] > limit]  # strictly; a NaN never fires
    event.update(reading={k: v if math.isfinite(v) else None for k, v in stats.items()}, fired=fires)  # strict JSON
    keep = {}
    if config.norm == "auto" and config.protocol in GROWING:
        # --norm auto's rule for an appended block: post-norm where its reading fires, else pre-norm
        keep["placement"] = "post" if fires else "pre"
    if config.boundary_correction == "norm" and fires:
        keep["corrected"] = True
        # regular tokens keep their scale; the outlier is brought to it
        net.correction_norms[p - 1].weight.fill_(stats["others_mean"])
    apply_kept(net, p, keep)
    if config.append_init == "matched":
        for layer in net.block_layers(p):
            for name in layer.placement.layer_norms:
                getattr(layer, name).weight.fill_(stats["mean"])
        event["matched_gain"] = stats["mean"]
    elif config.append_init == "preserve-output":
        new, previous = net.block_layers(p)[-1], net.block_layers(p - 1)[-1]
        if any(pl.final_norm or "mlp_norm" not in pl.layer_norms for pl in net.placements[p - 1:p + 1]):
            raise ValueError(f"append_init preserve-output: blocks {p - 1} and {p} must both end in an output norm "
                             f"(post-norm-like), not {net.norm_placement}")
        new.mlp_norm.weight.copy_(previous.mlp_norm.weight)
    if config.importance_remedy == "reinit":
        costs = removal_costs(net, batches, p, config.loss_chunk, total)
        release(net)
        weak = [q for q, cost in costs.items() if cost < config.identity_threshold]
        for q in weak:
            net.reinit_block(q, torch.Generator().manual_seed(remedy_seed(config.seed, p, q)))
        event.update(removal_costs={str(q): c for q, c in costs.items()}, reinitialized=weak)
    return {**event, "keep": keep}


def remedy_seed(seed: int, phase: int, block: int) -> int:
    """The re-drawn block's own generator seed: distinct per (run seed, phase, block), within int64."""
    return (seed * 1_000_003 + phase * 1_009 + block) % 2**63


def apply_kept(net: model.Student, p: int, keep: dict):
    """The decisions at block p's transition that live outside the weights: a correction switched on, and a
    placement (--norm auto), which block p >= 1 takes where that leaves the student's parameters as they are."""
    if norm := keep.get("placement"):
        names = list(model.block_norms(net.norm_placement, net.blocks))
        names[p] = norm
        with on_meta_device():
            other = model.Student(net.config, net.blocks, net.layers_per_block, ",".join(names), net.boundary,
                                  net.boundary_scale, net.features)
        if p == 0 or other.state_dict().keys() != net.state_dict().keys():
            raise ValueError(f"block {p} cannot become {norm}-norm in the schedule {net.norm_placement}: the "
                             "student's parameters would change")
        net.placements[p] = model.placement(norm)
        for layer in net.block_layers(p):
            layer.placement = net.placements[p]
            layer.residual_scale = residual_scale(layer, len(net.layers))
        net.norm_placement = ",".join(names) if len(set(names)) > 1 else names[0]
    if keep.get("corrected"):
        net.corrected.add(p)
