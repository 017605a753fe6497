"""The norm placements beyond the paper's pre- and post-norm (model.py's), each a layer forward a model.PLACEMENTS
entry names (docs/method.md writes each one's equations and source out), and a post-norm student's block outputs
started at the teacher's final-norm gain (output_gain "teacher").

    h = hybrid_layer(layer, h, cos, sin)                 # one layer's forward
    layer.residual_scale = residual_scale(layer, depth)  # DeepNorm's alpha, 1 for every other placement
"""

import torch

from plumbing.devices import fill_parameter, full_tensor


def sandwich_layer(layer, h, cos, sin):
    """Sandwich-LN (Ding et al. 2021) and Peri-LN (Kim et al. 2025): each sub-layer's input and output normalised."""
    h = layer.attn_out_norm(layer.self_attn(layer.attn_norm(h), cos, sin)) + h
    return layer.mlp_out_norm(layer.mlp(layer.mlp_norm(h))) + h


def hybrid_layer(layer, h, cos, sin):
    """HybridNorm (Zhuo et al. 2025, the official code's dense config): y = h + Attn(h), q, k and v each normalised
    per head inside self_attn; then z = N(y) and z + FFN(z): the FFN's residual carries the normalised stream."""
    h = layer.self_attn(h, cos, sin) + h
    z = layer.mlp_norm(h)
    return layer.mlp(z) + z


def deepnorm_layer(layer, h, cos, sin):
    """DeepNorm (Wang et al. 2022, torchscale's decoder): x <- N(alpha x + f(x))."""
    h = layer.attn_norm(layer.residual_scale * h + layer.self_attn(h, cos, sin))
    return layer.mlp_norm(layer.residual_scale * h + layer.mlp(h))


def deepnet_alpha(layers: int) -> float:
    """DeepNet's decoder-only residual scale for N layers: (2N)^(1/4)."""
    return (2 * layers) ** 0.25


def deepnet_beta(layers: int) -> float:
    """DeepNet's decoder-only init gain for N layers, (8N)^(-1/4), on DEEPNET_SCALED (docs/method.md)."""
    return (8 * layers) ** -0.25


DEEPNET_SCALED = ("self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")


def residual_scale(layer, depth: int) -> float:
    """The weight of a layer's residual in a model of `depth` layers: DeepNet's alpha for a DeepNorm layer, else 1."""
    return deepnet_alpha(depth) if layer.placement.deepnet else 1.0


@torch.no_grad()
def scale_deepnet_init(layers, depth: int):
    """DeepNet's init, after the base one: DEEPNET_SCALED weights times beta at the model's final depth."""
    for layer in layers:
        if layer.placement.deepnet:
            for name in DEEPNET_SCALED:
                layer.get_submodule(name).weight.mul_(deepnet_beta(depth))


def start_outputs_at_teacher_gain(student, teacher_gain: torch.Tensor):
    """output_gain "teacher" (post-norm only; the paper's is "ones"): the last RMSNorm of every block starts from
    the teacher's final-norm gain g_T, so whichever block is the last active one, the head reads g_T-scaled
    states, as a pre-norm student's head does from step 0."""
    for b in range(student.blocks):
        if not student.placements[b].final_norm:  # post-norm-like: every such placement ends in mlp_norm
            fill_parameter(student.block_layers(b)[-1].mlp_norm.weight, full_tensor(teacher_gain))
