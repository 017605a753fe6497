"""The model-side interventions at the block boundaries, the inputs of every block after the first (where a grow
run appends): BOUNDARIES, the synthetic doses, the structural-token norm, and BoundaryInputs, the part of
model.Student that holds their modules, applies them and records them in its checkpoint.

    h = student.enter_block(b, h, profile)                      # what block b reads, interventions applied
    h = dose(h, 37.0, "dose-boundary")                          # the boundary token at 37x the others' RMS
"""

import math
from typing import Callable

import torch
import torch.nn as nn

from plumbing.errors import CheckpointError

# Interventions at the input of every block after the first (each one's forward and backward: docs/method.md,
# "Boundary interventions"): rescale-fwd, -detached and -full share one forward, so that only the backward
# channel varies; the doses ask whether heavy tails alone reproduce pre-norm's penalty.
BOUNDARIES = ("none", "norm", "rescale-fwd", "mirror-fwd", "rescale-detached", "rescale-full", "dose-boundary",
              "dose-channel")
# Optional parts of a student (issue 33) at the input of every block after the first: "correction", an RMSNorm
# switched on where the transition reading fires (transitions.py); "structural", structural_norm's scale.
FEATURES = ("correction", "structural")


def checked_features(boundary: str, features) -> tuple[str, ...]:
    """A student's `features` in FEATURES order, once its boundary and every feature are known ones."""
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary intervention {boundary!r} is unknown; choose one of {', '.join(BOUNDARIES)}")
    if unknown := set(features) - set(FEATURES):
        raise ValueError(f"student feature {sorted(unknown)[0]!r} is unknown; choose from {', '.join(FEATURES)}")
    return tuple(f for f in FEATURES if f in features)


class StraightThroughRescale(torch.autograd.Function):
    """Forward: h scaled per token to RMS `target` (a number, or (B, T, 1)). Backward: the identity."""

    @staticmethod
    def forward(ctx, h, target):
        return rescale(h, target, "full")  # autograd is off in here: the backward below is the only one

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def rescale(h: torch.Tensor, target, backward: str) -> torch.Tensor:
    """Each token scaled to RMS `target`: backward "identity" (straight-through), "detached" (t / r a
    constant) or "full" (autograd through r as well)."""
    if backward == "identity":
        return StraightThroughRescale.apply(h, target)
    rms = h.float().pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)
    return (h.float() * (target / (rms.detach() if backward == "detached" else rms))).to(h.dtype)


def dose(h: torch.Tensor, ratio: float, kind: str) -> torch.Tensor:
    """The boundary token (position 0) made heavy-tailed, forward only: its RMS at `ratio` x the median RMS of the
    other positions ("dose-boundary"), or its channel 0 at `ratio` x the row's median |activation|."""
    x = h.detach().float()
    if kind == "dose-boundary":
        rms = x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)                # (B, T, 1)
        regular = rms[:, 1:].median(dim=1, keepdim=True).values if x.shape[1] > 1 else rms[:, :1]
        first = x[:, :1] * (ratio * regular / rms[:, :1])
    else:
        first = x[:, :1].clone()
        first[..., 0] = ratio * x.abs().flatten(1).median(dim=1).values[:, None]
    delta = torch.cat([first - x[:, :1], torch.zeros_like(x[:, 1:])], dim=1)
    return h + delta.to(h.dtype)


# The tail by construction (issue 49; RunConfig.boundary_tail): one channel of the boundary token's frozen
# embedding row set to a large value, a fixed bias, as Sun et al. (2024) find massive activations nearly constant
# across inputs. Channel 0, as the planted "dose-channel"; which channel is arbitrary before training.
TAIL_CHANNEL = 0


def with_tail(embedding: torch.Tensor, token: int, value: float) -> torch.Tensor:
    """A copy of `embedding` (V, H) whose row `token` has `value` in channel TAIL_CHANNEL."""
    if not 0 <= token < embedding.shape[0]:
        raise ValueError(f"boundary token {token} is outside the embedding's {embedding.shape[0]} rows")
    dosed = embedding.clone()
    dosed[token, TAIL_CHANNEL] = value
    return dosed


def structural_norm(h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The boundary token (position 0) rescaled to `scale` x the median RMS of its row's other positions (issue 33, idea
    6; the median: the forward has no mask, and padding is a minority of a row), the row's statistic detached."""
    if h.shape[1] < 2:
        return h
    x = h.float()
    rms = x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)                    # (B, T, 1)
    regular = rms[:, 1:].median(dim=1, keepdim=True).values.detach()                 # (B, 1, 1)
    first = x[:, :1] * (scale.float() * regular / rms[:, :1])
    return torch.cat([first.to(h.dtype), h[:, 1:]], dim=1)


class Scale(nn.Module):
    """One learned scalar (structural_norm's), initialised to 1; shape (1,): FSDP2 shards tensors by rows."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))


class BoundaryInputs:
    """The student's side of the block boundaries, mixed into model.Student (which has blocks, boundary,
    boundary_scale, features and profile_source): their modules, what a block reads, its checkpoint entries."""

    def add_input_modules(self, rms_norm: Callable[[], nn.Module]):
        """boundary_norms, correction_norms and structural_scales (or None), one per later block, registered so."""
        boundaries = range(self.blocks - 1)
        self.boundary_norms = nn.ModuleList(rms_norm() for _ in boundaries) if self.boundary == "norm" else None
        self.correction_norms = nn.ModuleList(rms_norm() for _ in boundaries) if "correction" in self.features else None
        self.corrected: set[int] = set()  # the blocks whose correction norm is on (transitions.py)
        self.structural_scales = nn.ModuleList(Scale() for _ in boundaries) if "structural" in self.features else None

    def input_modules(self, b: int) -> list[nn.Module]:
        """The modules at block b's input, which train with it (a correction norm once switched on)."""
        kinds = [self.boundary_norms, self.structural_scales, self.correction_norms if b in self.corrected else None]
        return [modules[b - 1] for modules in kinds if modules is not None and b]

    @torch.no_grad()
    def reset_input_modules(self):
        """Every module at a block input at 1: a fresh student's."""
        for norm in [*(self.boundary_norms or []), *(self.correction_norms or []), *(self.structural_scales or [])]:
            norm.weight.fill_(1.0)

    def mirror_profile(self, input_ids, active_blocks: int, doc_lengths: tuple[int, ...] | None = None) -> dict | None:
        """mirror-fwd's targets for a forward over `active_blocks` blocks: {block: (B, T, 1) RMS}, or None."""
        if self.boundary != "mirror-fwd" or active_blocks < 2:
            return None
        if self.profile_source is None:
            raise CheckpointError("a mirror-fwd student needs its reference run's boundary profile "
                                  "(profile_source) to run more than one block")
        return self.profile_source(input_ids, active_blocks, doc_lengths)

    def enter_block(self, b: int, h: torch.Tensor, profile: dict | None) -> torch.Tensor:
        """What block b reads: the boundary intervention (`profile`: mirror-fwd's targets), then the structural and
        correction norms where it has them; block 0 the embeddings."""
        if b == 0:
            return h
        if self.boundary == "norm":
            h = self.boundary_norms[b - 1](h)
        elif self.boundary.startswith("dose-"):
            h = dose(h, self.boundary_scale, self.boundary)
        elif self.boundary != "none":
            backward = {"rescale-detached": "detached", "rescale-full": "full"}.get(self.boundary, "identity")
            h = rescale(h, profile[b] if self.boundary == "mirror-fwd" else self.boundary_scale, backward)
        if self.structural_scales is not None:
            h = structural_norm(h, self.structural_scales[b - 1].weight)
        return self.correction_norms[b - 1](h) if b in self.corrected else h

    def checkpoint_entries(self) -> dict:
        """The normgrow_student entries that say which of these a student has, written only where not the default."""
        entries = {}
        if self.boundary != "none":
            entries.update(boundary=self.boundary, boundary_scale=self.boundary_scale)
        if self.features:
            entries.update(features=list(self.features), corrected=sorted(self.corrected))
        return entries


def read_checkpoint_entries(shape: dict) -> tuple[str, float, tuple, set[int]]:
    """(boundary, boundary_scale, features, corrected) as checkpoint_entries wrote them, defaults where absent."""
    return (shape.get("boundary", "none"), shape.get("boundary_scale", 1.0), tuple(shape.get("features", ())),
            set(shape.get("corrected", ())))


def checkpoint_entries_problem(shape: dict) -> str:
    """Why the entries cannot describe a student of shape["blocks"] blocks ("" if they can)."""
    boundary, scale = shape.get("boundary", "none"), shape.get("boundary_scale", 1.0)
    if boundary not in BOUNDARIES:
        return f"normgrow_student.boundary is {boundary!r}, not one of {', '.join(BOUNDARIES)}"
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0):
        return f"normgrow_student.boundary_scale is {scale!r}, not a positive finite number"
    features, corrected = shape.get("features", []), shape.get("corrected", [])
    if not (isinstance(features, list) and all(f in FEATURES for f in features)):
        return f"normgrow_student.features is {features!r}, not a list of {', '.join(FEATURES)}"
    if not (isinstance(corrected, list) and all(type(b) is int and 1 <= b < shape["blocks"] for b in corrected)
            and (not corrected or "correction" in features)):
        return f"normgrow_student.corrected is {corrected!r}, not a list of blocks 1..{shape['blocks'] - 1} of a student " \
               "with the correction feature"
    return ""
