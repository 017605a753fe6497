"""Qwen3-style models and their norm placements: the teacher (a plain Qwen3 causal LM) and the
block-stack student, each of whose blocks takes a placement from PLACEMENTS.

    import model
    teacher = model.load_qwen3("path/to/Qwen3-8B-Base")              # HF checkpoint directory
    logits = teacher(input_ids)                                       # (B, T, V)
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=3, norm="post", seed=42)
    logits = student(input_ids, active_blocks=2)                      # run only blocks 0 and 1
    student.save("runs/x/final"); student = model.Student.load("runs/x/final")

Both models take `output_fn(hidden, head_weight)` in forward, so the training loss can apply the LM
head in chunks (kd.py) without the full logits ever existing; FSDP2's hooks still gather the head
weight because it is used inside forward. A batch comes in one of two layouts: right-padded rows (B, T),
where causal attention alone keeps real tokens from seeing padding, or packed, its documents laid end to end
in one row (1, N) with their lengths (`doc_lengths`): every per-token operation then runs on real tokens only,
RoPE positions restart at each document and attention stays within it (`document_attention`). The math is the
padded layout's, up to the order of floating-point sums; no attention mask is ever built.

Parameter names follow transformers' Qwen3 except the two per-layer norms, which are named for the
sub-layer they belong to (`attn_norm`, `mlp_norm`) because their position depends on the placement;
plumbing/hf_qwen3.py maps them to `input_layernorm` / `post_attention_layernorm` and writes HF folders
(a teacher; a pre-norm student, export_hf). What a student does at its block boundaries beyond the
paper (the interventions) and what a forward records there (the monitor) live in interventions/; its
checkpoint folder (save, load) in interventions/student_folder.py.
"""

import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

try:  # torch's variable-length flash attention (CUDA only); absent from some builds
    from torch.nn.attention.varlen import varlen_attn
except ImportError:
    varlen_attn = None

from interventions.boundary import BoundaryInputs, checked_features
from interventions.monitor import attention_to_first, captured, record_attention, visible_keys
from interventions.placements import (
    deepnorm_layer,
    hybrid_layer,
    residual_scale,
    sandwich_layer,
    scale_deepnet_init,
    start_outputs_at_teacher_gain,
)
from interventions.student_folder import StudentFolder
from plumbing.checkpoint import load_tensors, read_config
from plumbing.devices import built_on_meta, fill_parameter, full_tensor
from plumbing.hf_qwen3 import ModelConfig, hf_name

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


def rope_cos_sin(config: ModelConfig, seq_len: int, device, doc_lengths: tuple[int, ...] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, head_dim) cos and signed sin in fp32 for rotate-half RoPE, at positions 0..T-1, or for a packed row
    (doc_lengths) at each token's position within its document. The sin's first half is negated so that
    apply_rope needs one roll instead of a negation and a concatenation. Recomputed per forward: it is tiny,
    and a buffer would need re-initialising after meta-device construction."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    positions = torch.arange(seq_len, device=device) if doc_lengths is None else document_positions(doc_lengths, device)
    freqs = torch.outer(positions.float(), inv_freq)
    return torch.cat((freqs, freqs), dim=-1).cos(), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)


def document_positions(doc_lengths: tuple[int, ...], device) -> torch.Tensor:
    """(N,) long: each token's position within its document, for documents of `doc_lengths` laid end to end.
    Sizes from the host's ints: no device-to-host sync (repeat_interleave is told its output's size)."""
    lengths, total = torch.tensor(doc_lengths, device=device), sum(doc_lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    return torch.arange(total, device=device) - torch.repeat_interleave(starts, lengths, output_size=total)


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
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else nn.Identity()
        self.v_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if v_norm else None  # HybridNorm's
        # The boundary monitor and the diagnostics: when set, each forward also records how much every
        # query attends to position 0 (the document-boundary token), (B, n_heads, T), in first_attention.
        self.record_first_attention, self.first_attention = False, None
        self.window = config.attention_window  # 0: every earlier key (Qwen3's); w: the w most recent only
        # A packed row's document lengths, set by the model for each forward (set_documents); None: padded rows.
        self.doc_lengths: tuple[int, ...] | None = None

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
        if self.doc_lengths is None:
            if self.record_first_attention:
                self.first_attention = attention_to_first(q, k, window=self.window)
            y = self.causal(q, k, v)
        else:
            y = self.document_attention(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def causal(self, q, k, v):
        """Causal SDPA over rows (B, heads, T, hd). NOTE: is_causal keeps SDPA on its fused path; right
        padding needs no mask (padding comes last)."""
        T = q.shape[2]
        band = visible_keys(torch.arange(T, device=q.device), T, self.window) if self.window else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=band, is_causal=band is None,
                                              enable_gqa=self.n_kv != self.n_heads)

    def document_attention(self, q, k, v):
        """Causal attention within each document of a packed row (1, heads, N, hd). On CUDA, torch's
        variable-length flash attention over the documents' cumulative lengths (one kernel for the row); elsewhere
        causal SDPA on each run of documents of one length, as one batch (data.longest_first lays them side by
        side; bit for bit the documents' separate calls). Measured on the toy's steps (docs/method.md): the
        documents scattered into padded rows for one batched SDPA tie it at 2 threads and lose on one, length
        buckets tie or lose, a block-diagonal mask over the row is 9x slower and flex attention has no CPU backward."""
        lengths = list(self.doc_lengths)
        if self.record_first_attention:  # to each document's own first token
            self.first_attention = torch.cat([attention_to_first(a, b, window=self.window) for a, b in
                                              zip(q.split(lengths, dim=2), k.split(lengths, dim=2))], -1)
        # The flash kernel takes one 16-bit dtype: under autocast q and k leave their norms' fp32 weights in fp32
        # beside a bf16 v (one GPU without FSDP), so all three take autocast's dtype; an fp32 run takes the slices.
        half = torch.get_autocast_dtype(q.device.type) if torch.is_autocast_enabled(q.device.type) else q.dtype
        if q.is_cuda and self.window == 0 and varlen_attn is not None and half in (torch.bfloat16, torch.float16):
            q, k, v = (t.to(half) for t in (q, k, v))
            cu = torch.tensor([0, *lengths], device=q.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            y = varlen_attn(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, max(lengths),
                            max(lengths), window_size=(-1, 0), enable_gqa=self.n_kv != self.n_heads)
            return y.transpose(0, 1)[None]                                              # (1, heads, N, hd)
        runs = [(n, len(list(same))) for n, same in itertools.groupby(lengths)]     # (length, documents)
        parts = [t.split([n * m for n, m in runs], dim=2) for t in (q, k, v)]  # one split: its backward one join
        # a run's tokens (1, heads, m * n, hd) as m documents (m, heads, n, hd), and SDPA's (m, n, heads, hd) output
        # as the run's tokens: views, and the outputs joined along the tokens copy-free for forward's reshape
        ys = [self.causal(*(t.unflatten(2, (m, n)).squeeze(0).transpose(0, 1) for t in run)).transpose(1, 2)
              .reshape(1, m * n, self.n_heads, self.head_dim) for (n, m), *run in zip(runs, *parts)]
        return torch.cat(ys, dim=1).transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# Norm placements. A placement is a layer forward, the RMSNorms a layer owns, and whether the student
# normalises the embeddings before block 0 (entry) and the stream before the LM head (final). Add a
# placement by adding an entry to PLACEMENTS; docs/method.md writes each one's equations out. The paper's
# two are here; the others' forwards (Sandwich-LN, HybridNorm, DeepNorm) are interventions/placements.py's.

def pre_norm_layer(layer, h, cos, sin):
    h = layer.self_attn(layer.attn_norm(h), cos, sin) + h
    return layer.mlp(layer.mlp_norm(h)) + h


def post_norm_layer(layer, h, cos, sin):
    h = layer.attn_norm(layer.self_attn(h, cos, sin) + h)
    return layer.mlp_norm(layer.mlp(h) + h)


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
    "deepnorm": Placement(deepnorm_layer, entry_norm=True, final_norm=False, deepnet=True),
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


def set_documents(net: nn.Module, doc_lengths: tuple[int, ...] | None):
    """The layout of the next forward for every attention of `net`: a packed row's document lengths, or None."""
    for layer in net.layers:
        layer.self_attn.doc_lengths = doc_lengths


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
        init_qwen3_weights(self, self.config.initializer_range, torch.Generator().manual_seed(seed))

    def forward(self, input_ids, output_fn: Callable = logits_output, doc_lengths: tuple[int, ...] | None = None):
        """input_ids (B, T) padded rows, or (1, N) documents of `doc_lengths` packed end to end."""
        h = self.embed_tokens(input_ids)                                         # (B, T, H)
        cos, sin = rope_cos_sin(self.config, input_ids.shape[1], input_ids.device, doc_lengths)
        set_documents(self, doc_lengths)
        record_attention(self, self.capture_boundaries)
        boundaries = [h]
        for layer in self.layers:
            h = run_layer(layer, h, cos, sin, self.checkpoint_layers)
            boundaries.append(h)
        if self.capture_boundaries:  # here a boundary is every layer's output
            self.captured = captured(boundaries, self)
        return output_fn(self.norm(h), self.head_weight)


def load_qwen3(path, dtype=torch.float32, device="cpu", shard_fn: Callable | None = None) -> Qwen3:
    """Load a HF Qwen3 checkpoint directory: one model.safetensors or an index with shards, any
    float dtype on disk, tied (no lm_head.weight) or untied embeddings. Built on the meta device;
    with `shard_fn` (FSDP2), each rank reads only its own rows of each sharded tensor from disk."""
    path = Path(path)
    teacher = qwen3_on_meta(ModelConfig.from_hf(read_config(path), str(path / "config.json")), shard_fn)
    load_tensors(teacher, path, dtype, device, name_in_file=hf_name)
    return teacher.eval().requires_grad_(False)


def qwen3_on_meta(config: ModelConfig, shard_fn: Callable | None = None) -> Qwen3:
    """A Qwen3 on the meta device (no memory), sharded by `shard_fn` (FSDP2) if given: what load_qwen3 fills
    from a checkpoint, the `teacher` protocol from its seed, and plan.py's full-size rehearsal with fake tensors."""
    return built_on_meta(lambda: Qwen3(config), shard_fn)


# Student: K blocks of L layers, frozen embedding, trainable head, interventions at block inputs (what a
# block after the first reads, enter_block, and the modules there are interventions/boundary.py's)

OUTPUT_GAINS = ("ones", "teacher")  # Student.from_teacher's output_gain


class Student(StudentFolder, BoundaryInputs, nn.Module):
    def __init__(self, config: ModelConfig, blocks: int, layers_per_block: int, norm: str, boundary: str = "none",
                 boundary_scale: float = 1.0, features: tuple = ()):
        super().__init__()
        if blocks < 1 or layers_per_block < 1:
            raise ValueError(f"blocks ({blocks}) and layers_per_block ({layers_per_block}) must be at least 1")
        self.features = checked_features(boundary, features)  # the interventions a student may have
        self.config = replace(config, num_hidden_layers=blocks * layers_per_block, tie_word_embeddings=False)
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
            layer.residual_scale = residual_scale(layer, len(self.layers))
        # `norm` is the final norm where any block needs one, else the entry norm (the paper's two
        # placements have exactly one); `entry_norm` exists only where both are needed.
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        both = self.placements[0].entry_norm and any(p.final_norm for p in self.placements)
        self.entry_norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if both else None
        self.add_input_modules(lambda: RMSNorm(config.hidden_size, config.rms_norm_eps))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.checkpoint_layers = False

    @property
    def head_weight(self):
        return self.lm_head.weight

    def block_layers(self, b: int) -> nn.ModuleList:
        return self.layers[b * self.layers_per_block:(b + 1) * self.layers_per_block]

    def block_modules(self, b: int) -> list[nn.Module]:
        """What belongs to block b and trains with it: its layers and the intervention modules at its input."""
        return [self.block_layers(b)] + self.input_modules(b)

    def boundary_modules(self) -> list[nn.Module]:
        """The entry and final norms (they train with the head)."""
        return [self.norm] + ([self.entry_norm] if self.entry_norm is not None else [])

    def entry_module(self) -> nn.Module | None:
        return (self.entry_norm or self.norm) if self.placements[0].entry_norm else None

    def final_module(self, active_blocks: int) -> nn.Module | None:
        return self.norm if self.placements[active_blocks - 1].final_norm else None

    def init_weights(self, seed: int):
        """Decoder layers (embedding, entry and final norms and head come from the teacher): all K blocks
        drawn by reinit_block from one generator seeded with `seed`, in registration order as one draw
        over every layer would be, so pre and post, joint and grow students of one seed start from
        identical decoder weights. The intervention modules (boundary_norms, ...) start at 1."""
        generator = torch.Generator().manual_seed(seed)
        for b in range(self.blocks):
            self.reinit_block(b, generator)
        self.reset_input_modules()

    def reinit_block(self, b: int, generator: torch.Generator):
        """Block b's layers drawn from `generator`: every Linear ~ N(0, initializer_range), every RMSNorm = 1,
        then DeepNorm layers' v, o, FFN activated input and output scaled by DeepNet's beta (DEEPNET_SCALED)
        at the final depth N = K x L, as alpha is. init_weights draws each block so; the block-importance
        remedy (transitions.py) draws one again."""
        init_qwen3_weights(self.block_layers(b), self.config.initializer_range, generator)
        scale_deepnet_init(self.block_layers(b), len(self.layers))

    @classmethod
    def from_teacher(cls, teacher: Qwen3, blocks: int, layers_per_block: int, norm: str, seed: int,
                     dtype=torch.float32, shard_fn: Callable | None = None, output_gain: str = "ones",
                     boundary: str = "none", boundary_scale: float = 1.0, features: tuple = ()) -> "Student":
        """Built on the meta device; `shard_fn` (e.g. FSDP2's fully_shard per layer) runs before any
        memory is allocated, so each rank only ever holds its own slice. output_gain (post-norm only):
        "ones" is the paper's init, "teacher" interventions/placements.py's start_outputs_at_teacher_gain."""
        if output_gain not in OUTPUT_GAINS:
            raise ValueError(f"output_gain {output_gain!r} is unknown; choose one of {', '.join(OUTPUT_GAINS)}")
        build = lambda: cls(teacher.config, blocks, layers_per_block, norm, boundary, boundary_scale, features).to(dtype)
        student = built_on_meta(build, shard_fn)
        student.to_empty(device=teacher.embed_tokens.weight.device)
        student.init_weights(seed)
        with torch.no_grad():
            fill_parameter(student.embed_tokens.weight, full_tensor(teacher.embed_tokens.weight))
            for boundary_norm in student.boundary_modules():  # entry and final norms alike
                fill_parameter(boundary_norm.weight, full_tensor(teacher.norm.weight))
            fill_parameter(student.lm_head.weight, full_tensor(teacher.head_weight))  # own copy, even if tied
            if output_gain == "teacher":
                start_outputs_at_teacher_gain(student, teacher.norm.weight)
        return student

    @classmethod
    def from_scratch(cls, config: ModelConfig, blocks: int, layers_per_block: int, norm: str, seed: int,
                     dtype=torch.float32, shard_fn: Callable | None = None, device="cpu",
                     boundary: str = "none", boundary_scale: float = 1.0, features: tuple = ()) -> "Student":
        """No teacher: every weight from `seed` (Qwen3's init: Linear and embedding ~ N(0, std), norms 1),
        the decoder layers exactly as from_teacher draws them; the embedding trains."""
        build = lambda: cls(config, blocks, layers_per_block, norm, boundary, boundary_scale, features).to(dtype)
        student = built_on_meta(build, shard_fn)
        student.to_empty(device=device)
        student.init_weights(seed)
        generator = torch.Generator().manual_seed(seed + 1)  # the layers' own draws stay from_teacher's
        with torch.no_grad():
            for module in (student.embed_tokens, student.lm_head, *student.boundary_modules()):
                init_qwen3_weights(module, config.initializer_range, generator)
        student.embed_tokens.weight.requires_grad_(True)
        return student

    def forward(self, input_ids, active_blocks: int | None = None, skip_block: int | None = None,
                output_fn: Callable = logits_output, return_boundaries: bool = False,
                doc_lengths: tuple[int, ...] | None = None):
        """Run blocks 0..active_blocks-1 (default: all), bypassing `skip_block` entirely (its norms
        too), on padded rows (B, T) or documents of `doc_lengths` packed in one row (1, N). With
        return_boundaries, also returns the residual stream at every block boundary: [input of block 0,
        output of block 0, ..., output of the last active block]; a skipped block's output equals its input."""
        active_blocks = self.blocks if active_blocks is None else active_blocks
        if not 1 <= active_blocks <= self.blocks:
            raise ValueError(f"active_blocks={active_blocks} must be in 1..{self.blocks}")
        profile = self.mirror_profile(input_ids, active_blocks, doc_lengths)
        h = self.embed_tokens(input_ids)                                         # (B, T, H)
        cos, sin = rope_cos_sin(self.config, input_ids.shape[1], input_ids.device, doc_lengths)
        set_documents(self, doc_lengths)
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
