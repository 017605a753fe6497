"""Presets: every number of a scale (smoke, toy, small, full), the dimensionless ratios that make a
smaller scale a miniature of the paper, and --set overrides of any preset field for one command (the keys
and values `--set` accepts, and the folder names they give: experiments/set_values.py).

    python repro.py ratios --scale toy                     # the toy's ratios beside the paper's
    python repro.py table1 --scale toy --set run.lr=6e-3   # one field changed, its runs in their own folder
"""
from dataclasses import MISSING, dataclass, field, fields, replace

import paper
from experiments.set_values import DATA_OPTIONS, OVERRIDABLE, SET_BY_KIT, parse_value, value_problem
from plumbing import corpora, errors
from plumbing.hf_qwen3 import ModelConfig, config_problem
from plumbing.locks import printable

# The paper's settings, and the boundary monitor (not the paper's): a row every eval_interval / 5 steps,
# warnings at the thresholds the paper's follow-up ideas name.
PAPER_RUN = {**paper.RUN, "monitor_interval": 400, "monitor_rms_warn": paper.MONITOR_WARN["rms"],
             "monitor_kurtosis_warn": paper.MONITOR_WARN["kurtosis"]}

@dataclass(frozen=True)
class Preset:
    name: str
    about: str
    data: dict            # prepare_shards.prepare: source, vocab_size (None: Qwen3's own), max_len, val_docs, options
    run: dict             # config.RunConfig fields shared by every student run
    teacher: str = ""     # HF checkpoint folder or hub id; "" means the kit pretrains its own:
    teacher_model: dict = field(default_factory=dict)  # its ModelConfig fields
    teacher_run: dict = field(default_factory=dict)    # its RunConfig fields that differ from `run`
    long_phases: tuple[int, int] = (2, 3)              # post-joint-long / -longer (Table 3: 100k, 150k)
    diag: dict = field(default_factory=dict)           # the fixed diagnostic batch: docs, max_inputs, seed
    needs_cuda: bool = False
    doc_tokens: float = 0.0  # expected non-padding tokens per document (dry runs before data exists)
    # The kit's own teachers as trained once, shipped in this repository (folders relative to it): the one
    # whose settings (and data, where it records them) are the workspace's is installed as its teacher/, so a
    # first run does not spend hours pretraining; `repro.py teacher --rebuild` trains it again beside it.
    shipped_teachers: tuple[str, ...] = ()


PRESETS = {
    "smoke": Preset(
        "smoke", "every experiment end to end in a few minutes on 2 CPU cores; numbers meaningless",
        data=dict(source="toy", vocab_size=512, max_len=32, val_docs=16),
        run={**PAPER_RUN, "layers_per_block": 1, "phase_steps": 8, "global_batch": 4, "micro_batch": 2,
             "lr": 3e-3, "min_lr": 3e-5, "warmup_frac": 0.125, "eval_interval": 4, "monitor_interval": 2, "eval_batch": 8,
             "loss_chunk": 256, "checkpoint_interval": 4, "snapshot_interval": 4, "precision": "fp32"},
        teacher_model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8, tie_word_embeddings=True, rope_theta=10_000.0),
        teacher_run=dict(phase_steps=20, lr=3e-3, min_lr=3e-4, eval_interval=10),
        diag=dict(docs=4, max_inputs=16, seed=42), doc_tokens=30.0),
    # The toy is a miniature of the paper chosen from its dimensionless ratios (README, "The toy preset"), fixed before
    # its results were seen: student/teacher depth 3/12 = the paper's 9/36; the same alpha, gamma, tau, clip, betas and
    # min_lr/lr; lr = the paper's 1e-4 x 4096/128 (width transfer); warmup 25 steps, past AdamW's 1/(1 - beta2) = 20; as
    # many steps per phase as 30 minutes on 2 CPU cores allow for the students; a teacher that sees 4x the documents of
    # the longest-trained student (1500 x 32 against 3 x 250 x 16), cached after the first run. A first teacher of 600
    # steps (1.6x) ended level with the best student, failing the "teacher clearly better" principle.
    "toy": Preset(
        "toy", "offline on a laptop CPU: the kit pretrains a 12-layer teacher on State of the Union paragraphs",
        data=dict(source="toy", vocab_size=4096, max_len=128, val_docs=200, all_documents=True),
        run={**PAPER_RUN, "layers_per_block": 1, "phase_steps": 250, "global_batch": 16, "micro_batch": 16,
             "lr": 3e-3, "min_lr": 3e-5, "warmup_frac": 0.1, "eval_interval": 125, "monitor_interval": 25, "eval_batch": 50,
             "loss_chunk": 2048, "checkpoint_interval": 50, "snapshot_interval": 125, "precision": "auto"},
        # Untied, as Qwen3-8B is. The init's scale transferred by width as the LR is: sigma * sqrt(fan_in)
        # equals the paper's 0.02 * sqrt(4096) = 1.28, so a fresh block's branches start as large against
        # the stream as the paper's do (sigma 0.02 at width 128 would make them 5.7x smaller).
        teacher_model=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=12, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=32, tie_word_embeddings=False, rope_theta=10_000.0,
                           initializer_range=0.02 * (4096 / 128) ** 0.5),
        teacher_run=dict(phase_steps=1500, lr=3e-3, min_lr=1e-4, warmup_frac=0.1, eval_interval=250,
                         global_batch=32, micro_batch=32),
        diag=dict(docs=8, max_inputs=128, seed=42), doc_tokens=95.0,
        shipped_teachers=("teachers/toy",)),
    "small": Preset(
        "small", "one GPU: Qwen3-0.6B-Base teacher (tied embeddings) and FineWeb-Edu",
        data=dict(source="fineweb-edu", vocab_size=None, max_len=2048, val_docs=1000),
        run={**PAPER_RUN, "phase_steps": 4000, "global_batch": 32, "micro_batch": 8, "eval_interval": 500,
             "monitor_interval": 100, "eval_batch": 8, "loss_chunk": 8192, "checkpoint_interval": 250,
             "snapshot_interval": 1000, "precision": "bf16", "balance_lengths": True},
        teacher="Qwen/Qwen3-0.6B-Base", diag=dict(docs=2, max_inputs=2048, seed=42), needs_cuda=True,
        doc_tokens=880.0),
    "full": Preset(
        "full", "the paper exactly: Qwen3-8B-Base teacher, FineWeb-Edu sample-10BT, 3 x 50k steps",
        data=dict(source="fineweb-edu", vocab_size=None, max_len=8192, val_docs=4833),
        # micro_batch 2: a packed micro-batch's token budget is micro_batch x max_len = 16,384 tokens (data.
        # token_micro_batches packs whole documents into as few as a step needs and deals them to the ranks by cost),
        # derived from memory: the fewest tokens at which a rank takes its share of a step (~7,800 tokens on 8 GPUs)
        # in one micro-batch whatever its longest document, so the ranks balance best (0.97; 8,192 tokens: 0.88),
        # as long as the worst step it allows (every micro-batch a full budget of full-length documents, as the
        # rehearsal builds it) fits a GPU: 41.6 GiB a GPU by tools/memory.py, of the 72 usable of an 80 GiB H100
        # (lockstep_plan.MEMORY_HEADROOM); 32,768 or 65,536 tokens balance no better for 3.4 or 5.8 GiB more. The
        # paper's 64 documents a step stay; on 64 GPUs (one document a rank) set run.micro_batch=1.
        run={**PAPER_RUN, "micro_batch": 2, "eval_batch": 1, "loss_chunk": 4096, "checkpoint_interval": 500,
             "snapshot_interval": 10_000, "precision": "bf16", "activation_checkpointing": True,
             "balance_lengths": True},
        teacher="Qwen/Qwen3-8B-Base", diag=dict(docs=2, max_inputs=2048, seed=42), needs_cuda=True,
        # 3.112B non-padding tokens per 50k x 64-document phase: Table A2's 3.11B, 6.22B and 9.34B all round from it.
        doc_tokens=972.5),
}

# mini: what the miniature search found (docs/records/2026-12-01-miniature-search.md). No rung met the mechanism's
# criterion before the next rung's estimated cost passed the 2-hour limit, so, as pre-registered, mini
# is the last rung run: the toy with 1,000 steps per phase (rung 2, tokens-x4; LR x steps 3, the
# replay shard 16,000 of 25,271 documents). The teacher is the toy's, unchanged (its snapshots kept at
# the toy's interval so that its settings, and the shipped teacher, are the toy's).
_toy = PRESETS["toy"]
PRESETS = {"smoke": PRESETS["smoke"], "toy": _toy,
           "mini": replace(_toy, name="mini", about="2 CPU cores in a few hours: the toy with 4x the steps per phase, "
                           "the last rung of the miniature search (the mechanism not reached)",
                           run={**_toy.run, "phase_steps": 1000, "eval_interval": 500, "snapshot_interval": 500},
                           teacher_run={**_toy.teacher_run, "snapshot_interval": _toy.run["snapshot_interval"]}),
           "small": PRESETS["small"], "full": PRESETS["full"]}


# The reading rule's tie margin (report.reading, readings.RULE), fixed before any mini run (README, "The mini scale"):
# 0.01 nats is a third of the paper's interaction (-0.0332), the primary endpoint at toy and mini scale.
TIE_MARGIN = 0.01


# The seeds of the commands that run several by default (`--seeds` overrides), at every scale not named here 42:
# the experiments beyond the paper three; the causal test by construction 8, by its power calculation
# (experiments/tail.py).
DEFAULT_SEEDS = {command: {scale: seeds.get(scale, [42]) for scale in PRESETS} for command, seeds in (
    ("beyond", {"toy": [42, 43, 44]}),
    ("tail", {"toy": list(range(42, 50))}))}


# The hub teachers' shapes (their config.json's ModelConfig fields; Qwen3-8B-Base is the defaults),
# known before any download: dry runs, ratios and growth from scratch read them.
HUB_TEACHERS = {"Qwen/Qwen3-8B-Base": {},
                "Qwen/Qwen3-0.6B-Base": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                             num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                             tie_word_embeddings=True)}


def teacher_shape(preset: Preset) -> ModelConfig:
    """The scale's teacher: a hub model's known shape, or the kit's own over the scale's vocabulary."""
    if preset.teacher:
        return ModelConfig(**HUB_TEACHERS[preset.teacher])
    return ModelConfig(**{**preset.teacher_model, "vocab_size": corpora.vocabulary(preset.data).n_vocab})


def regime_ratios(preset: Preset) -> list[tuple[str, float, float]]:
    """(quantity, paper, preset) rows: the ratios that make a scale a miniature of the paper (README, "The toy preset")."""
    def values(p: Preset) -> dict:
        r, teacher_run = p.run, {**p.run, **p.teacher_run}
        student = r["blocks"] * r["layers_per_block"]
        shape = teacher_shape(p)
        teacher = shape.num_hidden_layers
        warmup = max(1, round(r["warmup_frac"] * r["phase_steps"]))
        return {"student depth S = K x L": student, "teacher depth T": teacher, "S / T": student / teacher,
                "steps per phase": r["phase_steps"], "peak LR": r["lr"], "LR x steps per phase": r["lr"] * r["phase_steps"],
                "min LR / peak LR": r["min_lr"] / r["lr"], "warmup steps": warmup,
                "warmup / AdamW horizon 1/(1 - beta2)": warmup * (1 - r["betas"][1]),
                "documents per step": r["global_batch"], "tokens per step (assumed tokens/document)":
                    round(r["global_batch"] * min(p.doc_tokens, p.data["max_len"])),
                "teacher documents / documents of the longest-trained student":  # teacher_run: what differs from run
                    teacher_run["phase_steps"] * teacher_run["global_batch"] / (3 * r["phase_steps"] * r["global_batch"])
                    if p.teacher_run else None,
                "teacher's head tied to its embedding": shape.tie_word_embeddings,
                "init std x sqrt(width)": shape.initializer_range * shape.hidden_size ** 0.5,
                "alpha (KD weight)": r["alpha"], "gamma (CE weight)": r["gamma"], "tau": r["tau"],
                "gradient clip": r["grad_clip"], "AdamW beta2": r["betas"][1]}
    paper, ours = values(PRESETS["full"]), values(preset)
    return [(k, paper[k], ours[k]) for k in paper]


def ratios_markdown(preset: Preset) -> list[str]:
    def show(v):
        if v is None:
            return "≫ 1 (a pretrained LLM)"
        if isinstance(v, bool):
            return "yes" if v else "no"
        return f"{v:,}" if isinstance(v, int) else f"{v:.4g}"
    return [f"| quantity | paper | {preset.name} |", "| --- | --- | --- |"] + \
        [f"| {k} | {show(a)} | {show(b)} |" for k, a, b in regime_ratios(preset)]


# How a run differs from its preset, {section: {key: value}}, each value typed as the preset's field and in its range:
# what `--set` parses to and a variant gives (docs/design.md, "How a run's settings flow"). A run made with other
# settings lives in a folder of its own (set_values.override_name), so a finished run is never reused for them.
Settings = dict[str, dict]


def parse_overrides(preset: Preset, items) -> Settings:
    """--set items as Settings of `preset`'s fields (a later item of the same key wins); a bad item is one line
    naming it and the fix."""
    settings: Settings = {}
    for item in items:
        key, sep, raw = item.partition("=")
        section, _, name = key.strip().partition(".")
        if not sep or section not in OVERRIDABLE or not name:
            raise errors.OptionError("--set", f"{item!r}: write SECTION.KEY=VALUE with SECTION one of "
                                              f"{', '.join(OVERRIDABLE)}, e.g. run.lr=3e-4")
        known = {f.name: f.default for f in fields(OVERRIDABLE[section]) if f.default is not MISSING} \
            if OVERRIDABLE[section] else {}
        # the teacher's run is the scale's run under teacher_run's (suite.teacher_config): any run key can be set there
        known.update({**(DATA_OPTIONS if section == "data" else {}), **(preset.run if section == "teacher_run" else {}),
                      **getattr(preset, section)})
        if name not in known:
            raise errors.OptionError("--set", f"{printable(key.strip(), 80)}: unknown key; {section} has "
                                     f"{', '.join(sorted(known))}")
        if name in SET_BY_KIT.get(section, ()):
            raise errors.OptionError("--set", f"{key.strip()}: set by the kit for each run (from its data, teacher and "
                                     "protocol), not from the command line")
        value = parse_value(key.strip(), raw.strip(), known[name])
        if problem := value_problem(name, value):
            raise errors.OptionError("--set", f"{key.strip()}={raw.strip()}: {problem}")
        settings.setdefault(section, {})[name] = value
    return settings


def merged(*settings: Settings) -> Settings:
    """Settings applied one after another (a variant's, then the user's `--set`): a later value of a key wins."""
    out: Settings = {}
    for each in settings:
        for section, values in each.items():
            if values:  # a section left empty (by a filter) changes nothing
                out.setdefault(section, {}).update(values)
    return out


def with_settings(preset: Preset, changes: Settings, option: str) -> Preset:
    """The preset with the typed `changes` that an experiment's variant or an option's grid point makes, each value
    checked as a `--set` value is (its range or choices) and merged as `--set` is: every way a run differs from its
    preset passes the same checks. A bad value names `option`."""
    for section, values in changes.items():
        for key, value in values.items():
            if problem := value_problem(key, value):
                raise errors.OptionError(option, f"{section}.{key}={value}: {problem}")
    return apply_overrides(preset, changes)[0]


def apply_overrides(preset: Preset, settings: Settings, compile_flag: bool | None = None) -> tuple[Preset, Settings]:
    """(the preset with `settings` and `--compile/--no-compile` applied, the settings that changed it), refused where
    the overridden sections do not fit together: a micro-batch that does not divide the batch, a teacher model whose
    sizes or heads do not make a Qwen3 (config_problem)."""
    given = settings.get("run", {}).get("compile")
    if compile_flag is not None and given is not None and given != compile_flag:  # which one should hold?
        raise errors.OptionError("--set", f"run.compile={given} conflicts with --{'' if compile_flag else 'no-'}compile; "
                                 "give it once")
    changes = merged(settings, {"run": {"compile": compile_flag}} if compile_flag is not None else {})
    new = replace(preset, **{s: {**getattr(preset, s), **c} for s, c in changes.items()})
    runs = {"run": new.run, "teacher_run": {**preset.run, **new.teacher_run}}  # the teacher's, as teacher_config builds it
    for section, run in runs.items():
        if section in changes and run["global_batch"] % run["micro_batch"]:
            raise errors.OptionError("--set", f"{section}.micro_batch={run['micro_batch']} does not divide "
                                     f"{section}.global_batch={run['global_batch']}")
    # (a vocabulary of 1: the kit sets it)
    if "teacher_model" in changes and (problem := config_problem({**new.teacher_model, "vocab_size": 1})):
        raise errors.OptionError("--set", f"teacher_model: {problem}")
    return new, changes


# The mechanism's criterion, fixed before the miniature search (a closed study: docs/records/2026-12-01-miniature-search.md,
# which holds its kurtosis and massive-activation thresholds too), kept where live code reads it: its boundary statistic,
# the causal test's manipulation check (experiments/tail.py). The paper reports 37; the threshold asks for a quarter of
# that, an order of magnitude past the toy's 1.27. An attention sink (Gu et al. 2024) is measured and reported (SINK),
# never required: the paper's account is about the boundary an appended block reads, which it never connects to a sink.
MECHANISM = {"boundary_over_regular": 10.0}   # boundary token's mean RMS / regular tokens' (diag.token_type_rms)
SINK = {"attention": 0.3, "heads": 0.2}       # a head with mean attention >= 0.3 on position 0; >= 20% of heads
