"""Diagnostics of trained runs (paper RQ3): boundary scale, token types, block removal, transition
response, and the figures. Nothing here trains; everything is computed from checkpoints, a fixed
diagnostic batch and the metrics log, and every result is a plain JSON-able dict or list.

Normally driven by repro.py; by hand:

    import diag, grow, model
    batch = ...                                   # a data.Batch: input_ids, targets, mask (B, T)
    series = []
    for ckpt in diag.checkpoint_series("runs/toy/pre-grow"):          # phase-end checkpoints, in step order
        student = model.Student.load(ckpt["path"])
        series.append({"step": ckpt["step"], **diag.diagnose_checkpoint(
            student, batch, tokenizer.decode, active_blocks=ckpt["active_blocks"])})
    removal = diag.block_removal(model.Student.load("runs/toy/pre-grow/phase-2"), batch)   # Table 4
    rows = rundir.read_metrics("runs/toy/pre-grow")
    responses = diag.transition_responses(rows, phase_steps=S, blocks=3)                  # Table A4
    diag.fig4_boundary_std({"pre": series, "post": post_series}, "results/toy/fig4.png")

Definitions (each function's docstring has the details):
- per-token RMS: sqrt(mean over the hidden dimension of h^2), float64, real (unpadded) tokens only;
  its std is the population std and its kurtosis is Pearson's (fourth standardised moment, normal = 3).
- token types: TOKEN_TYPE_DEFINITION below.
- block removal: dCE_l = CE(skip block l) - CE(full), angular distance arccos(cos(h_in, h_out)) / pi.
- transition response: transition_response's docstring, with how it maps to the paper's Table A4.

The paper's numbers that the figures mark come from PAPER (the paper's Tables 1-4, A2-A4 and Figures 4, 5).
"""
from __future__ import annotations

import contextvars
import json
import math
import re
import unicodedata
from functools import partial
from pathlib import Path
from typing import Callable

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure

import config
import errors
import kd

# ----------------------------------------------------------------------------------------------
# The paper's numbers the figures and tables sit beside (its tables, Appendix C and Figures 4-5)

PAPER_PHASE_STEPS = 50_000  # the paper's steps per phase; windows stated in paper steps scale from it

PAPER = {
    "table1": {"pre": {"joint": 2.7603, "grow": 2.7658}, "post": {"joint": 2.7607, "grow": 2.7330}},
    # Table 2: phase 0 (one block). Its "KD" has the scale of the soft-target CE H(q_T, q_S).
    "table2": {"pre": {"ce": 2.9802, "kd": 3.0155, "ppl": 19.69}, "post": {"ce": 2.9846, "kd": 3.0183, "ppl": 19.78}},
    "table3": {"post-joint": 2.7607, "post-joint-long": 2.7518, "post-joint-longer": 2.7428, "post-grow": 2.7330},
    # Table A2, in billions of tokens: (total, unique).
    "table_a2": {"post-joint": (3.11, 3.11), "post-grow": (9.34, 3.11), "post-joint-long": (6.22, 6.22),
                 "post-joint-longer": (9.34, 9.34)},
    "table_a3": {"pre": {"grow": 2.7658, "freeze": 2.9104}, "post": {"grow": 2.7330, "freeze": 2.8772},
                 "ppl_gap": {"grow": -0.51, "freeze": -0.60}},
    # Figure 3b gives no numbers; phase 0 is Table 2 (single block), phase 2 is Table 1's grow endpoint.
    "per_phase_ce": {"pre": {0: 2.9802, 2: 2.7658}, "post": {0: 2.9846, 2: 2.7330}},
    # Figure 4, after block 0: pre-norm rises first -> last grow checkpoint; post-norm stays in a range.
    "boundary_std_after_block0": {"pre": (5.81, 19.98), "post_range": (0.07, 0.19)},
    # Figure 5a: first -> last checkpoint; post-norm only at 150k ("2.45 vs 2.40": boundary, regular).
    "token_type_rms": {"pre": {"boundary": (119.0, 425.0), "regular": (7.1, 11.5)},
                       "post": {"boundary": (None, 2.45), "regular": (None, 2.40)}},
    "final_kurtosis_pre_above": 2400.0,  # Figure A1: Pearson or excess is not said; at 2400 it hardly matters
    "table4": {
        "pre-grow": {"delta_ce": (8.13, 2.36, 0.02), "angular_distance": (0.499, 0.310, 0.031)},
        "post-grow": {"delta_ce": (8.32, 3.74, 2.38), "angular_distance": (0.483, 0.365, 0.342)},
        "pre-joint": {"delta_ce": (8.05, 1.47, 2.34), "angular_distance": (0.485, 0.245, 0.360)},
        "post-joint": {"delta_ce": (0.55, 0.99, 4.00), "angular_distance": (0.395, 0.166, 0.437)},
    },
    # Table A4 (pre, post) at the two transitions, in the paper's 50k-step phases.
    "table_a4": {
        "pre": [{"jump": 0.0226, "auc_1k": 0.0694, "auc_5k": 0.1217, "recovery_steps": 101},
                {"jump": 0.0230, "auc_1k": 0.0688, "auc_5k": 0.1277, "recovery_steps": 19054}],
        "post": [{"jump": 0.2500, "auc_1k": 0.1820, "auc_5k": 0.1464, "recovery_steps": 19914},
                 {"jump": 0.2847, "auc_1k": 0.2059, "auc_5k": 0.1774, "recovery_steps": 19426}],
    },
}


# ----------------------------------------------------------------------------------------------
# Boundary statistics: per-token RMS of the residual stream at each block boundary

def token_rms(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N,) float64 per-token RMS over the hidden dimension of the real tokens of hidden (B, T, H)."""
    real = hidden[mask.to(hidden.device)].double()                            # (N, H)
    return real.pow(2).mean(-1).sqrt()


def summarize(values: torch.Tensor) -> dict:
    """{"tokens", "mean", "std", "max", "kurtosis"} of a 1-d tensor, in float64: std is the population
    std sqrt(m2) (ddof=0), kurtosis is Pearson's m4 / m2^2 (a normal gives 3; excess kurtosis would be
    this minus 3), m_k the k-th central moment. The kurtosis is None when the values do not vary."""
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
    """Per boundary b (0 = the input of block 0, "entry"; b >= 1 = the output of block b-1):
    {"boundary": b, "label", "tokens", "mean", "std", "max", "kurtosis", "distinct_tokens",
    "kurtosis_distinct"} of the per-token RMS over real tokens (padding excluded by `mask`). std is the
    population std; kurtosis is Pearson's (normal = 3). kurtosis_distinct counts each distinct hidden
    state once: every row starts with the same <|endoftext|>, whose state (causal attention) is the
    same in every row, so the plain kurtosis weighs that one outlier by the number of rows and is
    capped near the row length (kurtosis_cap); over distinct states, one row and many copies of it
    give the same value."""
    out = []
    for b, h in enumerate(boundaries):
        distinct = torch.unique(h[mask.to(h.device)].double(), dim=0)
        spread = summarize(distinct.pow(2).mean(-1).sqrt())
        out.append({"boundary": b, "label": boundary_label(b), **summarize(token_rms(h, mask)),
                    "distinct_tokens": spread["tokens"], "kurtosis_distinct": spread["kurtosis"],
                    **massive_activation(h, mask)})
    return out


def massive_activation(hidden: torch.Tensor, mask: torch.Tensor) -> dict:
    """The largest activation of the residual stream hidden (B, T, H) over real tokens and channels,
    against the median magnitude of all of them (Sun et al. 2024 call ~10^3-10^4 x the median
    "massive"): {"massive_ratio": max |h| / median |h|, "massive_channel", "massive_position" (the
    position in its row; 0 is the document-boundary token), "max_abs", "median_abs"}. None where
    there are no real tokens or the median is 0."""
    mask = mask.to(hidden.device)
    real = hidden[mask].double().abs()                                           # (N, H)
    if real.numel() == 0 or real.median().item() == 0:
        return {"massive_ratio": None, "massive_channel": None, "massive_position": None, "max_abs": None,
                "median_abs": None}
    flat = int(real.argmax())
    token, channel = divmod(flat, real.shape[1])
    position = int(mask.nonzero()[token, 1])
    median = real.median().item()
    return {"massive_ratio": real.max().item() / median, "massive_channel": channel, "massive_position": position,
            "max_abs": real.max().item(), "median_abs": median}


def first_token_attention(attention: list, mask: torch.Tensor) -> list:
    """Per layer, the mean over real queries after position 0 of each head's attention weight on
    position 0 (the document-boundary token): a list of per-head floats, None for a layer that did not
    run. attention: model.captured(...)["first_attention"], each (B, n_heads, T). A head whose mean is
    near 1 is an attention sink (Gu et al. 2024): it attends to the first token whatever the query."""
    out = []
    for weights in attention:
        if weights is None:
            out.append(None)
            continue
        real = mask[:, 1:].to(weights.device)                                    # (B, T-1)
        per_head = (weights[:, :, 1:].double() * real[:, None]).sum((0, 2)) / real.sum().clamp_min(1)
        out.append(per_head.tolist())
    return out


def sink_heads(per_layer: list, layers, threshold: float) -> float | None:
    """The fraction of the heads of `layers` (indices into per_layer) whose mean first-token attention
    is at least `threshold`; None if none of them ran."""
    heads = [h for i in layers if per_layer[i] is not None for h in per_layer[i]]
    return sum(h >= threshold for h in heads) / len(heads) if heads else None


def kurtosis_cap(outliers: int, tokens: int) -> float:
    """The largest Pearson kurtosis `tokens` values can have when `outliers` of them are one equal
    outlier and the rest equal: a two-point distribution with p = outliers / tokens has kurtosis
    (1 - 3p + 3p^2) / (p (1 - p)), about 1/p. The diagnostic batch's boundary token is such an outlier
    in every row, so B rows of n tokens cap the kurtosis of per-token RMS near n (2046 at 2 x 2048)."""
    p = outliers / tokens
    return (1 - 3 * p + 3 * p * p) / (p * (1 - p))


# ----------------------------------------------------------------------------------------------
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
    """(B, T) long: BOUNDARY, DELIMITER, REGULAR or PADDING per input position (TOKEN_TYPE_DEFINITION).
    `decode` turns a list of token ids into text (e.g. tokenizer.Tokenizer.decode); it is called once per
    distinct token id."""
    input_ids, mask = input_ids.cpu(), mask.cpu()
    delimiter_ids = [i for i in input_ids[mask].unique().tolist() if is_delimiter_text(decode([i]))]
    types = torch.full(input_ids.shape, REGULAR, dtype=torch.long)
    types[torch.isin(input_ids, torch.tensor(delimiter_ids, dtype=input_ids.dtype))] = DELIMITER
    types[:, 0] = BOUNDARY
    types[~mask] = PADDING
    return types


def token_type_rms(boundaries: list[torch.Tensor], mask: torch.Tensor, types: torch.Tensor) -> list[dict]:
    """Per boundary b (numbered as in boundary_stats): mean and population std of the per-token RMS
    of each token type, {"boundary": b, "label", "boundary_rms", "boundary_rms_std", "delimiter_rms",
    ..., "boundary_over_regular" (ratio of the means), "boundary_tokens", ...}; a type with no tokens
    gives None. These do not depend on the batch's shape: one row and many copies of it agree."""
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


# ----------------------------------------------------------------------------------------------
# One checkpoint, and the kept checkpoints of a run

@torch.no_grad()
def diagnose_checkpoint(student, batch, decode: Callable, active_blocks: int | None = None) -> dict:
    """Boundary statistics, token-type RMS and the raw per-token RMS (for histograms) of one student
    on a fixed batch, running blocks 0..active_blocks-1 (default all; a grow checkpoint of phase p
    has p+1). Returns {"boundary_stats", "token_type_rms", "token_rms": [per boundary, list of floats]}."""
    device = next(student.parameters()).device
    student.capture_boundaries = True
    try:
        student(batch.input_ids.to(device), active_blocks=active_blocks, output_fn=lambda hidden, head_weight: None)
    finally:
        student.capture_boundaries = False
    boundaries, attention = student.captured["boundaries"], student.captured["first_attention"]
    student.captured = None
    types = token_types(batch.input_ids, batch.mask, decode)
    return {"boundary_stats": boundary_stats(boundaries, batch.mask),
            "token_type_rms": token_type_rms(boundaries, batch.mask, types),
            "token_rms": [token_rms(h, batch.mask).tolist() for h in boundaries],
            "first_token_attention": first_token_attention(attention, batch.mask)}


@torch.no_grad()
def diagnose_teacher(teacher, batch, decode: Callable) -> dict:
    """The same statistics for a plain Qwen3 (a teacher), at every layer's output ("after block b" is
    after layer b here): boundary statistics with the massive activation, token-type RMS and each
    layer's first-token attention per head."""
    device = next(teacher.parameters()).device
    teacher.capture_boundaries = True
    try:
        teacher(batch.input_ids.to(device), output_fn=lambda hidden, head_weight: None)
    finally:
        teacher.capture_boundaries = False
    boundaries, attention = teacher.captured["boundaries"], teacher.captured["first_attention"]
    teacher.captured = None
    types = token_types(batch.input_ids, batch.mask, decode)
    return {"boundary_stats": boundary_stats(boundaries, batch.mask),
            "token_type_rms": token_type_rms(boundaries, batch.mask, types),
            "first_token_attention": first_token_attention(attention, batch.mask)}


def checkpoint_series(run_dir) -> list[dict]:
    """The kept checkpoints of a run (phase ends phase-<p>/ and snapshots step-<n>/) in step order:
    [{"step", "phase", "active_blocks", "path"}], active_blocks from the run's own phase plan."""
    run_dir = Path(run_dir)
    phases = config.plan_phases(config.read(run_dir))
    series = {}
    for ckpt in run_dir.iterdir():
        state_file = ckpt / "trainer_state.json"
        # NOTE: <name>.tmp / .old are a checkpoint being written or replaced; they are not kept ones.
        if re.fullmatch(r"(phase|step)-\d+", ckpt.name) and state_file.is_file():
            state = json.loads(state_file.read_text())
            series[state["step"]] = {"step": state["step"], "phase": state["phase"],
                                     "active_blocks": phases[state["phase"]].active_blocks, "path": str(ckpt)}
    return [series[step] for step in sorted(series)]


# ----------------------------------------------------------------------------------------------
# Whole-block removal (Table 4, Figure A2)

def angular_distance(h_in: torch.Tensor, h_out: torch.Tensor) -> torch.Tensor:
    """arccos(cos(h_in, h_out)) / pi per vector (last dim), in float64: 0 for equal directions, 1 for
    opposite ones. Computed as 2 * atan2(|u - v|, |u + v|) / pi with u, v the unit vectors: the same
    angle, but exact where arccos is ill-conditioned (cos near +-1, where a clamp would be needed)."""
    u = torch.nn.functional.normalize(h_in.double(), dim=-1)
    v = torch.nn.functional.normalize(h_out.double(), dim=-1)
    return 2 * torch.atan2((u - v).norm(dim=-1), (u + v).norm(dim=-1)) / math.pi


def mean_ce(sums: dict) -> float:
    return (sums["ce"] / sums["n"]).item()


@torch.no_grad()
def block_removal(student, batch) -> list[dict]:
    """Per block l of the whole student: {"block", "ce_full", "ce_skip", "delta_ce", "angular_distance"},
    delta_ce = CE(skip block l) - CE(full), CEs averaged over real targets, and angular_distance
    averaged over real tokens between the residual stream entering and leaving block l in the FULL
    model's forward. Skipping follows model.Student: a post-norm block goes with its norms, the entry
    norm stays. CE comes from kd.kd_sums (float64 sums, in token chunks: no full logits)."""
    device = next(student.parameters()).device
    input_ids, mask = batch.input_ids.to(device), batch.mask.to(device)
    ce_sums = partial(kd.kd_sums, teacher_hidden=None, teacher_head_weight=None,
                      targets=batch.targets.to(device), mask=mask)
    full_sums, boundaries = student(input_ids, output_fn=ce_sums, return_boundaries=True)
    ce_full = mean_ce(full_sums)
    results = []
    for block in range(student.blocks):
        ce_skip = mean_ce(student(input_ids, skip_block=block, output_fn=ce_sums))
        angular = angular_distance(boundaries[block], boundaries[block + 1])[mask].mean().item()
        results.append({"block": block, "ce_full": ce_full, "ce_skip": ce_skip,
                        "delta_ce": ce_skip - ce_full, "angular_distance": angular})
    return results


# ----------------------------------------------------------------------------------------------
# Transition-aligned training-loss response (Table A4)

MIN_WINDOW = 5  # steps: a scaled window never shrinks below this, so short phases do not report noise


def paper_scaled(paper_steps: int, phase_steps: int) -> int:
    """A window the paper states in steps of its 50k-step phases, scaled to this run's phase length,
    never below MIN_WINDOW steps (nor above the phase)."""
    return min(max(MIN_WINDOW, round(paper_steps * phase_steps / PAPER_PHASE_STEPS)), max(phase_steps, 1))


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
    """The training-loss response to appending a block after step `transition_step` (T). Steps are the
    metrics log's 1-based step numbers; step T+k is the k-th step with the new block. Windows default
    to the paper's scaled to this run's phase length (paper_scaled, at least MIN_WINDOW steps):
    baseline 1000, smooth 200, short 1000, long 5000 paper steps. `key` is the metrics column: "loss",
    the objective the run optimises (the paper's training loss), or "ce" for its CE term.

    - baseline: mean raw loss over steps T-baseline_window+1 .. T.
    - smoothed loss at step s: mean raw loss over steps s-smooth+1 .. s, a trailing average over the
      whole log, so for the first `smooth` steps it still reaches back before the transition (a short
      spike is diluted by up to a factor `smooth`, as any 200-step smoothed curve is).
    - jump: max of the smoothed loss over k = 1..short_window, minus the baseline; peak_step is the
      first k where that maximum is reached.
    - immediate_jump: max of the raw loss over k = 1..smooth, minus the baseline: a spike at its
      height, undiluted (and noisier: one step's loss).
    - auc_1k, auc_5k: MEAN of (raw loss - baseline) over k = 1..short_window and 1..long_window (nats;
      the sum in nat-steps is the mean times the window). abs_auc_*: the mean of |raw loss - baseline|.
    - rose: whether the smoothed loss rose above the baseline at all (jump > 0).
    - recovery_steps: the first k >= peak_step at which the smoothed loss is <= the baseline, searched
      up to k = phase_steps (the new block's phase) or the end of the log; None if it never returns
      ("not recovered") or never rose ("not applicable": then there is nothing to recover from).

    Which reading fits which column of the paper's Table A4 (its text does not define them): a sum
    cannot fit post-norm at 50k, whose AUC_5k (0.1464) is below its AUC_1k (0.1820) although its
    smoothed loss stays above baseline for 19,914 steps; a mean can. With a smoothed jump, a signed mean
    cannot fit pre-norm (AUC_1k 0.0694 above a jump of 0.0226 forces some window above the jump); a
    mean absolute deviation can, and so can a signed mean with the immediate jump. Both AUCs and both
    jumps are reported; neither pair is claimed to be the paper's.

    Returns {"transition_step", "baseline", "jump", "immediate_jump", "peak_step", "auc_1k", "auc_5k",
    "abs_auc_1k", "abs_auc_5k", "rose", "recovery_steps", "searched_steps", "baseline_window",
    "smooth", "short_window", "long_window"}; loss values in the log's units (nats), steps counted from
    the transition.
    """
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


# ----------------------------------------------------------------------------------------------
# Figures. Each takes plain dicts/lists (the results above, or a table's numbers) and a path, writes
# a PNG and returns the path. Kit values: solid lines, filled markers. Paper values: hollow markers
# or dashed lines labelled "paper". No pyplot: Figure objects render through Agg and hold no global state.

STYLE = {"font.size": 8, "axes.titlesize": 9, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
         "axes.spines.right": False, "legend.fontsize": 7, "legend.frameon": False, "savefig.dpi": 150}
NORM_COLORS = {"pre": "tab:blue", "post": "tab:orange"}
RUN_COLORS = {"pre-grow": "tab:blue", "post-grow": "tab:orange", "pre-joint": "lightsteelblue",
              "post-joint": "navajowhite"}
TYPE_STYLES = {"boundary": "-", "delimiter": "-.", "regular": "--"}
BOUNDARY_STYLES = ["-", "--", ":", "-."]


def new_figure(ncols: int = 1, width: float = 4.5, height: float = 3.2) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


CAPTION = contextvars.ContextVar("caption", default="")  # e.g. "toy scale, seed 42": set by the reports


def save_png(fig: Figure, path) -> Path:
    """The figure as PNG at `path` and as PDF beside it, with the current CAPTION in its corner."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if CAPTION.get():
        fig.text(0.995, 0.005, CAPTION.get(), ha="right", va="bottom", fontsize=6, color="gray")
    fig.savefig(path, format="png")
    fig.savefig(path.with_suffix(".pdf"), format="pdf")
    return path


def legend_below(fig: Figure, ax, ncols: int = 2):
    """Long legends go under the axes, where they cannot hide data."""
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=ncols)


def paper_marker(ax, x, y, color, label=None, marker="o"):
    ax.plot(x, y, marker=marker, markersize=7, linestyle="none", markerfacecolor="none",
            markeredgecolor=color, markeredgewidth=1.3, label=label)


def delta(ces: dict, protocol: str) -> float:
    return ces["post"][protocol] - ces["pre"][protocol]


def fig3a_interaction(kit: dict, path, paper: dict = PAPER["table1"]) -> Path:
    """Figure 3a as the effect itself. kit: {"pre": {"joint": ce, "grow": ce}, "post": {...}},
    validation CE in nats/token. Plotted: Δ = post − pre per protocol, kit solid, paper dashed and
    hollow; the slope between them is the interaction. Absolute CEs are in the report's table."""
    protocols = ["joint", "grow"]
    with matplotlib.rc_context(STYLE):
        fig, (ax,) = new_figure()
        ax.plot(range(2), [delta(kit, p) for p in protocols], "o-", color="black", label="Δ post − pre (kit)")
        ax.plot(range(2), [delta(paper, p) for p in protocols], "--", color="gray", marker="o",
                markerfacecolor="none", label="Δ post − pre (paper)")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xticks(range(2), protocols)
        ax.set_xlabel("protocol")
        ax.set_ylabel("validation CE, post − pre (nats/token)")
        ax.set_title(f"interaction Δgrow − Δjoint: kit {interaction(kit):+.4f}, paper {interaction(paper):+.4f}")
        ax.legend()
        return save_png(fig, path)


def interaction(ces: dict) -> float:
    """(post - pre) under grow minus (post - pre) under joint (Table 1)."""
    return delta(ces, "grow") - delta(ces, "joint")


def fig3b_per_phase(kit: dict, path, paper: dict = PAPER["per_phase_ce"], starts: dict | None = None) -> Path:
    """Figure 3b. kit: {"pre": [CE at the end of phase 0, 1, ...], "post": [...]} of the grow runs;
    starts: the same at each phase's start (before its first update). Left: the kit's CE per phase,
    starts as hollow squares at phase - 0.5 (a start far above the rest sits at the top edge, its
    value written beside it). Right: Δ = post − pre per phase, kit (ends solid, starts hollow) against
    the paper's (phase 0 from Table 2, phase 2 from Table 1), each on its own axis."""
    starts = starts or {}
    shown = [v for ces in kit.values() for v in ces] + [v for s in starts.values() for v in s[1:]]
    top = max(shown) + 0.15 * (max(shown) - min(shown) or 1.0)
    phases = range(max(len(c) for c in kit.values()))
    with matplotlib.rc_context(STYLE):
        fig, (ax, dax) = new_figure(ncols=2, width=4.0)
        for norm, ces in kit.items():
            color = NORM_COLORS[norm]
            ax.plot(range(len(ces)), ces, "o-", color=color, label=f"{norm}-norm, phase end")
            for p, start in enumerate(starts.get(norm, [])):
                ax.plot([p - 0.5, p], [min(start, top), ces[p]], ":", color=color, marker="s", markevery=[0],
                        markerfacecolor="none", label=f"{norm}-norm, phase start" if p == 0 else None)
                if start > top:
                    ax.annotate(f"start {start:.2f} ↑", (p - 0.5, top), textcoords="offset points",
                                xytext=(12, -4 - 10 * (norm == "post")), color=color, fontsize=7)
        ax.set_ylim(top=top)
        ax.set_title("kit: validation CE through grow")
        dax.plot(phases, [kit["post"][p] - kit["pre"][p] for p in phases], "o-", color="black",
                 label="kit, phase end")
        if starts.get("pre") and starts.get("post"):
            dax.plot([p - 0.5 for p in phases], [starts["post"][p] - starts["pre"][p] for p in phases], "s",
                     color="black", markerfacecolor="none", label="kit, phase start")
        marked = sorted(set(paper.get("pre", {})) & set(paper.get("post", {})))
        paper_marker(dax, marked, [paper["post"][p] - paper["pre"][p] for p in marked], "gray",
                     "paper (phase 0: Table 2; phase 2: Table 1)")
        dax.axhline(0, color="black", linewidth=0.5)
        dax.set_yscale("symlog", linthresh=0.05)  # a several-nat start gap and a 0.03-nat end gap, both legible
        dax.set_title("Δ post − pre per phase (symlog beyond ±0.05)")
        for a, label in ((ax, "validation CE (nats/token)"), (dax, "post − pre (nats/token)")):
            a.set_xticks(list(phases))
            a.set_xlabel("grow phase (active blocks = phase + 1)")
            a.set_ylabel(label)
            a.legend(fontsize=6)
        return save_png(fig, path)


def mark_transitions(ax, transition_steps: list[int]):
    for i, step in enumerate(transition_steps):
        ax.axvline(step, color="gray", linestyle=":", linewidth=0.8, label="block appended" if i == 0 else None)


def paper_panel(ax, title: str, ylabel: str):
    """The paper's own panel: its values at its stated checkpoints, on a log axis like the kit's."""
    ax.set_yscale("log")
    ax.set_xticks([0, 1], PAPER_CHECKPOINTS)
    ax.set_xlim(-0.5, 1.5)
    ax.set_title(title)
    ax.set_ylabel(ylabel)


PAPER_CHECKPOINTS = ("first grow\ncheckpoint", "150k\n(end of grow)")  # the paper gives no first step


def fig4_boundary_std(series: dict, path, paper: dict = PAPER["boundary_std_after_block0"],
                      transition_steps: list[int] = ()) -> Path:
    """Figure 4. series: {"pre": [{"step", "boundary_stats"}, ...], "post": [...]}, one entry per kept
    grow checkpoint (diagnose_checkpoint's output plus its step). Left: the kit, one line per norm and
    block output, block appends marked. Right: the paper's values after block 0 in their own panel
    (pre-norm at its first grow checkpoint and at 150k; post-norm's stated range)."""
    with matplotlib.rc_context(STYLE):
        fig, (ax, pax) = new_figure(ncols=2, width=4.0, height=4.4)
        for norm, checkpoints in series.items():
            for b in range(1, max(len(c["boundary_stats"]) for c in checkpoints)):
                points = [(c["step"], c["boundary_stats"][b]["std"]) for c in checkpoints
                          if b < len(c["boundary_stats"])]
                ax.plot(*zip(*points), marker="o", markersize=3, color=NORM_COLORS[norm],
                        linestyle=BOUNDARY_STYLES[(b - 1) % len(BOUNDARY_STYLES)], label=f"{norm}, {boundary_label(b)}")
        mark_transitions(ax, transition_steps)
        ax.set_yscale("log")
        ax.set_xlabel("training step of the checkpoint")
        ax.set_ylabel("std of per-token RMS over tokens\n(activation units, log scale)")
        ax.set_title("kit: boundary-scale spread across grow")
        first, last = paper["pre"]
        paper_marker(pax, [0, 1], [first, last], NORM_COLORS["pre"], f"pre, after block 0 ({first:g} → {last:g})")
        pax.plot([0, 1], [first, last], "--", color=NORM_COLORS["pre"], linewidth=0.8)
        low, high = paper["post_range"]
        pax.axhspan(low, high, color=NORM_COLORS["post"], alpha=0.2, label=f"post, after block 0 ({low:g}–{high:g})")
        paper_panel(pax, "paper (Figure 4)", "std of per-token RMS (log scale)")
        legend_below(fig, ax)
        pax.legend(fontsize=6)
        return save_png(fig, path)


def fig5a_token_types(series: dict, path, boundary: int = 1, paper: dict = PAPER["token_type_rms"],
                      transition_steps: list[int] = ()) -> Path:
    """Figure 5a. series as for fig4 (entries need "step" and "token_type_rms"); mean per-token RMS by
    token type at one boundary (default 1: after block 0; the paper does not say which). Left: the
    kit; right: the paper's values in their own panel (first grow checkpoint and 150k)."""
    with matplotlib.rc_context(STYLE):
        fig, (ax, pax) = new_figure(ncols=2, width=4.0, height=4.4)
        for norm, checkpoints in series.items():
            color = NORM_COLORS[norm]
            for name, style in TYPE_STYLES.items():
                points = [(c["step"], c["token_type_rms"][boundary][f"{name}_rms"]) for c in checkpoints
                          if boundary < len(c["token_type_rms"]) and c["token_type_rms"][boundary][f"{name}_rms"]]
                if points:
                    ax.plot(*zip(*points), marker="o", markersize=3, color=color, linestyle=style,
                            label=f"{norm}, {name} tokens")
            for name, (first, last) in paper.get(norm, {}).items():
                xs, ys = zip(*[(x, y) for x, y in ((0, first), (1, last)) if y is not None])
                paper_marker(pax, xs, ys, color, f"{norm}, {name} ({' → '.join(f'{y:g}' for y in ys)})",
                             marker="s" if name == "boundary" else "o")
        mark_transitions(ax, transition_steps)
        ax.set_yscale("log")
        ax.set_xlabel("training step of the checkpoint")
        ax.set_ylabel(f"mean per-token RMS, {boundary_label(boundary)}\n(activation units, log scale)")
        ax.set_title("kit: token-type attribution of boundary scale")
        paper_panel(pax, "paper (Figure 5a)", "mean per-token RMS (log scale)")
        legend_below(fig, ax)
        pax.legend(fontsize=6)
        return save_png(fig, path)


def fig5b_validation(runs: dict, path, transition_steps: list[int], smooth: int | None = None,
                     paper: dict = PAPER["table1"]) -> Path:
    """Figure 5b. runs: {"pre": metrics rows, "post": metrics rows} of the grow runs (rundir.read_metrics).
    Validation CE at every evaluation; with `smooth`, also the training CE term as a trailing
    `smooth`-step mean (thin). Vertical lines at the block-append steps; the paper's final CE hollow."""
    with matplotlib.rc_context(STYLE):
        fig, (ax,) = new_figure(width=5.5, height=4.4)
        for norm, rows in runs.items():
            color = NORM_COLORS[norm]
            evals = [(r["step"], r["ce"]) for r in rows if r.get("eval")]
            ax.plot(*zip(*evals), "o-", markersize=3, color=color, label=f"{norm}-norm, validation CE")
            if smooth:
                train = sorted(training_losses(rows, "ce").items())
                steps, ces = zip(*train)
                mean = np.convolve(ces, np.ones(smooth) / smooth, mode="valid")
                ax.plot(steps[smooth - 1:], mean, color=color, alpha=0.4, linewidth=0.8,
                        label=f"{norm}-norm, training CE ({smooth}-step mean)")
            if norm in paper:
                paper_marker(ax, [evals[-1][0]], [paper[norm]["grow"]], color,
                             f"paper: {norm}-grow at 150k, drawn at the kit's last step")
        mark_transitions(ax, transition_steps)
        ax.set_xlabel("training step")
        ax.set_ylabel("CE (nats/token)")
        ax.set_title("validation CE through grow, transitions marked")
        legend_below(fig, ax)
        return save_png(fig, path)


def figA1_rms_histograms(token_rms_by_norm: dict, path, label: str = "after block 0",
                         paper_kurtosis: float = PAPER["final_kurtosis_pre_above"], cap: float | None = None) -> Path:
    """Figure A1. token_rms_by_norm: {"pre": [per-token RMS], "post": [...]} at the final checkpoint
    (diagnose_checkpoint's "token_rms" at one boundary, named by `label`). Log-spaced bins, log counts;
    the legend gives each distribution's Pearson kurtosis (normal = 3) and, with `cap`, the largest
    kurtosis this batch's shape allows (kurtosis_cap)."""
    values = {norm: np.asarray(v, dtype=np.float64) for norm, v in token_rms_by_norm.items()}
    pooled = np.concatenate(list(values.values()))
    positive = pooled[pooled > 0]
    bins = np.geomspace(positive.min(), positive.max() * 1.001, 60) if positive.max() > positive.min() else 10
    with matplotlib.rc_context(STYLE):
        fig, (ax,) = new_figure(width=5.5)
        for norm, v in values.items():
            stats = summarize(torch.from_numpy(v))
            kurtosis = "undefined" if stats["kurtosis"] is None else f"{stats['kurtosis']:.1f}"
            ax.hist(v, bins=bins, histtype="stepfilled", alpha=0.5, color=NORM_COLORS[norm],
                    label=f"{norm}-norm: {len(v)} tokens, Pearson kurtosis {kurtosis}")
        ax.plot([], [], " ", label=f"paper: pre-norm kurtosis > {paper_kurtosis:g}")
        if cap is not None:
            ax.plot([], [], " ", label=f"largest kurtosis this batch's shape allows: {cap:.0f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"per-token RMS, {label} (activation units, log scale)")
        ax.set_ylabel("tokens (log scale)")
        ax.set_title("per-token RMS distribution at the final checkpoint")
        ax.legend()
        return save_png(fig, path)


def figA2_block_removal(results: dict, path, paper: dict = PAPER["table4"]) -> Path:
    """Figure A2. results: {"pre-grow": block_removal(...), "post-grow": ..., "pre-joint": ...,
    "post-joint": ...} (any subset). Top row: the kit's bars per block and run; bottom row: Table 4's
    values as bars of the same layout on their own axes (the paper's ~8-nat block 0 would flatten
    the kit's smaller bars on a shared axis)."""
    metrics = [("delta_ce", "ΔCE when the block is skipped (nats/token)"),
               ("angular_distance", "angular distance in → out (fraction of π)")]
    width = 0.8 / len(results)
    n_blocks = max(len(b) for b in results.values())
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(8.4, 6.4), layout="constrained")
        axes = [[fig.add_subplot(2, 2, 2 * row + col + 1) for col in range(2)] for row in range(2)]
        for col, (metric, ylabel) in enumerate(metrics):
            for row, source in enumerate(("kit", "paper (Table 4)")):
                ax = axes[row][col]
                for i, (run, blocks) in enumerate(results.items()):
                    values = [r[metric] for r in blocks] if row == 0 else list(paper.get(run, {}).get(metric, ()))
                    xs = [b - 0.4 + width * (i + 0.5) for b in range(len(values))]
                    ax.bar(xs, values, width, color=RUN_COLORS.get(run), edgecolor="black", linewidth=0.4,
                           hatch="//" if row else None, label=run)
                ax.set_xticks(range(n_blocks), [f"block {b}" for b in range(n_blocks)])
                ax.set_title(source)
                ax.set_xlabel("skipped block")
                ax.set_ylabel(ylabel)
        fig.suptitle("whole-block removal")
        legend_below(fig, axes[0][1], ncols=5)
        return save_png(fig, path)


DELTA_STYLES = {"delta_joint": ("Δjoint (post − pre)", "tab:green", "o"),
                "delta_grow": ("Δgrow (post − pre)", "tab:red", "s"),
                "interaction": ("interaction Δgrow − Δjoint", "tab:purple", "^")}


def fig_regime(points: list[dict], paper: dict, path, scale: str, seeds: list[int]) -> Path:
    """The regime map (regime.py). points: rows with budget, phase_steps, lr_multiplier, lr, gain and,
    per key of DELTA_STYLES, {"mean", "ci95"} over seeds. Three panels, one per grid axis, each with
    the other two axes at the preset's value; error bars are 95% t-intervals over seeds; the paper's
    values are dashed reference lines. The y axis is linear within ±0.05 nats, logarithmic beyond."""
    panels = [("steps per phase (log scale)", "phase_steps", lambda p: p["lr_multiplier"] == 1 and p["gain"] == "ones"),
              ("peak LR (log scale)", "lr", lambda p: p["budget"] == 1 and p["gain"] == "ones"),
              ("post-norm output-gain init", "gain", lambda p: p["budget"] == 1 and p["lr_multiplier"] == 1)]
    with matplotlib.rc_context(STYLE):
        fig, axes = new_figure(ncols=3, width=3.6, height=3.4)
        for ax, (xlabel, xkey, selected) in zip(axes, panels):
            chosen = sorted((p for p in points if selected(p)), key=lambda p: (p[xkey] != "ones", p[xkey]))
            xs = [p[xkey] for p in chosen]
            for key, (label, color, marker) in DELTA_STYLES.items():
                means = [p[key]["mean"] for p in chosen]
                errors = [[m - (p[key]["ci95"] or [m, m])[0] for m, p in zip(means, chosen)],
                          [(p[key]["ci95"] or [m, m])[1] - m for m, p in zip(means, chosen)]]
                ax.errorbar(range(len(xs)) if xkey == "gain" else xs, means, yerr=errors, color=color,
                            marker=marker, markersize=4, capsize=3, label=f"{label}, kit")
                ax.axhline(paper[key], color=color, linestyle="--", linewidth=0.9, label=f"{label}, paper")
            if xkey == "gain":
                ax.set_xticks(range(len(xs)), xs)
                ax.set_xlim(-0.5, len(xs) - 0.5)
            elif len(xs) > 1:
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.axhline(0, color="black", linewidth=0.5)
            # Symmetric log above 0.05 nats: a post-joint run that fails (+2 nats) and a 0.03-nat
            # interaction are both readable on one axis.
            ax.set_yscale("symlog", linthresh=0.05)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("validation CE difference (nats/token, symlog)")
        seed_text = f"seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0]}"
        fig.suptitle(f"regime map, {scale} scale, {seed_text}: post − pre by protocol")
        legend_below(fig, axes[0], ncols=3)
        return save_png(fig, path)


def fig_monitor(series: dict, path, title: str) -> Path:
    """The boundary monitor against steps. series: {run label: [monitor rows of metrics.jsonl]}; two
    panels, the mean and the kurtosis of per-token RMS at each internal block boundary (one colour per
    run, one line style per boundary); runs logged without the monitor are left out."""
    with matplotlib.rc_context(STYLE):
        fig, (rms_ax, kurt_ax) = new_figure(ncols=2, width=4.2, height=3.4)
        for i, (label, rows) in enumerate((k, v) for k, v in series.items() if v):
            color = f"C{i}"
            for b in range(1, max(len(r["boundaries"]) for r in rows)):
                points = [(r["step"], r["boundaries"][b]) for r in rows if len(r["boundaries"]) > b]
                style = BOUNDARY_STYLES[(b - 1) % len(BOUNDARY_STYLES)]
                for ax, key in ((rms_ax, "mean"), (kurt_ax, "kurtosis")):
                    xy = [(step, row[key]) for step, row in points if row[key] is not None]
                    if xy:
                        ax.plot(*zip(*xy), linestyle=style, color=color, linewidth=1,
                                label=f"{label}, {points[0][1]['label']}")
        for ax, ylabel in ((rms_ax, "mean per-token RMS"), (kurt_ax, "kurtosis of per-token RMS")):
            ax.set_yscale("log")
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
        fig.suptitle(title)
        legend_below(fig, rms_ax, ncols=3)
        return save_png(fig, path)
