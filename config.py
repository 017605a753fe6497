"""The settings of one run, checked once: RunConfig, its phases (each a fresh AdamW and a restarted warmup + cosine)
and its learning-rate schedule. presets.py fills one from a scale; a run folder stores it as config.json.

    config = config.read(run_dir)                    # runs/toy/s42/post-grow/config.json, paths absolute
    for phase in config.plan_phases(c): ...          # active and trainable blocks, first step, steps
    lr = config.learning_rate(c, step_in_phase, phase.index)

Protocols (paper Sec. 4, App. B): `joint` (all K blocks, one phase), `grow` (phase p trains blocks 0..p), `freeze`
(phase p>0 trains block p only), `joint-long` (LR restarts) and `teacher` (CE pretraining of the kit's teacher).
"""
from __future__ import annotations  # RunConfig's field types as text: experiments/record_files.check_settings reads them

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import model
from interventions.boundary import BOUNDARIES
from plumbing import checkpoint
from plumbing.errors import ConfigError

PROTOCOLS = ("joint", "grow", "freeze", "joint-long", "teacher")
PRECISIONS = ("fp32", "bf16")  # and "auto": bf16 where the machine runs it measurably faster (devices.py)
# The settings that take one of a few names; checked here, and by presets.py for --set before any folder is made.
CHOICES = {"protocol": PROTOCOLS, "precision": ("auto", *PRECISIONS), "post_output_gain": model.OUTPUT_GAINS,
           "boundary": BOUNDARIES, "on_divergence": ("stop", "continue"), "long_data": ("fresh", "replay"),
           "append_init": ("default", "matched", "preserve-output"), "importance_remedy": ("none", "reinit"),
           "boundary_correction": ("none", "norm")}
PATH_FIELDS = ("train_data", "val_data", "teacher", "start_from", "boundary_source")  # RunConfig's paths


@dataclass
class RunConfig:
    """Every setting of one run. No defaults for hyperparameters: presets (presets.py) own the numbers."""
    name: str
    protocol: str                  # one of PROTOCOLS
    norm: str                      # a placement, one per block ("pre,post,post"), or "auto" (transitions.py)
    seed: int
    blocks: int                    # K
    layers_per_block: int          # L
    phase_steps: int               # optimizer steps per phase
    global_batch: int              # documents per optimizer step, all ranks together
    micro_batch: int               # documents per forward pass on one rank
    lr: float
    min_lr: float
    warmup_frac: float             # of each phase
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    grad_clip: float               # global L2 norm
    alpha: float
    gamma: float
    tau: float
    loss_chunk: int                # tokens per chunk of the chunked loss
    train_data: str                # data.Shard directories
    val_data: str
    replay_docs: int               # documents in the one-phase shard that grow replays
    eval_interval: int
    eval_batch: int                # validation documents per forward pass on one rank
    checkpoint_interval: int       # steps between rolling resume checkpoints
    snapshot_interval: int = 0     # steps between kept weight snapshots step-<n>/ (diagnostics); 0: none
    teacher: str = ""              # HF checkpoint directory (distillation runs)
    teacher_config: dict | None = None   # plumbing.hf_qwen3.ModelConfig fields (the `teacher` protocol)
    joint_phases: int = 1          # `joint-long`: phases of phase_steps, LR restart at each
    freeze_trains_head: bool = False     # `freeze`: also keep training the LM head and boundary norm
    reset_data_each_phase: bool = False  # paper Appendix B.3 (main runs: False)
    precision: str = "auto"        # "fp32" | "bf16" | "auto" (bf16 where measured faster: precision_choice)
    activation_checkpointing: bool = False
    compile: bool = False
    balance_lengths: bool = False  # micro-batches placed by document length across ranks (data.rank_micro_batches)
    start_from: str = ""           # a phase-<p> directory of another run whose prefix equals ours
    post_output_gain: str = "ones"  # post-norm: each block's last RMSNorm starts at "ones" (paper) or "teacher" (g_T)
    # `joint-long`: a fresh AdamW at each LR restart (True; the paper, B.3, does not say) or the moments carried over
    restart_optimizer: bool = True
    # AdamW's weight decay on the 1-D parameters too (True: the kit's runs so far), or on matrices only (False)
    decay_gains: bool = True
    # `joint-long`: "fresh" documents past the first phase (Table 3), or "replay" grow's shard (joint-replay)
    long_data: str = "fresh"
    # Beyond the paper (README, "Beyond the paper"):
    boundary: str = "none"         # BOUNDARIES (interventions/boundary.py): at the input of every block after the first
    boundary_scale: float = 1.0    # rescale-fwd: the RMS each token is rescaled to
    boundary_source: str = ""      # mirror-fwd: the pre-norm run folder whose phase-<p>/ gives the RMS profile
    scratch_model: dict | None = None  # growth from scratch: the student's ModelConfig fields; no teacher
    monitor_interval: int = 0      # steps between boundary-monitor rows (0: off); from the training forward
    monitor_rms_warn: float = 20.0       # warn when a boundary's mean per-token RMS passes this
    monitor_kurtosis_warn: float = 1000.0  # ... or its kurtosis of per-token RMS
    phase_lrs: tuple = ()          # peak LR per phase (transition-aware schedules; empty: lr in every phase)
    phase_warmups: tuple = ()      # warmup steps per phase (empty: warmup_frac of the phase)
    # Per-transition warmup and peak factors: "", one of TRANSITION_SCHEDULES, or e.g. "2:1,0.5:1" (transition_factors)
    transition_schedule: str = ""
    # What a grow or freeze run does when it appends a block (transitions.py; issue 33's ideas 2, 3, 5, 6):
    append_init: str = "default"   # "matched": the new block's norm gains at the RMS it reads; "preserve-output"
    importance_remedy: str = "none"  # "reinit": re-draw a prefix block whose removal costs < identity_threshold
    identity_threshold: float = 0.105  # nats: the log-midpoint of the paper's 0.02 (near-identity) and 0.55
    boundary_correction: str = "none"  # "norm": an RMSNorm at an appended block's input where the reading fires
    monitor_ratio_warn: float = 37 ** 0.5  # boundary token RMS / the others': the log-midpoint of 1 and 37
    structural_norm: bool = False  # the boundary token rescaled to its row's median RMS x a learned scale
    # A heavy tail by construction (issue 49; interventions/boundary.py, with_tail): channel TAIL_CHANNEL of the
    # student's frozen copy of the boundary token's embedding row; 0: the teacher's row as it is.
    boundary_tail: float = 0.0
    # Divergence is an outcome, never a number (docs/reliability.md): a non-finite number, a validation CE above
    # log V + diverged_above_uniform, or an end more than diverged_above_best above the run's best; "continue"
    # trains on past a too-high CE (a non-finite loss always stops: the weights are gone).
    diverged_above_uniform: float = 1.0
    diverged_above_best: float = 1.0
    on_divergence: str = "stop"
    # True: the PATH_FIELDS are relative to the run's own folder (a runs tree can be moved); False: as given.
    relative_to_run: bool = False

    def __post_init__(self):
        for key, names in CHOICES.items():
            if getattr(self, key) not in names:
                raise ConfigError(f"{key} {getattr(self, key)!r} is unknown; choose one of {', '.join(names)}")
        if self.boundary == "mirror-fwd" and not self.boundary_source:
            raise ConfigError("boundary mirror-fwd needs boundary_source: the pre-norm run folder whose profile it copies")
        if self.protocol != "teacher" and self.norm != "auto":
            try:
                model.block_norms(self.norm, self.blocks)  # a known placement, or one per block
            except ValueError as e:
                raise ConfigError(str(e)) from None
        self.betas, self.phase_lrs, self.phase_warmups = tuple(self.betas), tuple(self.phase_lrs), tuple(self.phase_warmups)
        phases = len(plan_phases(self))
        for key in ("phase_lrs", "phase_warmups"):
            values = getattr(self, key)
            if values and (len(values) != phases or min(values) <= 0):
                raise ConfigError(f"{key} {values}: give one positive value per phase ({phases}), or none")
        transition_factors(self)  # a bad transition_schedule: one line here, before any run
        for key in ("identity_threshold", "monitor_ratio_warn"):
            if not (isinstance(getattr(self, key), (int, float)) and getattr(self, key) > 0):
                raise ConfigError(f"{key} {getattr(self, key)!r}: give a positive number")
        if not (isinstance(self.boundary_tail, (int, float)) and math.isfinite(self.boundary_tail)):
            raise ConfigError(f"boundary_tail {self.boundary_tail!r}: give a finite number (0: no tail)")
        if self.boundary_tail and not self.distils:
            raise ConfigError("boundary_tail: a distilled student's option (its embedding is the teacher's, frozen); "
                              "a teacher or a student from scratch trains its embedding, which would unlearn the tail")
        if self.importance_remedy != "none" and self.protocol != "grow":
            raise ConfigError(f"importance_remedy {self.importance_remedy}: a grow option (a block re-drawn under "
                              f"{self.protocol} would never train again); use protocol grow")

    def resolved(self, run_dir) -> "RunConfig":
        return replace(self, **absolute_paths(vars(self), run_dir), relative_to_run=False)

    def relative_to(self, run_dir: Path, root: Path) -> "RunConfig":
        """This config as a run folder stores it: the paths under `root` relative to run_dir, others absolute."""
        run_dir, root = Path(run_dir).resolve(), Path(root).resolve()
        paths = {}
        for key in PATH_FIELDS:
            if value := getattr(self, key):
                path = Path(value).resolve()
                paths[key] = os.path.relpath(path, run_dir) if path.is_relative_to(root) else str(path)
        return replace(self, **paths, relative_to_run=True)

    @property
    def student_norm(self) -> str:
        """The placement schedule the student is built with: --norm auto starts all pre-norm (transitions.py)."""
        return "pre" if self.norm == "auto" else self.norm

    @property
    def student_features(self) -> tuple:
        """The interventions.boundary.FEATURES this run's student needs."""
        return (("correction",) if self.boundary_correction != "none" else ()) + \
            (("structural",) if self.structural_norm else ())

    @property
    def packs(self) -> bool:
        """Whether its batches are packed (data.py). A compiled run pads to a few fixed shapes; the planted doses and
        the structural norm take a statistic over a padded row's positions, padding included, which packing would
        change: they keep padded rows, so their runs and records are the ones they were."""
        return not self.compile and not self.boundary.startswith("dose-") and not self.structural_norm

    @property
    def distils(self) -> bool:
        """A student that learns from a teacher (not the teacher itself, nor growth from scratch)."""
        return self.protocol != "teacher" and self.scratch_model is None

    @property
    def data_mode(self) -> str:
        # Grow-like runs replay one fixed shard; the long joint controls continue onto fresh data (long_data).
        return "fresh" if self.protocol == "joint-long" and self.long_data == "fresh" else "replay"

    @property
    def own_steps(self) -> int:
        """The steps this run computes itself: its phases after the prefix it shares (start_from's phase-<p>),
        which the run it starts from computed."""
        shared = int(Path(self.start_from).name.removeprefix("phase-")) + 1 if self.start_from else 0
        return sum(phase.steps for phase in plan_phases(self)[shared:])


@dataclass(frozen=True)
class Phase:
    index: int
    active_blocks: int
    trainable_blocks: tuple[int, ...]
    trains_head: bool              # LM head and boundary norm
    first_step: int                # global step index of the phase's first step
    steps: int


def plan_phases(config: RunConfig) -> list[Phase]:
    K, S = config.blocks, config.phase_steps
    if config.protocol == "teacher":
        return [Phase(0, 0, (), True, 0, S)]
    if config.protocol in ("joint", "joint-long"):  # joint: joint-long's first phase alone
        phases = config.joint_phases if config.protocol == "joint-long" else 1
        return [Phase(p, K, tuple(range(K)), True, p * S, S) for p in range(phases)]
    grow = config.protocol == "grow"  # else freeze: grow's phase 0, then only the newly appended block learns
    return [Phase(p, p + 1, tuple(range(p + 1)) if grow else (p,), grow or p == 0 or config.freeze_trains_head,
                  p * S, S) for p in range(K)]


# Named transition schedules: (warmup factor, peak factor) at the first append, then at every later one.
# "asymmetric", the paper's summary: slower warmup after the first append (where post-norm recovers slowly),
# faster after later ones; one factor of 2 each way (docs/preregistrations.md, 2026-12-02, idea 1).
TRANSITION_SCHEDULES = {"asymmetric": ((2.0, 1.0), (0.5, 1.0))}


def transition_factors(config: RunConfig) -> list[tuple[float, float]]:
    """(warmup factor, peak factor) of every phase from config.transition_schedule; phase 0 is (1, 1)."""
    spec, phases = config.transition_schedule.strip(), len(plan_phases(config))
    if not spec:
        return [(1.0, 1.0)] * phases
    if spec in TRANSITION_SCHEDULES:
        first, later = TRANSITION_SCHEDULES[spec]
        return [(1.0, 1.0)] + [first if p == 1 else later for p in range(1, phases)]
    try:
        factors = [tuple(float(x) for x in item.split(":")) for item in spec.split(",")]
    except ValueError:
        factors = []
    if len(factors) != phases - 1 or any(len(f) != 2 or not all(math.isfinite(x) and x > 0 for x in f) for f in factors):
        raise ConfigError(f"transition_schedule {spec!r}: name one of {', '.join(TRANSITION_SCHEDULES)}, or give one "
                          f"positive warmup_factor:peak_factor per transition ({phases - 1}), e.g. \"2:1,0.5:1\"")
    return [(1.0, 1.0)] + factors


def learning_rate(config: RunConfig, step_in_phase: int, phase: int = 0) -> float:
    """Linear warmup over warmup_frac of the phase (or phase_warmups), then cosine from lr (or phase_lrs) to min_lr
    at the phase end; a transition_schedule scales a later phase's warmup and peak, its warmup kept within
    [AdamW's second-moment horizon 1/(1 - beta2), the phase] (shorter, the step size rests on too few squares)."""
    peak = config.phase_lrs[phase] if config.phase_lrs else config.lr
    warmup = int(config.phase_warmups[phase]) if config.phase_warmups else round(config.warmup_frac * config.phase_steps)
    if config.transition_schedule and phase:
        warmup_factor, peak_factor = transition_factors(config)[phase]
        horizon = math.ceil(round(1 / (1 - config.betas[1]), 6))
        warmup, peak = min(config.phase_steps, max(horizon, round(warmup_factor * warmup))), peak * peak_factor
    warmup = max(1, warmup)
    if step_in_phase < warmup:
        return peak * (step_in_phase + 1) / warmup
    progress = (step_in_phase - warmup) / max(1, config.phase_steps - warmup)
    return config.min_lr + 0.5 * (peak - config.min_lr) * (1 + math.cos(math.pi * progress))


def absolute_paths(settings: dict, run_dir: Path) -> dict:
    """A config's PATH_FIELDS made absolute, from the run folder where `relative_to_run`, else from the cwd."""
    base = Path(run_dir) if settings.get("relative_to_run") else Path.cwd()
    return {k: str((base / v).resolve()) for k in PATH_FIELDS if isinstance(v := settings.get(k), str) and v}


def read(run_dir) -> RunConfig:
    """A run folder's config.json as a RunConfig with its paths absolute: the one way back from disk."""
    return RunConfig(**checkpoint.loads((Path(run_dir) / "config.json").read_text())).resolved(run_dir)
