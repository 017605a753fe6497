"""Qwen3-style models: the teacher (a plain Qwen3 causal LM) and the block-stack student.

    import model
    teacher = model.load_qwen3("path/to/Qwen3-8B-Base")              # HF checkpoint directory
    logits = teacher(input_ids)                                       # (B, T, V)
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=3, norm="post", seed=42)
    logits = student(input_ids, active_blocks=2)                      # run only blocks 0 and 1
    student.save("runs/x/final"); student = model.Student.load("runs/x/final")
    model.export_hf(pre_norm_student, "out/")                         # loads in transformers unchanged

Both models take `output_fn(hidden, head_weight)` in forward, so the training loss can apply the LM
head in chunks (kd.py) without the full logits ever existing; FSDP2's hooks still gather the head
weight because it is used inside forward. Batches are right-padded, so causal attention alone keeps
real tokens from seeing padding; no attention mask is ever built.

Parameter names follow transformers' Qwen3 except the two per-layer norms, which are named for the
sub-layer they belong to (`attn_norm`, `mlp_norm`) because their position depends on the placement;
checkpoint I/O maps them to `input_layernorm` / `post_attention_layernorm`.
"""
from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from plumbing.checkpoint import load_tensors, read_config, write_checkpoint
from plumbing.errors import CheckpointError

# ----------------------------------------------------------------------------------------------
# Config

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

    @classmethod
    def from_hf(cls, hf: dict, source: str = "config.json") -> "ModelConfig":
        arch = hf.get("model_type")
        if arch != "qwen3":
            raise CheckpointError(f"{source}: model_type is {arch!r}, not 'qwen3'; point at a Qwen3 checkpoint")
        values = {f.name: hf[f.name] for f in fields(cls) if f.name in hf}
        if "rope_theta" not in values:  # transformers 5 nests it
            rope = hf.get("rope_parameters")
            values["rope_theta"] = (rope if isinstance(rope, dict) else {}).get("rope_theta", cls.rope_theta)
        problem = config_problem(values)
        if problem:
            raise CheckpointError(f"{source}: {problem}; the config is damaged or not a Qwen3 model's: restore the "
                                  "checkpoint from a copy, or re-download or re-export it")
        if "head_dim" not in values:
            values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
        return cls(**values)

    def to_hf(self) -> dict:
        hf = asdict(self)
        hf.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu",
                  attention_bias=False, attention_dropout=0.0, torch_dtype="float32",
                  rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta})
        return hf


# The fields a Qwen3 config.json always has: the defaults above are Qwen3-8B's, and a checkpoint that
# lacks one of these is not described by them.
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def config_problem(values: dict) -> str:
    """Why ModelConfig fields (from a config.json, or --set teacher_model) cannot describe a model ("" if
    they can): a required one missing, a size that is not a positive integer, a float that is not a
    positive finite number, a flag that is not true or false, heads that do not divide. Checked before
    any module is built, so a bad value is one line, not an error deep inside torch (or a NaN result)."""
    missing = [name for name in REQUIRED_FIELDS if name not in values]
    if missing:
        return f"lacks {', '.join(missing)}"
    defaults = {f.name: f.default for f in fields(ModelConfig)}
    for name, value in values.items():
        kind = type(defaults[name])
        if kind is bool and not isinstance(value, bool):
            return f"{name} is {value!r}, not true or false"
        if kind is int and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return f"{name} is {value!r}, not a positive integer"
        if kind is float and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                  and math.isfinite(value) and (value > 0 or name == "initializer_range" and value == 0)):
            return f"{name} is {value!r}, not a positive finite number"
    if values["num_attention_heads"] % values.get("num_key_value_heads", ModelConfig.num_key_value_heads):
        return (f"num_attention_heads ({values['num_attention_heads']}) is not a multiple of num_key_value_heads "
                f"({values.get('num_key_value_heads', ModelConfig.num_key_value_heads)})")
    return ""


# ----------------------------------------------------------------------------------------------
# Layers

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Statistics in fp32; cast back before the weight, as transformers does (bf16 parity).
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rope_cos_sin(config: ModelConfig, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, head_dim) cos and signed sin in fp32 for rotate-half RoPE. The sin's first half is negated
    so that apply_rope needs one roll instead of a negation and a concatenation. Recomputed per
    forward: it is tiny, and a buffer would need re-initialising after meta-device construction."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return torch.cat((freqs, freqs), dim=-1).cos(), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)


def apply_rope(x, cos, signed_sin):
    """x: (B, n_heads, T, hd). x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x2, x1) equals
    roll(x, hd/2) = (x2, x1) times the sign folded into signed_sin. cos/sin are cast to x's dtype,
    as transformers does."""
    return x * cos.to(x.dtype) + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention with per-head RMSNorm on q and k before RoPE (Qwen3)."""

    def __init__(self, config: ModelConfig, v_norm: bool = False):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.v_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if v_norm else None  # HybridNorm's
        # The boundary monitor and the diagnostics: when set, each forward also records how much every
        # query attends to position 0 (the document-boundary token), (B, n_heads, T), in first_attention.
        self.record_first_attention, self.first_attention = False, None

    def project(self, x):
        """q and k (normalised per head) and v, each (B, heads, T, hd), before RoPE."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)     # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim)
        v = (v if self.v_norm is None else self.v_norm(v)).transpose(1, 2)                      # (B, nkv, T, hd)
        return q, k, v

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.project(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.record_first_attention:
            self.first_attention = attention_to_first(q, k)
        # NOTE: is_causal keeps SDPA on its fused path; right padding needs no mask (padding comes last).
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


@torch.no_grad()
def attention_to_first(q: torch.Tensor, k: torch.Tensor, max_elements: int = 2**26) -> torch.Tensor:
    """(B, n_heads, T) float32: the causal softmax attention weight each query puts on key 0, from q
    (B, n_heads, T, hd) and k (B, n_kv, T, hd) after RoPE, as SDPA weighs them. exp(s_0 - logsumexp_j<=t
    s_j), computed over blocks of query rows so that a long sequence never holds all its scores."""
    B, n_heads, T, hd = q.shape
    groups = n_heads // k.shape[1]
    q = q.float().view(B, k.shape[1], groups, T, hd)                          # (B, nkv, g, T, hd)
    k = k.float()
    rows = max(1, max_elements // max(1, B * n_heads * T))
    out = []
    for start in range(0, T, rows):
        scores = torch.einsum("bkgtd,bksd->bkgts", q[:, :, :, start:start + rows], k) / math.sqrt(hd)
        t = torch.arange(start, min(start + rows, T), device=q.device)
        scores = scores.masked_fill(torch.arange(T, device=q.device)[None, :] > t[:, None], float("-inf"))
        out.append((scores[..., 0] - scores.logsumexp(-1)).exp())             # (B, nkv, g, rows)
    return torch.cat(out, dim=-1).reshape(B, n_heads, T)


def fused_attention_problem(config: ModelConfig, length: int, device) -> str:
    """"" if causal grouped-query attention over `length` tokens runs forward and backward on a fused SDPA
    kernel (flash, memory-efficient or cuDNN) on `device`; else why not. The math kernel that SDPA falls
    back to without a word holds every head's T x T scores: at 8,192 tokens 8 GiB a layer for 32 heads."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    shape = lambda heads: (1, heads, length, config.head_dim)
    q = torch.randn(shape(config.num_attention_heads), device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(shape(config.num_key_value_heads), device=device, dtype=dtype, requires_grad=True)
            for _ in range(2))
    try:
        gqa = config.num_key_value_heads != config.num_attention_heads
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).sum().backward()
    except RuntimeError as e:
        return " ".join(str(e).split())[:300]
    return ""


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ----------------------------------------------------------------------------------------------
# Norm placements. A placement is a layer forward, the RMSNorms a layer owns, and whether the student
# normalises the embeddings before block 0 (entry) and the stream before the LM head (final). Add a
# placement by adding an entry to PLACEMENTS; the README writes each one's equations out.

def pre_norm_layer(layer, h, cos, sin):
    h = layer.self_attn(layer.attn_norm(h), cos, sin) + h
    return layer.mlp(layer.mlp_norm(h)) + h


def post_norm_layer(layer, h, cos, sin):
    h = layer.attn_norm(layer.self_attn(h, cos, sin) + h)
    return layer.mlp_norm(layer.mlp(h) + h)


def sandwich_layer(layer, h, cos, sin):
    """Sandwich-LN (Ding et al. 2021) and Peri-LN (Kim et al. 2025): each sub-layer's input and output
    normalised, the residual stream itself never."""
    h = layer.attn_out_norm(layer.self_attn(layer.attn_norm(h), cos, sin)) + h
    return layer.mlp_out_norm(layer.mlp(layer.mlp_norm(h))) + h


def hybrid_layer(layer, h, cos, sin):
    """HybridNorm (Zhuo et al. 2025; the official code's dense config: attn_norm false, ffn_norm true,
    ffn_residual_after_norm true, q/k/v norms on): attention on the raw stream with q, k and v each
    normalised per head (inside self_attn), y = h + Attn(h); then z = N(y) and z + FFN(z), so the FFN's
    residual carries the normalised stream. The model has a final norm and none on the embeddings."""
    h = layer.self_attn(h, cos, sin) + h
    z = layer.mlp_norm(h)
    return layer.mlp(z) + z


def deepnorm_layer(layer, h, cos, sin):
    """DeepNorm (Wang et al. 2022, torchscale's decoder): post-norm with the residual up-weighted by alpha,
    x <- N(alpha x + f(x))."""
    h = layer.attn_norm(layer.residual_scale * h + layer.self_attn(h, cos, sin))
    return layer.mlp_norm(layer.residual_scale * h + layer.mlp(h))


def deepnet_alpha(layers: int) -> float:
    """DeepNet's decoder-only residual scale for N layers: (2N)^(1/4)."""
    return (2 * layers) ** 0.25


def deepnet_beta(layers: int) -> float:
    """DeepNet's decoder-only init gain for N layers: (8N)^(-1/4). torchscale divides, after the base
    init, every weight whose name holds fc1, fc2, out_proj or v_proj by (8N)^(1/4); in its gated FFN
    (component/gate_linear_unit.py, with deepnorm in architecture/retnet.py) fc1 is the activated input
    projection (our gate_proj), fc2 the output (down_proj), and the linear multiplier `gate` (our
    up_proj) is not scaled; nor are q and k."""
    return (8 * layers) ** -0.25


DEEPNET_SCALED = ("self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")


@dataclass(frozen=True)
class Placement:
    layer_forward: Callable
    entry_norm: bool               # an RMSNorm on the embeddings before block 0
    final_norm: bool               # an RMSNorm before the LM head (after the last active block)
    layer_norms: tuple[str, ...] = ("attn_norm", "mlp_norm")  # hidden-size RMSNorms each layer owns
    v_norm: bool = False           # a per-head RMSNorm on attention values (Qwen3 already has q's and k's)
    deepnet: bool = False          # DeepNet's alpha on the residual and beta on the init
    first_layer: str = ""          # the placement of the model's first layer, if another (HybridNorm*)


SUBLAYER_NORMS = ("attn_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm")
PLACEMENTS = {
    "pre": Placement(pre_norm_layer, entry_norm=False, final_norm=True),
    "post": Placement(post_norm_layer, entry_norm=True, final_norm=False),
    "sandwich": Placement(sandwich_layer, entry_norm=False, final_norm=True, layer_norms=SUBLAYER_NORMS),
    "peri": Placement(sandwich_layer, entry_norm=True, final_norm=True, layer_norms=SUBLAYER_NORMS),
    "hybrid": Placement(hybrid_layer, entry_norm=False, final_norm=True, layer_norms=("mlp_norm",), v_norm=True),
    # HybridNorm*: the model's first layer pre-norm (with the q/k/v norms), every other one HybridNorm (the
    # official code's norm_pos_special_config {0: {attn_norm: True, ffn_residual: False}}).
    "hybrid-star": Placement(hybrid_layer, entry_norm=False, final_norm=True, layer_norms=("mlp_norm",), v_norm=True,
                             first_layer="hybrid-first"),
    "hybrid-first": Placement(pre_norm_layer, entry_norm=False, final_norm=True, v_norm=True),
    "deepnorm": Placement(deepnorm_layer, entry_norm=True, final_norm=False,
                          deepnet=True),
}


def placement(norm: str) -> Placement:
    if norm not in PLACEMENTS:
        raise ValueError(f"norm placement {norm!r} is unknown; choose one of {sorted(PLACEMENTS)}")
    return PLACEMENTS[norm]


def block_norms(norm: str, blocks: int) -> tuple[str, ...]:
    """The placement of each block: one name for all ("post"), or one per block ("pre,post,post": a
    block's placement is chosen at the phase that appends it)."""
    names = tuple(n.strip() for n in norm.split(","))
    if len(names) == 1:
        names *= blocks
    if len(names) != blocks:
        raise ValueError(f"norm schedule {norm!r} names {len(names)} placements for {blocks} blocks; give one "
                         "placement, or one per block separated by commas")
    for name in names:
        placement(name)
    return names


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, norm: str = "pre"):
        super().__init__()
        self.placement = placement(norm)
        self.self_attn = Attention(config, v_norm=self.placement.v_norm)
        self.mlp = MLP(config)
        for name in self.placement.layer_norms:
            setattr(self, name, RMSNorm(config.hidden_size, config.rms_norm_eps))
        self.residual_scale = 1.0  # DeepNorm's alpha, set by the student for its depth

    def forward(self, h, cos, sin):
        return self.placement.layer_forward(self, h, cos, sin)


def logits_output(hidden, head_weight):
    return hidden @ head_weight.T


def run_layer(layer, h, cos, sin, checkpoint: bool):
    """Activation checkpointing recomputes a layer in backward instead of storing its activations."""
    if checkpoint and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(layer, h, cos, sin, use_reentrant=False)
    return layer(h, cos, sin)


@torch.no_grad()
def init_qwen3_weights(module: nn.Module, std: float, generator: torch.Generator):
    """Qwen3's module-wise init, in registration order from one generator: Linear and Embedding
    weights ~ N(0, std); RMSNorm weights = 1. Works on FSDP2-sharded (DTensor) parameters too: each
    rank draws the full tensor, so the result does not depend on the world size."""
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            full = torch.empty(sub.weight.shape, dtype=torch.float32)
            fill_parameter(sub.weight, full.normal_(0.0, std, generator=generator))
        elif isinstance(sub, RMSNorm):
            fill_parameter(sub.weight, torch.ones(sub.weight.shape))


def fill_parameter(param: torch.Tensor, full: torch.Tensor):
    """Copy a full-size tensor into a parameter, taking only this rank's slice if it is a DTensor."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor
        full = distribute_tensor(full.to(param.device, param.dtype), param.device_mesh, param.placements,
                                 src_data_rank=None)
    param.copy_(full)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from all ranks if it is a sharded DTensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# ----------------------------------------------------------------------------------------------
# Teacher: the plain Qwen3 causal LM

class Qwen3(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, "pre") for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.checkpoint_layers = False
        self.capture_boundaries, self.captured = False, None  # as Student's: the diagnostics' view of a forward

    @property
    def head_weight(self):
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def init_weights(self, seed: int):
        """Embedding, every Linear and the LM head ~ N(0, initializer_range); every RMSNorm weight = 1."""
        init_qwen3_weights(self, self.config.initializer_range, torch.Generator().manual_seed(seed))

    def forward(self, input_ids, output_fn: Callable = logits_output):
        h = self.embed_tokens(input_ids)                                         # (B, T, H)
        cos, sin = rope_cos_sin(self.config, input_ids.shape[1], input_ids.device)
        record_attention(self, self.capture_boundaries)
        boundaries = [h]
        for layer in self.layers:
            h = run_layer(layer, h, cos, sin, self.checkpoint_layers)
            boundaries.append(h)
        if self.capture_boundaries:  # here a boundary is every layer's output
            self.captured = captured(boundaries, self)
        return output_fn(self.norm(h), self.head_weight)


def record_attention(net: nn.Module, on: bool):
    """Have every layer's attention record its first-token attention in the next forward (or stop)."""
    for layer in net.layers:
        layer.self_attn.record_first_attention, layer.self_attn.first_attention = on, None


def captured(boundaries: list[torch.Tensor], net: nn.Module) -> dict:
    """What capture_boundaries keeps of a forward: the residual stream at each boundary and each layer's
    first-token attention (None for a layer that did not run), all detached; recording then stops."""
    attention = [layer.self_attn.first_attention for layer in net.layers]
    record_attention(net, False)
    return {"boundaries": [x.detach() for x in boundaries], "first_attention": attention}


# ----------------------------------------------------------------------------------------------
# Student: K blocks of L layers, its boundary norms, frozen embedding, trainable head

OUTPUT_GAINS = ("ones", "teacher")  # Student.from_teacher's output_gain
# Interventions at the input of every block after the first (the block boundaries a grow run appends at):
# "norm": a trainable RMSNorm on the stream (forward and backward change); "rescale-fwd": each token's
# stream rescaled to RMS `boundary_scale` in the forward pass only, the backward pass treating it as the
# identity; "mirror-fwd": the same, to each token's RMS in a reference run (profile_source). The same
# forward as rescale-fwd with two other backwards, so that only the backward channel varies:
# "rescale-detached": the per-token factor t / r a constant (the upstream gradient times it), and
# "rescale-full": the true Jacobian (t / r)(I - h^ h^T), h^ = h / |h|, which has no radial part.
# A synthetic dose, forward only (straight-through): "dose-boundary" scales the boundary token's state
# (position 0) to boundary_scale x the median RMS of the row's other positions (the paper: 37);
# "dose-channel" sets channel 0 of the boundary token to boundary_scale x the row's median |activation|
# (a massive activation, Sun et al. 2024: ~10^3-10^4). Do heavy tails alone reproduce pre-norm's penalty?
BOUNDARIES = ("none", "norm", "rescale-fwd", "mirror-fwd", "rescale-detached", "rescale-full", "dose-boundary",
              "dose-channel")


class StraightThroughRescale(torch.autograd.Function):
    """Forward: h scaled per token to RMS `target` (a number, or (B, T, 1)). Backward: the identity,
    so gradients reach h as if nothing were there (their values still differ from an untouched run's,
    because everything downstream saw the rescaled stream)."""

    @staticmethod
    def forward(ctx, h, target):
        rms = h.float().pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)
        return (h.float() * (target / rms)).to(h.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def rescale_forward_only(h: torch.Tensor, target) -> torch.Tensor:
    return StraightThroughRescale.apply(h, target)


def dose(h: torch.Tensor, ratio: float, kind: str) -> torch.Tensor:
    """The boundary token (position 0) made heavy-tailed, forward only: its RMS at `ratio` x the median
    RMS of the other positions ("dose-boundary"), or its channel 0 at `ratio` x the median |activation|
    of the row ("dose-channel"). The change is added as a constant: gradients pass as the identity."""
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


def structural_norm(h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The boundary token (position 0) rescaled to `scale` x the median RMS of its row's other positions,
    every other position untouched: separate statistics for the structural token (issue 33, idea 6). The
    median, as the dose's: the forward has no mask, and padding is a minority of a row's positions. The
    row's statistic is detached; the token's own RMS and the scale are differentiated through."""
    if h.shape[1] < 2:
        return h
    x = h.float()
    rms = x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)                    # (B, T, 1)
    regular = rms[:, 1:].median(dim=1, keepdim=True).values.detach()                 # (B, 1, 1)
    first = x[:, :1] * (scale.float() * regular / rms[:, :1])
    return torch.cat([first.to(h.dtype), h[:, 1:]], dim=1)


class Scale(nn.Module):
    """One learned scalar (structural_norm's), initialised to 1; shape (1,), as checkpoints and FSDP2's
    row sharding hold tensors with rows."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))


# Optional parts of a student (issue 33), each at the input of every block after the first: "correction",
# an RMSNorm the boundary correction switches on where the transition reading fires (transitions.py);
# "structural", structural_norm's learned scale.
FEATURES = ("correction", "structural")


def rescale(h: torch.Tensor, target, backward: str) -> torch.Tensor:
    """Each token scaled to RMS `target`: backward "identity" (straight-through), "detached" (t / r a
    constant) or "full" (autograd through r as well)."""
    if backward == "identity":
        return rescale_forward_only(h, target)
    rms = h.float().pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)
    return (h.float() * (target / (rms.detach() if backward == "detached" else rms))).to(h.dtype)


class Student(nn.Module):
    def __init__(self, config: ModelConfig, blocks: int, layers_per_block: int, norm: str, boundary: str = "none",
                 boundary_scale: float = 1.0, features: tuple = ()):
        super().__init__()
        if blocks < 1 or layers_per_block < 1:
            raise ValueError(f"blocks ({blocks}) and layers_per_block ({layers_per_block}) must be at least 1")
        if boundary not in BOUNDARIES:
            raise ValueError(f"boundary intervention {boundary!r} is unknown; choose one of {', '.join(BOUNDARIES)}")
        self.config = ModelConfig(**{**asdict(config), "num_hidden_layers": blocks * layers_per_block,
                                     "tie_word_embeddings": False})
        self.blocks, self.layers_per_block, self.norm_placement = blocks, layers_per_block, norm
        names = block_norms(norm, blocks)
        self.placements = [placement(n) for n in names]
        self.boundary, self.boundary_scale = boundary, boundary_scale
        self.profile_source: Callable | None = None  # mirror-fwd: input_ids -> {block: (B, T, 1) target RMS}
        self.capture_boundaries, self.captured = False, None  # the boundary monitor's view of a forward
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the paper freezes the copied embedding
        # Flat list of layers (one FSDP unit each); block b is layers[b*L:(b+1)*L].
        layer_names = [names[i // layers_per_block] for i in range(blocks * layers_per_block)]
        layer_names[0] = placement(layer_names[0]).first_layer or layer_names[0]
        self.layers = nn.ModuleList(DecoderLayer(config, name) for name in layer_names)
        for layer in self.layers:
            layer.residual_scale = deepnet_alpha(len(self.layers)) if layer.placement.deepnet else 1.0
        # `norm` is the final norm where any block needs one, else the entry norm (the paper's two
        # placements have exactly one); `entry_norm` exists only where both are needed.
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        both = self.placements[0].entry_norm and any(p.final_norm for p in self.placements)
        self.entry_norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if both else None
        self.boundary_norms = nn.ModuleList(RMSNorm(config.hidden_size, config.rms_norm_eps)
                                            for _ in range(blocks - 1)) if boundary == "norm" else None
        unknown = set(features) - set(FEATURES)
        if unknown:
            raise ValueError(f"student feature {sorted(unknown)[0]!r} is unknown; choose from {', '.join(FEATURES)}")
        self.features = tuple(f for f in FEATURES if f in features)
        self.correction_norms = nn.ModuleList(RMSNorm(config.hidden_size, config.rms_norm_eps)
                                              for _ in range(blocks - 1)) if "correction" in features else None
        self.corrected: set[int] = set()  # the blocks whose correction norm is on (transitions.py)
        self.structural_scales = nn.ModuleList(Scale() for _ in range(blocks - 1)) if "structural" in features else None
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.checkpoint_layers = False

    @property
    def head_weight(self):
        return self.lm_head.weight

    def block_layers(self, b: int) -> nn.ModuleList:
        return self.layers[b * self.layers_per_block:(b + 1) * self.layers_per_block]

    def block_modules(self, b: int) -> list[nn.Module]:
        """What belongs to block b and trains with it: its layers and the boundary norm at its input."""
        extra = [self.structural_scales[b - 1]] if self.structural_scales is not None and b else []
        extra += [self.correction_norms[b - 1]] if b in self.corrected else []
        return [self.block_layers(b)] + ([self.boundary_norms[b - 1]] if self.boundary_norms and b else []) + extra

    def boundary_modules(self) -> list[nn.Module]:
        """The entry and final norms (they train with the head)."""
        return [self.norm] + ([self.entry_norm] if self.entry_norm is not None else [])

    def entry_module(self) -> nn.Module | None:
        if not self.placements[0].entry_norm:
            return None
        return self.entry_norm if self.entry_norm is not None else self.norm

    def final_module(self, active_blocks: int) -> nn.Module | None:
        return self.norm if self.placements[active_blocks - 1].final_norm else None

    def init_weights(self, seed: int):
        """Decoder layers only (embedding, boundary norm and head come from the teacher): every
        Linear ~ N(0, initializer_range), every RMSNorm = 1, all K blocks at once from `seed`, so
        pre and post, joint and grow students of one seed start from identical decoder weights.
        DeepNorm layers then scale v, o, the FFN's activated input and its output by DeepNet's beta
        (DEEPNET_SCALED), at the final depth N = K x L, as alpha is."""
        init_qwen3_weights(self.layers, self.config.initializer_range, torch.Generator().manual_seed(seed))
        beta = deepnet_beta(len(self.layers))
        with torch.no_grad():
            for layer in self.layers:
                if layer.placement.deepnet:
                    for name in DEEPNET_SCALED:
                        layer.get_submodule(name).weight.mul_(beta)
            for norm in [*(self.boundary_norms or []), *(self.correction_norms or []), *(self.structural_scales or [])]:
                norm.weight.fill_(1.0)

    def reinit_block(self, b: int, generator: torch.Generator):
        """Block b's layers drawn again as init_weights draws them (Qwen3's init, DeepNet's beta), from
        `generator`: the block-importance remedy (transitions.py)."""
        init_qwen3_weights(self.block_layers(b), self.config.initializer_range, generator)
        beta = deepnet_beta(len(self.layers))
        with torch.no_grad():
            for layer in self.block_layers(b):
                if layer.placement.deepnet:
                    for name in DEEPNET_SCALED:
                        layer.get_submodule(name).weight.mul_(beta)

    def set_block_placement(self, b: int, norm: str):
        """Block b >= 1 (not yet trained) takes placement `norm` (--norm auto, transitions.py), where that
        leaves the student's parameters as they are: e.g. pre <-> post after a pre-norm block 0 (the final
        norm serves whichever last block needs it). Its checkpoints then store the new schedule."""
        names = list(block_norms(self.norm_placement, self.blocks))
        names[b] = norm
        with on_meta_device():
            other = Student(self.config, self.blocks, self.layers_per_block, ",".join(names), self.boundary,
                            self.boundary_scale, self.features)
        if b == 0 or other.state_dict().keys() != self.state_dict().keys():
            raise ValueError(f"block {b} cannot become {norm}-norm in the schedule {self.norm_placement}: the "
                             "student's parameters would change")
        self.placements[b] = placement(norm)
        for layer in self.block_layers(b):
            layer.placement = self.placements[b]
            layer.residual_scale = deepnet_alpha(len(self.layers)) if layer.placement.deepnet else 1.0
        self.norm_placement = ",".join(names) if len(set(names)) > 1 else names[0]

    @classmethod
    def from_teacher(cls, teacher: Qwen3, blocks: int, layers_per_block: int, norm: str, seed: int,
                     dtype=torch.float32, shard_fn: Callable | None = None, output_gain: str = "ones",
                     boundary: str = "none", boundary_scale: float = 1.0, features: tuple = ()) -> "Student":
        """Built on the meta device; `shard_fn` (e.g. FSDP2's fully_shard per layer) runs before any
        memory is allocated, so each rank only ever holds its own slice.

        output_gain (post-norm only): "ones" is the paper's init. "teacher" starts the last RMSNorm of
        every block from the teacher's final-norm gain g_T: whichever block is the last active one, the
        head then reads g_T-scaled states, as a pre-norm student's head does from step 0. In a grow run
        each appended block brings its own g_T-initialised last norm, so the gain is re-applied at every
        phase; blocks that were trained before keep their trained gains."""
        if output_gain not in OUTPUT_GAINS:
            raise ValueError(f"output_gain {output_gain!r} is unknown; choose one of {', '.join(OUTPUT_GAINS)}")
        student = cls.on_meta(teacher.config, blocks, layers_per_block, norm, dtype, shard_fn, boundary, boundary_scale,
                              features)
        student.to_empty(device=teacher.embed_tokens.weight.device)
        student.init_weights(seed)
        with torch.no_grad():
            fill_parameter(student.embed_tokens.weight, full_tensor(teacher.embed_tokens.weight))
            for boundary_norm in student.boundary_modules():  # entry and final norms alike
                fill_parameter(boundary_norm.weight, full_tensor(teacher.norm.weight))
            fill_parameter(student.lm_head.weight, full_tensor(teacher.head_weight))  # own copy, even if tied
            if output_gain == "teacher":
                for b in range(blocks):
                    last = student.block_layers(b)[-1]
                    if not student.placements[b].final_norm and hasattr(last, "mlp_norm"):
                        fill_parameter(last.mlp_norm.weight, full_tensor(teacher.norm.weight))
        return student

    @classmethod
    def from_scratch(cls, config: ModelConfig, blocks: int, layers_per_block: int, norm: str, seed: int,
                     dtype=torch.float32, shard_fn: Callable | None = None, device="cpu",
                     boundary: str = "none", boundary_scale: float = 1.0, features: tuple = ()) -> "Student":
        """No teacher: every weight from `seed` (Qwen3's init: Linear and embedding ~ N(0, std), norms 1),
        the decoder layers exactly as from_teacher draws them; the embedding trains."""
        student = cls.on_meta(config, blocks, layers_per_block, norm, dtype, shard_fn, boundary, boundary_scale, features)
        student.to_empty(device=device)
        student.init_weights(seed)
        generator = torch.Generator().manual_seed(seed + 1)  # the layers' own draws stay from_teacher's
        with torch.no_grad():
            for module in (student.embed_tokens, student.lm_head, *student.boundary_modules()):
                init_qwen3_weights(module, config.initializer_range, generator)
        student.embed_tokens.weight.requires_grad_(True)
        return student

    @classmethod
    def on_meta(cls, config, blocks, layers_per_block, norm, dtype, shard_fn, boundary, boundary_scale,
                features=()) -> "Student":
        with on_meta_device():
            student = cls(config, blocks, layers_per_block, norm, boundary, boundary_scale, features).to(dtype)
            if shard_fn is not None:
                shard_fn(student)
        return student

    def enter_block(self, b: int, h: torch.Tensor, profile: dict | None) -> torch.Tensor:
        """What block b reads: the boundary intervention at its input (b >= 1), then the structural-token
        norm and the correction norm where the student has them."""
        h = self.intervene(b, h, profile)
        if b and self.structural_scales is not None:
            h = structural_norm(h, self.structural_scales[b - 1].weight)
        return self.correction_norms[b - 1](h) if b in self.corrected else h

    def intervene(self, b: int, h: torch.Tensor, profile: dict | None) -> torch.Tensor:
        """The boundary intervention at the input of block b >= 1 (none: h itself)."""
        if b == 0 or self.boundary == "none":
            return h
        if self.boundary == "norm":
            return self.boundary_norms[b - 1](h)
        if self.boundary.startswith("dose-"):
            return dose(h, self.boundary_scale, self.boundary)
        target = profile[b] if self.boundary == "mirror-fwd" else self.boundary_scale
        backward = {"rescale-detached": "detached", "rescale-full": "full"}.get(self.boundary, "identity")
        return rescale(h, target, backward)

    def forward(self, input_ids, active_blocks: int | None = None, skip_block: int | None = None,
                output_fn: Callable = logits_output, return_boundaries: bool = False):
        """Run blocks 0..active_blocks-1 (default: all), bypassing `skip_block` entirely (its norms
        too). With return_boundaries, also returns the residual stream at every block boundary:
        [input of block 0, output of block 0, ..., output of the last active block]; a skipped
        block's output equals its input."""
        active_blocks = self.blocks if active_blocks is None else active_blocks
        if not 1 <= active_blocks <= self.blocks:
            raise ValueError(f"active_blocks={active_blocks} must be in 1..{self.blocks}")
        profile = None
        if self.boundary == "mirror-fwd" and active_blocks > 1:
            if self.profile_source is None:
                raise CheckpointError("a mirror-fwd student needs its reference run's boundary profile "
                                 "(profile_source) to run more than one block")
            profile = self.profile_source(input_ids, active_blocks)
        h = self.embed_tokens(input_ids)                                         # (B, T, H)
        cos, sin = rope_cos_sin(self.config, input_ids.shape[1], input_ids.device)
        record_attention(self, self.capture_boundaries)
        entry = self.entry_module()
        if entry is not None:
            h = entry(h)
        boundaries = [h]
        for b in range(active_blocks):
            if b != skip_block:
                h = self.enter_block(b, h, profile)
                for layer in self.block_layers(b):
                    h = run_layer(layer, h, cos, sin, self.checkpoint_layers)
            boundaries.append(h)
        if self.capture_boundaries:
            self.captured = captured(boundaries, self)
        final = self.final_module(active_blocks)
        if final is not None:
            h = final(h)
        out = output_fn(h, self.head_weight)
        return (out, boundaries) if return_boundaries else out

    def checkpoint_config(self) -> dict:
        """config.json of a student checkpoint: the HF fields plus the student's shape."""
        shape = {"blocks": self.blocks, "layers_per_block": self.layers_per_block, "norm": self.norm_placement}
        if self.boundary != "none":
            shape.update(boundary=self.boundary, boundary_scale=self.boundary_scale)
        if self.features:
            shape.update(features=list(self.features), corrected=sorted(self.corrected))
        return {**self.config.to_hf(), "architectures": ["NormgrowStudent"], "normgrow_student": shape}

    def save(self, path, state: dict | None = None):
        """config.json and model.safetensors; `state` replaces state_dict() (e.g. gathered shards)."""
        write_checkpoint(path, self.checkpoint_config(), self.state_dict() if state is None else state)

    def names_in(self, stored_norm: str) -> Callable[[str], str | None]:
        """Where each parameter lies in a checkpoint of the schedule `stored_norm` whose block 0 is ours
        (a transplant adopts another schedule's phase 0): under its own name, except that a schedule
        whose only norm is its entry norm stores it as `norm` (see __init__), and our final norm, which
        that schedule lacks, is absent (None: it keeps its initial value)."""
        stored = [placement(n) for n in block_norms(stored_norm, self.blocks)]
        if self.entry_norm is None or not stored[0].entry_norm or any(p.final_norm for p in stored):
            return lambda name: name
        return lambda name: {"entry_norm.weight": "norm.weight", "norm.weight": None}.get(name, name)

    @classmethod
    def load(cls, path, dtype=torch.float32, device="cpu") -> "Student":
        path = Path(path)
        hf = read_config(path)
        shape = hf.get("normgrow_student")
        if not shape:
            raise CheckpointError(f"{path / 'config.json'}: not a normgrow student (no 'normgrow_student' entry); "
                                  "use model.load_qwen3 for a plain Qwen3 checkpoint")
        problem = shape_problem(shape)
        if problem:
            raise CheckpointError(f"{path / 'config.json'}: {problem}; the config is damaged: restore the checkpoint "
                                  "from a copy")
        with torch.device("meta"):
            student = cls(ModelConfig.from_hf(hf, str(path / "config.json")), shape["blocks"],
                          shape["layers_per_block"], shape["norm"], shape.get("boundary", "none"),
                          shape.get("boundary_scale", 1.0), tuple(shape.get("features", ())))
        student.corrected = set(shape.get("corrected", ()))
        load_tensors(student, path, dtype, device, name_in_file=lambda name: name)
        student.embed_tokens.weight.requires_grad_(False)
        return student


def shape_problem(shape) -> str:
    """Why a config.json's normgrow_student entry cannot describe a student ("" if it can), checked
    before the student is built so that a bad value names the field, not a line inside the model."""
    if not isinstance(shape, dict):
        return f"normgrow_student is {shape!r}, not an object of blocks, layers_per_block and norm"
    for key in ("blocks", "layers_per_block"):
        value = shape.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return f"normgrow_student.{key} is {'missing' if key not in shape else repr(value)}, not a positive integer"
    norm = shape.get("norm")
    if not isinstance(norm, str):
        return f"normgrow_student.norm is {'missing' if 'norm' not in shape else repr(norm)}, not a placement name"
    try:
        block_norms(norm, shape["blocks"])
    except ValueError as e:
        return f"normgrow_student.norm: {e}"
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


# ----------------------------------------------------------------------------------------------
# HF checkpoint I/O

HF_NORM_NAMES = {".attn_norm.": ".input_layernorm.", ".mlp_norm.": ".post_attention_layernorm."}


def hf_name(name: str) -> str:
    """Kit parameter name -> transformers' Qwen3ForCausalLM name."""
    if name.startswith("lm_head."):
        return name
    for ours, theirs in HF_NORM_NAMES.items():
        name = name.replace(ours, theirs)
    return "model." + name


def load_qwen3(path, dtype=torch.float32, device="cpu", shard_fn: Callable | None = None) -> Qwen3:
    """Load a HF Qwen3 checkpoint directory: one model.safetensors or an index with shards, any
    float dtype on disk, tied (no lm_head.weight) or untied embeddings. Built on the meta device;
    with `shard_fn` (FSDP2), each rank reads only its own rows of each sharded tensor from disk."""
    path = Path(path)
    teacher = qwen3_on_meta(ModelConfig.from_hf(read_config(path), str(path / "config.json")), shard_fn)
    load_tensors(teacher, path, dtype, device, name_in_file=hf_name)
    return teacher.eval().requires_grad_(False)


def qwen3_on_meta(config: ModelConfig, shard_fn: Callable | None = None) -> Qwen3:
    """A Qwen3 on the meta device (no memory), sharded by `shard_fn` (FSDP2) if given: what load_qwen3
    fills from a checkpoint, and what plan.py's full-size rehearsal fills with fake tensors."""
    with on_meta_device():
        teacher = Qwen3(config)
        if shard_fn is not None:
            shard_fn(teacher)
    return teacher


@contextmanager
def on_meta_device():
    """Build on the meta device, a real one even inside a FakeTensorMode (plan.py's full-size rehearsal):
    to_empty then swaps in fake tensors, which it cannot do for parameters that are fake themselves."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily(), torch.device("meta"):
        yield


def save_qwen3(teacher: Qwen3, path, state: dict | None = None):
    """Write a teacher as a standard HF Qwen3 checkpoint directory (tied head not duplicated)."""
    state = teacher.state_dict() if state is None else state
    write_checkpoint(path, teacher.config.to_hf(), {hf_name(k): v for k, v in state.items()})


EXPORT_MARKER = "normgrow-export.json"  # in every folder export_hf writes: only such folders are replaced


def export_hf(student: Student, path, source: str = "", extra_files: dict[str, str] | None = None):
    """A pre-norm student is exactly a Qwen3 with K*L layers: write it as one transformers loads, with
    `extra_files` (name -> text: the tokenizer's files, generation_config.json) beside it."""
    if student.norm_placement != "pre" or student.boundary != "none":
        extra = f" with {student.boundary!r} boundaries" if student.boundary != "none" else ""
        raise CheckpointError(f"{source or 'this student'}: only pre-norm students without boundary interventions are "
                         f"Qwen3 models; this one is {student.norm_placement!r}-norm{extra}: export a pre-norm run's "
                         "checkpoint (a post-norm student is read by the kit itself: eval, sample)")
    state = {hf_name(k): v for k, v in student.state_dict().items()}
    write_checkpoint(path, student.config.to_hf(), state,
                     extra_files={**(extra_files or {}), EXPORT_MARKER: json.dumps({"exported_from": source}) + "\n"})


def forward_flops_per_token(c: ModelConfig, layers: int, context: float) -> tuple[float, float]:
    """(decoder layers, LM head) forward FLOPs per token: 2 per weight, plus causal attention."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    weights = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    attention = 4 * q * context  # QK^T and AV (2 FLOPs per multiply-add each) over an average causal context
    return layers * (2 * weights + attention), 2 * c.hidden_size * c.vocab_size


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
