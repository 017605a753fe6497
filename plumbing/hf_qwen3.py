"""A Qwen3 as transformers' files hold it: the config.json fields the math depends on (ModelConfig), checked
before any module is built; transformers' tensor names; and writing such a folder, from a teacher or a pre-norm
student (exactly a Qwen3). Reading one builds a model: model.load_qwen3.

    config = ModelConfig.from_hf(checkpoint.read_config(path), str(path / "config.json"))
    save_qwen3(teacher, "teacher/"); export_hf(pre_norm_student, "out/")   # load in transformers unchanged
"""

import json
from dataclasses import asdict, dataclass, fields

import torch.nn as nn

from plumbing.checkpoint import finite_number, write_checkpoint
from plumbing.errors import CheckpointError


@dataclass
class ModelConfig:
    """The fields of a HF Qwen3 `config.json` that the math depends on (defaults: Qwen3-8B-Base)."""
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    initializer_range: float = 0.02
    # The kit's own: each query attends to itself and the attention_window - 1 keys before it (0: all, Qwen3's).
    attention_window: int = 0
    # The kit's own: Qwen3's q/k RMSNorm (True) or raw projections (False, a folder transformers cannot read).
    qk_norm: bool = True

    @classmethod
    def from_hf(cls, hf: dict, source: str = "config.json") -> "ModelConfig":
        if (arch := hf.get("model_type")) != "qwen3":
            raise CheckpointError(f"{source}: model_type is {arch!r}, not 'qwen3'; point at a Qwen3 checkpoint")
        values = {f.name: hf[f.name] for f in fields(cls) if f.name in hf}
        if "rope_theta" not in values:  # transformers 5 nests it
            rope = hf.get("rope_parameters")
            values["rope_theta"] = (rope if isinstance(rope, dict) else {}).get("rope_theta", cls.rope_theta)
        if problem := config_problem(values):
            raise CheckpointError(f"{source}: {problem}; the config is damaged or not a Qwen3 model's: restore the "
                                  "checkpoint from a copy, or re-download or re-export it")
        values.setdefault("head_dim", values["hidden_size"] // values["num_attention_heads"])
        return cls(**values)

    def to_hf(self) -> dict:
        hf = asdict(self)
        if self.qk_norm:  # a standard Qwen3's config.json, where the kit's own switch is at Qwen3's setting
            del hf["qk_norm"]
        hf.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu",
                  attention_bias=False, attention_dropout=0.0, torch_dtype="float32",
                  rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
                  use_sliding_window=self.attention_window > 0, sliding_window=self.attention_window or None,
                  max_window_layers=0)
        return hf


# The fields a Qwen3 config.json always has (the defaults above are Qwen3-8B's, no other model's).
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def config_problem(values: dict) -> str:
    """Why ModelConfig fields cannot describe a model ("" if they can), checked before any module is built."""
    if missing := [name for name in REQUIRED_FIELDS if name not in values]:
        return f"lacks {', '.join(missing)}"
    defaults = {f.name: f.default for f in fields(ModelConfig)}
    for name, value in values.items():
        kind = type(defaults[name])
        if kind is bool and not isinstance(value, bool):
            return f"{name} is {value!r}, not true or false"
        if kind is int and not (isinstance(value, int) and not isinstance(value, bool)
                                and (value >= 1 or name == "attention_window" and value == 0)):
            return f"{name} is {value!r}, not a positive integer"
        if kind is float and not (finite_number(value) and (value > 0 or name == "initializer_range" and value == 0)):
            return f"{name} is {value!r}, not a positive finite number"
    heads, kv_heads = values["num_attention_heads"], values.get("num_key_value_heads", ModelConfig.num_key_value_heads)
    if heads % kv_heads:
        return f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
    return ""


# model.py names each layer's norms for their sub-layer (their position depends on the placement), transformers
# for where a pre-norm layer has them.
HF_NORM_NAMES = {".attn_norm.": ".input_layernorm.", ".mlp_norm.": ".post_attention_layernorm."}


def hf_name(name: str) -> str:
    """Kit parameter name -> transformers' Qwen3ForCausalLM name."""
    if name.startswith("lm_head."):
        return name
    for ours, theirs in HF_NORM_NAMES.items():
        name = name.replace(ours, theirs)
    return "model." + name


def save_qwen3(net: nn.Module, path, extra_files: dict[str, str] | None = None):
    """A teacher, or a student that is one (export_hf), as a standard HF Qwen3 folder, with `extra_files`."""
    write_checkpoint(path, net.config.to_hf(), {hf_name(k): v for k, v in net.state_dict().items()}, extra_files)


EXPORT_MARKER = "normgrow-export.json"  # in every folder export_hf writes: only such folders are replaced


def export_hf(student: nn.Module, path, source: str = "", extra_files: dict[str, str] | None = None):
    """A pre-norm student is exactly a Qwen3 with K*L layers: written as one transformers loads."""
    if student.norm_placement != "pre" or student.boundary != "none":
        extra = f" with {student.boundary!r} boundaries" if student.boundary != "none" else ""
        raise CheckpointError(f"{source or 'this student'}: only pre-norm students without boundary interventions are "
                              f"Qwen3 models; this one is {student.norm_placement!r}-norm{extra}: export a pre-norm run's "
                              "checkpoint (a post-norm student is read by the kit itself: eval, sample)")
    save_qwen3(student, path, {**(extra_files or {}), EXPORT_MARKER: json.dumps({"exported_from": source}) + "\n"})
