"""Diagnostics of trained runs (paper RQ3), computed from checkpoints, a fixed diagnostic batch and the metrics
log, never by training; every result is a plain JSON-able dict or list (the figures are figures.py's). The
definitions, and how each maps to the paper's: docs/method.md.

    stats = diag.diagnose_checkpoint(model.Student.load(path), batch, tokenizer.decode, active_blocks=2)
    removal = diag.block_removal(model.Student.load("runs/toy/s42/pre-grow/phase-2"), batch)      # Table 4
    responses = diag.transition_responses(rundir.read_metrics(run_dir), phase_steps=S, blocks=3)  # Table A4
"""

import math
import re
import unicodedata
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import config
import kd
import paper
from plumbing import checkpoint, errors

# Boundary statistics: per-token RMS of the residual stream at each block boundary

def token_rms(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N,) float64 per-token RMS over the hidden dimension of the real tokens of hidden (B, T, H)."""
    real = hidden[mask.to(hidden.device)].double()                            # (N, H)
    return real.pow(2).mean(-1).sqrt()


def summarize(values: torch.Tensor) -> dict:
    """{"tokens", "mean", "std", "max", "kurtosis"} of a 1-d tensor in float64: the population std, Pearson's
    kurtosis m4 / m2^2 (normal = 3; None when the values do not vary)."""
    values = values.double()
    n = values.numel()
    if n == 0:
        return {"tokens": 0, "mean": None, "std": None, "max": None, "kurtosis": None}
    centred = values - values.mean()
    m2, m4 = centred.pow(2).mean().item(), centred.pow(4).mean().item()
    return {"tokens": n, "mean": values.mean().item(), "std": math.sqrt(m2), "max": values.max().item(),
            "kurtosis": m4 / m2**2 if m2 > 0 else None}


def boundary_label(b: int) -> str:
    return "entry" if b == 0 else f"after block {b - 1}"


def boundary_stats(boundaries: list[torch.Tensor], mask: torch.Tensor) -> list[dict]:
    """Per boundary b (0: block 0's input, "entry"; b >= 1: block b-1's output): `summarize` of the per-token RMS
    over real tokens, massive_activation, and kurtosis_distinct, over distinct hidden states: every row's first
    state is the same <|endoftext|>'s, which caps the plain kurtosis near the row length (kurtosis_cap)."""
    out = []
    for b, h in enumerate(boundaries):
        distinct = torch.unique(h[mask.to(h.device)].double(), dim=0)
        spread = summarize(distinct.pow(2).mean(-1).sqrt())
        out.append({"boundary": b, "label": boundary_label(b), **summarize(token_rms(h, mask)),
                    "distinct_tokens": spread["tokens"], "kurtosis_distinct": spread["kurtosis"],
                    **massive_activation(h, mask)})
    return out


def massive_activation(hidden: torch.Tensor, mask: torch.Tensor) -> dict:
    """The largest |activation| of hidden (B, T, H) over real tokens and channels against their median (Sun et al.
    2024 call ~10^3-10^4 x the median "massive"), with its channel and position; None where the median is 0."""
    mask = mask.to(hidden.device)
    real = hidden[mask].double().abs()                                           # (N, H)
    median = real.median().item() if real.numel() else 0.0
    if median == 0:
        return dict.fromkeys(("massive_ratio", "massive_channel", "massive_position", "max_abs", "median_abs"))
    token, channel = divmod(int(real.argmax()), real.shape[1])
    largest = real.max().item()
    return {"massive_ratio": largest / median, "massive_channel": channel,
            "massive_position": int(mask.nonzero()[token, 1]), "max_abs": largest, "median_abs": median}


def row_starts(mask: torch.Tensor) -> torch.Tensor:
    """Like mask: True at each padded row's first position, its document's boundary token."""
    first = torch.zeros_like(mask)
    first[:, 0] = mask[:, 0]
    return first


def first_token_attention(attention: list, mask: torch.Tensor, first: torch.Tensor | None = None) -> list:
    """Per layer (None if it did not run), each head's mean attention weight on its document's position 0 over the
    real queries after it, from captured["first_attention"]; `first` marks each document's position 0 (default:
    each row's first column). A head near 1 is an attention sink (Gu et al. 2024)."""
    real = mask & ~(row_starts(mask) if first is None else first)                 # (B, T)

    def per_head(weights):
        queries = real.to(weights.device)
        return ((weights.double() * queries[:, None]).sum((0, 2)) / queries.sum().clamp_min(1)).tolist()
    return [None if weights is None else per_head(weights) for weights in attention]


def even_first_token_attention(mask: torch.Tensor, window: int = 0) -> float:
    """What first_token_attention reads for a head that spreads each query evenly over the keys it sees."""
    t = mask[:, 1:].nonzero()[:, 1].double() + 1                                # the real queries' positions
    even = torch.where((t < window) | (window == 0), 1 / (t + 1), torch.zeros_like(t))
    return float(even.mean()) if len(t) else math.nan


def sink_heads(per_layer: list, layers, threshold: float) -> float | None:
    """The fraction of the heads of `layers` whose mean first-token attention is at least `threshold`."""
    heads = [h for i in layers if per_layer[i] is not None for h in per_layer[i]]
    return sum(h >= threshold for h in heads) / len(heads) if heads else None


def kurtosis_cap(outliers: int, tokens: int) -> float:
    """The largest Pearson kurtosis `tokens` values can have when `outliers` of them are one equal outlier and the
    rest equal: (1 - 3p + 3p^2) / (p (1 - p)) with p = outliers / tokens (docs/method.md)."""
    p = outliers / tokens
    return (1 - 3 * p + 3 * p * p) / (p * (1 - p))


# Token types

TOKEN_TYPE_DEFINITION = """\
Every real (unpadded) input position is one of three types; padding is PADDING (-1) and excluded.
- BOUNDARY (0): position 0 of each row, the document's leading <|endoftext|>. Documents are never
  packed, so this is the only document-boundary token among the inputs. Found by position, not by
  token id, because padding is <|endoftext|> too.
- DELIMITER (1): any other token whose decoded text is non-empty and made only of whitespace
  (str.isspace: spaces, tabs, newlines) and Unicode punctuation (categories P*: . , ; : ! ? ' " - ( )
  [ ] { } and the like) and separators (Z*). Symbols (S*: $ + < = > ^ ` | ~, currency, math) are NOT
  delimiters: they carry content in code and formulas.
- REGULAR (2): everything else, including tokens that decode to part of a multi-byte character.
The paper lumps document-boundary and delimiter tokens together as "structural"; they are split here."""

PADDING, BOUNDARY, DELIMITER, REGULAR = -1, 0, 1, 2
TOKEN_TYPE_NAMES = {BOUNDARY: "boundary", DELIMITER: "delimiter", REGULAR: "regular"}


def is_delimiter_text(text: str) -> bool:
    return bool(text) and all(ch.isspace() or unicodedata.category(ch)[0] in "PZ" for ch in text)


def token_types(input_ids: torch.Tensor, mask: torch.Tensor, decode: Callable[[list[int]], str]) -> torch.Tensor:
    """(B, T) long: BOUNDARY, DELIMITER, REGULAR or PADDING per input position (TOKEN_TYPE_DEFINITION)."""
    input_ids, mask = input_ids.cpu(), mask.cpu()
    delimiter_ids = [i for i in input_ids[mask].unique().tolist() if is_delimiter_text(decode([i]))]
    types = torch.full(input_ids.shape, REGULAR, dtype=torch.long)
    types[torch.isin(input_ids, torch.tensor(delimiter_ids, dtype=input_ids.dtype))] = DELIMITER
    types[:, 0] = BOUNDARY
    types[~mask] = PADDING
    return types


def token_type_rms(boundaries: list[torch.Tensor], mask: torch.Tensor, types: torch.Tensor) -> list[dict]:
    """Per boundary: the mean and std of each token type's per-token RMS, and boundary_over_regular."""
    real_types = types[mask.cpu()]                                            # (N,), same order as token_rms
    results = []
    for b, h in enumerate(boundaries):
        rms = token_rms(h, mask).cpu()
        row = {"boundary": b, "label": boundary_label(b)}
        for code, name in TOKEN_TYPE_NAMES.items():
            of_type = rms[real_types == code]
            row[f"{name}_rms"] = of_type.mean().item() if of_type.numel() else None
            row[f"{name}_rms_std"] = summarize(of_type)["std"]
            row[f"{name}_tokens"] = of_type.numel()
        defined = row["boundary_rms"] is not None and row["regular_rms"]   # None or 0 regular: no ratio
        row["boundary_over_regular"] = row["boundary_rms"] / row["regular_rms"] if defined else None
        results.append(row)
    return results


# One checkpoint, and the kept checkpoints of a run

def captured_forward(net, input_ids: torch.Tensor, active_blocks: int | None = None) -> dict:
    """net.captured of one forward of net (a student running blocks 0..active_blocks-1, or a Qwen3)."""
    device = next(net.parameters()).device
    blocks = {} if active_blocks is None else {"active_blocks": active_blocks}
    net.capture_boundaries = True
    try:
        net(input_ids.to(device), output_fn=lambda hidden, head_weight: None, **blocks)
    finally:
        net.capture_boundaries = False
    captured, net.captured = net.captured, None
    return captured


@torch.no_grad()
def diagnose_checkpoint(student, batch, decode: Callable, active_blocks: int | None = None) -> dict:
    """The boundary statistics of one student (or a Qwen3) on a fixed batch, running `active_blocks` (all)."""
    captured = captured_forward(student, batch.input_ids, active_blocks)
    boundaries = captured["boundaries"]
    types = token_types(batch.input_ids, batch.mask, decode)
    return {"boundary_stats": boundary_stats(boundaries, batch.mask),
            "token_type_rms": token_type_rms(boundaries, batch.mask, types),
            "token_rms": [token_rms(h, batch.mask).tolist() for h in boundaries],
            "first_token_attention": first_token_attention(captured["first_attention"], batch.mask)}


# The layer-by-layer scan: every decoder layer's output, not only block boundaries

@torch.no_grad()
def layer_scan(net, batch, decode: Callable, sink_attention: float, active_blocks: int | None = None,
               top: int = 3) -> list[dict]:
    """Per decoder layer that ran, of its output on `batch` (read with forward hooks): the `top` largest
    |activations| and their ratio to the median, the boundary token's RMS over the regular tokens', and each head's
    first-token attention, with the share of heads putting at least `sink_attention` on position 0."""
    outputs = {}
    keep = lambda index, module, args, output: outputs.__setitem__(index, output.detach())
    hooks = [layer.register_forward_hook(partial(keep, i)) for i, layer in enumerate(net.layers)]
    try:
        captured = captured_forward(net, batch.input_ids, active_blocks)
    finally:
        for hook in hooks:
            hook.remove()
    attention = first_token_attention(captured["first_attention"], batch.mask)
    types = token_types(batch.input_ids, batch.mask, decode)
    rows = []
    for i in sorted(outputs):
        h, mask = outputs[i], batch.mask.to(outputs[i].device)
        real = h[mask].double().abs()                                            # (N, H), row-major over (row, position)
        places = mask.nonzero()                                                  # (N, 2): row, position of each real token
        median = real.median().item()
        # Every row's position 0 holds the same state: the top values are counted once per (channel, position).
        values, flat = real.flatten().topk(min(top * (mask.shape[0] + 1), real.numel()))
        tops, seen = [], set()
        for value, index in zip(values.tolist(), flat.tolist()):
            token, channel = divmod(index, real.shape[1])
            row, position = places[token].tolist()
            if (channel, position) in seen or len(tops) == top:
                continue
            seen.add((channel, position))
            tops.append({"abs": value, "ratio": value / median if median else None, "channel": channel, "row": row,
                         "position": position, "token": decode([int(batch.input_ids[row, position])])})
        heads = attention[i]
        rows.append({"layer": i, "median_abs": median, "top": tops,
                     "massive_ratio": tops[0]["ratio"] if tops else None,
                     "boundary_over_regular": token_type_rms([h], batch.mask, types)[0]["boundary_over_regular"],
                     "first_token_attention": heads, "max_head": max(heads) if heads else None,
                     "sink_heads": sink_heads(attention, [i], sink_attention)})
    return rows


def checkpoint_series(run_dir) -> list[dict]:
    """The kept checkpoints of a run (phase-<p>/, step-<n>/) in step order, with their active blocks."""
    run_dir = Path(run_dir)
    phases = config.plan_phases(config.read(run_dir))
    series = {}
    for ckpt in run_dir.iterdir():
        state_file = ckpt / "trainer_state.json"
        if re.fullmatch(r"(phase|step)-\d+", ckpt.name) and state_file.is_file():
            state = checkpoint.loads(state_file.read_text())
            series[state["step"]] = {"step": state["step"], "phase": state["phase"],
                                     "active_blocks": phases[state["phase"]].active_blocks, "path": str(ckpt)}
    return [series[step] for step in sorted(series)]


# Whole-block removal (Table 4, Figure A2)

def angular_distance(h_in: torch.Tensor, h_out: torch.Tensor) -> torch.Tensor:
    """arccos(cos(h_in, h_out)) / pi per vector, in float64, as 2 * atan2(|u - v|, |u + v|) / pi of the unit
    vectors: the same angle, exact where arccos is ill-conditioned (cos near +-1)."""
    u = torch.nn.functional.normalize(h_in.double(), dim=-1)
    v = torch.nn.functional.normalize(h_out.double(), dim=-1)
    return 2 * torch.atan2((u - v).norm(dim=-1), (u + v).norm(dim=-1)) / math.pi


@torch.no_grad()
def block_removal(student, batch) -> list[dict]:
    """Per block l: delta_ce = CE(skip block l) - CE(full) over real targets, and the angular distance between the
    stream entering and leaving block l in the full model's forward, over real tokens. Skipping follows
    model.Student: a post-norm block goes with its norms, the entry norm stays."""
    device = next(student.parameters()).device
    input_ids, targets, mask = batch.input_ids.to(device), batch.targets.to(device), batch.mask.to(device)

    def mean_ce(hidden, head_weight) -> float:
        sums = kd.kd_sums(hidden, head_weight, None, None, targets, mask)
        return (sums["ce"] / sums["n"]).item()
    ce_full, boundaries = student(input_ids, output_fn=mean_ce, return_boundaries=True)
    results = []
    for block in range(student.blocks):
        ce_skip = student(input_ids, skip_block=block, output_fn=mean_ce)
        angular = angular_distance(boundaries[block], boundaries[block + 1])[mask].mean().item()
        results.append({"block": block, "ce_full": ce_full, "ce_skip": ce_skip,
                        "delta_ce": ce_skip - ce_full, "angular_distance": angular})
    return results


DIAGNOSTICS = "diagnostics.json"  # what a study recorded of a run (experiments/studies.py), read before any weights
BLOCK_REMOVAL_KEYS = ("block", "ce_full", "ce_skip", "delta_ce", "angular_distance")


def block_removal_rows(rows) -> bool:
    """Whether `rows` are block_removal's as the kit records them: a row of finite numbers per block, in order."""
    return isinstance(rows, list) and bool(rows) and all(
        isinstance(r, dict) and all(checkpoint.finite_number(r.get(k)) for k in BLOCK_REMOVAL_KEYS) for r in rows) \
        and [r["block"] for r in rows] == list(range(len(rows)))


def recorded_block_removal(path: Path) -> list[dict]:
    """block_removal's rows as a study's record keeps them: a row per block, finite numbers, or one line."""
    try:
        rows = checkpoint.loads(Path(path).read_text()).get("block_removal")
    except (OSError, ValueError, AttributeError):
        rows = None
    if not block_removal_rows(rows):
        raise errors.TrainingError(f"{path}: block_removal is not a row of finite numbers per block; the file was "
                                   "edited or damaged: move the run folder away and rerun")
    return rows


# Transition-aligned training-loss response (Table A4)

MIN_WINDOW = 5  # steps: a scaled window never shrinks below this, so short phases do not report noise


def paper_scaled(paper_steps: int, phase_steps: int) -> int:
    """A window the paper states in its 50k-step phases, scaled to this run's phase length (MIN_WINDOW at least)."""
    return min(max(MIN_WINDOW, round(paper_steps * phase_steps / paper.PHASE_STEPS)), max(phase_steps, 1))


def training_losses(rows: list[dict], key: str = "loss") -> dict[int, float]:
    """{step: value} of the training-step rows of a metrics log (evaluation and monitor rows skipped)."""
    return {r["step"]: r[key] for r in rows if not r.get("eval") and not r.get("monitor")}


def loss_window(losses: dict[int, float], first: int, last: int) -> np.ndarray:
    missing = [s for s in range(first, last + 1) if s not in losses]
    if first < 1 or missing:
        raise errors.TrainingError(f"the metrics log lacks training steps in {first}..{last} (first missing: "
                         f"{missing[0] if missing else first}); the run has not got that far, or the windows "
                         "are longer than its phases")
    return np.array([losses[s] for s in range(first, last + 1)], dtype=np.float64)


def transition_response(rows: list[dict], transition_step: int, phase_steps: int, *, key: str = "loss",
                        baseline_window: int | None = None, smooth: int | None = None,
                        short_window: int | None = None, long_window: int | None = None) -> dict:
    """The training-loss response to appending a block after step `transition_step` (T; step T+k is the k-th with
    the new block), as docs/method.md defines it for Table A4, with which reading fits the paper's columns. Windows
    default to the paper's (baseline 1000, smooth 200, short 1000, long 5000 steps) scaled by paper_scaled. `key`:
    the metrics column, "loss" or "ce". The smoothed loss is a trailing mean over the whole log (its first `smooth`
    steps reach back before T); recovery_steps is None where the loss never returned or never rose."""
    T = transition_step
    baseline_window = baseline_window or min(paper_scaled(1000, phase_steps), T)
    smooth = smooth or paper_scaled(200, phase_steps)
    short_window = short_window or paper_scaled(1000, phase_steps)
    long_window = long_window or paper_scaled(5000, phase_steps)
    losses = training_losses(rows, key)
    baseline = float(loss_window(losses, T - baseline_window + 1, T).mean())

    # Raw losses from step T+2-smooth, so that smoothed[k-1] and excess[k-1] belong to step T+k.
    searched = min(phase_steps, max(losses) - T)
    raw = loss_window(losses, T + 2 - smooth, T + max(searched, long_window))
    smoothed = np.lib.stride_tricks.sliding_window_view(raw, smooth).mean(axis=1)
    excess = raw[smooth - 1:] - baseline

    peak = int(np.argmax(smoothed[:short_window]))                           # first maximum
    jump = float(smoothed[peak] - baseline)
    returned = np.flatnonzero(smoothed[peak:searched] <= baseline)
    return {"transition_step": T, "baseline": baseline, "jump": jump,
            "immediate_jump": float(excess[:smooth].max()), "peak_step": peak + 1,
            "auc_1k": float(excess[:short_window].mean()), "auc_5k": float(excess[:long_window].mean()),
            "abs_auc_1k": float(np.abs(excess[:short_window]).mean()),
            "abs_auc_5k": float(np.abs(excess[:long_window]).mean()), "rose": jump > 0,
            "recovery_steps": int(peak + returned[0] + 1) if returned.size and jump > 0 else None,
            "searched_steps": searched, "baseline_window": baseline_window, "smooth": smooth,
            "short_window": short_window, "long_window": long_window}


def transition_responses(rows: list[dict], phase_steps: int, blocks: int, **windows) -> list[dict]:
    """transition_response at every block-append step of a grow run: after steps S, 2S, ..., (K-1)S."""
    return [transition_response(rows, p * phase_steps, phase_steps, **windows) for p in range(1, blocks)]
