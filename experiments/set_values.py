"""What `--set SECTION.KEY=VALUE` accepts: the keys one may set (and those the kit sets itself), a value read as
its field's type and checked against its range or choices, and the folder name a set of values gives its runs.

    python repro.py table1 --scale toy --set run.lr=6e-3   # its runs in runs/toy/set/run.lr=0.006/
"""

import hashlib
import math
import re
import unicodedata

import config
from plumbing import corpora, errors, tokenizer
from plumbing.hf_qwen3 import ModelConfig
from plumbing.locks import printable

# The keys: a section's dataclass fields, the corpus's options, and what each number may be.

OVERRIDABLE = {"run": config.RunConfig, "teacher_run": config.RunConfig, "teacher_model": ModelConfig,
               "data": None, "diag": None}  # section -> the dataclass whose defaults also count as keys
# corpora.corpus's options, settable beside the preset's own data keys: another corpus is
# --set data.source=local --set data.path=my.jsonl (a folder of .txt, a .jsonl or parquet files).
DATA_OPTIONS = {name: value for options in corpora.CORPUS_OPTIONS.values() for name, value in options.items()}


# What a parsed value must also be: inside its range (every number has one: tests/test_bad_inputs.py), one of a
# setting's choices, so that a bad value is one line before any folder is made; upper ends lie far past any run the
# kit could train, so that a mistyped exponent is refused, not planned.
RANGES = {  # name: (lowest, highest); a tuple's values (phase_lrs, phase_warmups, betas) each
    "seed": (0, 2**63 - 1), "blocks": (1, 128), "layers_per_block": (1, 128), "phase_steps": (1, 10**9),
    "global_batch": (1, 2**20), "micro_batch": (1, 2**20), "lr": (0, 1e3), "min_lr": (0, 1e3), "warmup_frac": (0, 1),
    "eps": (0, 1), "weight_decay": (0, 10), "grad_clip": (0, 1e6), "alpha": (0, 1e3), "gamma": (0, 1e3),
    "tau": (0.01, 100), "loss_chunk": (1, 2**24), "eval_interval": (1, 10**9), "eval_batch": (1, 2**20),
    "checkpoint_interval": (1, 10**9), "snapshot_interval": (0, 10**9), "monitor_interval": (0, 10**9),
    "boundary_scale": (1e-6, 1e6), "monitor_rms_warn": (0, 1e12), "monitor_kurtosis_warn": (0, 1e12),
    "diverged_above_uniform": (0, 1e6), "diverged_above_best": (0, 1e6), "phase_lrs": (1e-12, 1e3),
    "phase_warmups": (1, 10**9), "betas": (0, 0.999999), "identity_threshold": (0, 1e6), "monitor_ratio_warn": (0, 1e12),
    "boundary_tail": (-1e6, 1e6),
    # teacher_model (ModelConfig; config_problem checks how they fit together)
    "hidden_size": (1, 65536), "intermediate_size": (1, 2**20), "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 1024), "num_key_value_heads": (1, 1024), "head_dim": (1, 1024),
    "rope_theta": (1, 1e12), "rms_norm_eps": (1e-12, 1), "max_position_embeddings": (1, 2**24),
    "initializer_range": (0, 10), "attention_window": (0, 2**24),
    # data, diag
    "vocab_size": (256, tokenizer.QWEN3_N_RANKS), "max_len": (1, 2**20), "val_docs": (1, 10**8),
    "paragraphs_per_document": (1, 10**4), "document_chars": (0, 10**8), "docs": (1, 10**5), "max_inputs": (1, 2**20)}
# Keys the kit sets itself for every run (from its data, teacher, protocol and shared prefix), or that
# hold a structure with no command-line form: a --set of one would be replaced without a word.
SET_BY_KIT = {"run": {"teacher", "train_data", "val_data", "replay_docs", "start_from", "joint_phases",
                      "teacher_config", "scratch_model", "relative_to_run"},
              "teacher_model": {"vocab_size"}}
SET_BY_KIT["teacher_run"] = SET_BY_KIT["run"]


def value_problem(name: str, value) -> str:
    """Why one parsed --set value cannot be used ("" if it can)."""
    if name in RANGES and not isinstance(value, (bool, str)):
        low, high = RANGES[name]
        if not all(low <= v <= high for v in (value if isinstance(value, tuple) else (value,))):
            each = "each value " if isinstance(value, tuple) else ""
            return f"expected {each}from {low:,} to {high:,}" + (" (Adam betas below 1, e.g. 0.9,0.95)" if name == "betas"
                                                                 else "")
    if name in config.CHOICES and value not in config.CHOICES[name]:
        return f"expected one of {', '.join(config.CHOICES[name])}"
    return ""


def parse_value(key: str, raw: str, current):
    """`raw` as the type of the preset's current value; a bad value is a one-line error naming the key."""
    def bad(why):
        return errors.OptionError("--set", f"{key}={printable(raw, 80)}: {why}")
    if isinstance(current, bool):
        if raw.lower() not in ("true", "false", "1", "0"):
            raise bad("expected true or false")
        return raw.lower() in ("true", "1")
    if isinstance(current, (int, float)) or current is None:
        try:
            value = int(raw) if isinstance(current, int) or current is None else float(raw)
        except ValueError:
            raise bad(f"expected {'an integer' if isinstance(current, int) or current is None else 'a number'}") from None
        if not math.isfinite(value) or value < 0:
            raise bad("expected a finite number >= 0")
        return value
    if isinstance(current, (tuple, list)):
        try:
            value = tuple(float(v) for v in raw.strip("()[] ").split(","))
        except ValueError:
            raise bad("expected numbers separated by commas, e.g. 0.9,0.95") from None
        if not all(math.isfinite(v) and v >= 0 for v in value):
            raise bad("expected finite numbers >= 0")
        if current and len(value) != len(current):  # an empty default (phase_lrs) takes any length
            raise bad(f"expected {len(current)} numbers")
        return value
    if isinstance(current, str):
        if any(unicodedata.category(c)[0] == "C" for c in raw):  # it would name folders, and reach the terminal
            raise bad("holds a control character (an escape sequence, a line break); write the value without it")
        return raw
    raise bad("this key cannot be set from the command line")


# The folder a set of values names: runs made with other settings never share one.

OVERRIDE_NAME_BYTES = 120  # a folder name's limit is 255 bytes; results/<scale>+<name> adds to it


def override_name(changes: dict) -> str:
    """A folder name for a set of overrides, e.g. run.lr=0.0003,run.phase_steps=100: one set, one name; a long
    one cut, ending in a hash of the whole."""
    name = ",".join(f"{s}.{k}={named(v)}" for s in sorted(changes) for k, v in sorted(changes[s].items()))
    if len(name.encode()) <= OVERRIDE_NAME_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return name.encode()[:OVERRIDE_NAME_BYTES - 17].decode(errors="ignore") + "~" + digest


def named(value) -> str:
    """A value as a folder name shows it; a string with a character the name would lose or misread (/, spaces,
    control characters, , = ~) also ends in a hash of its exact value."""
    if not isinstance(value, str):
        return str(value).replace(" ", "")  # (0.9, 0.99) -> (0.9,0.99): a tuple's spaces are always ", "
    readable = "".join(c for c in re.sub(r"\s", "", value.replace("/", "_")) if unicodedata.category(c)[0] != "C")
    same = readable == value and not re.search(r"[,=~]", value)
    return readable if same else f"{readable}~{hashlib.sha256(value.encode()).hexdigest()[:12]}"
