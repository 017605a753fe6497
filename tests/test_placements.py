"""Every norm placement against its equations written out by hand, sharing no code with model.py or
interventions/placements.py: each placement's layer, the student's entry and final norms (single placements
and per-block schedules), DeepNet's constants and init, and the straight-through boundary rescale.

The hand equations run in float64, but model.py's RMSNorm takes its statistics in fp32 (as transformers
does) and rope_cos_sin is fp32, so even a float64 model agrees with them only to fp32 rounding: the
tolerances below are a few hundred fp32 ulps, while every wrong equation (a norm misplaced, left out or
swapped for another, alpha missing) moves the output by O(1)."""
import math

import pytest
import torch

import model
from interventions import boundary, placements
from plumbing.hf_qwen3 import ModelConfig

CONFIG = ModelConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=4, rope_theta=10000.0,
                     rms_norm_eps=1e-6)
FP32_TOL = dict(rtol=2e-5, atol=2e-5)  # the fp32 rounding inside model.py's RMSNorm and RoPE tables
ENTRY = {"pre": False, "post": True, "sandwich": False, "peri": True, "hybrid": False, "hybrid-star": False,
         "hybrid-first": False, "deepnorm": True}
FINAL = {"pre": True, "post": False, "sandwich": True, "peri": True, "hybrid": True, "hybrid-star": True,
         "hybrid-first": True, "deepnorm": False}
V_NORM = ("hybrid", "hybrid-star", "hybrid-first")  # HybridNorm normalises q, k and v per head
FIRST_LAYER = {"hybrid-star": "hybrid-first"}       # HybridNorm*: the model's first layer is pre-norm


# ---- the equations, by hand ----------------------------------------------------------------------

def rmsnorm(x, g):
    return g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + CONFIG.rms_norm_eps)


def rope(x):
    """Rotate-half RoPE on x: (B, T, heads, hd)."""
    T, hd = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / CONFIG.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq        # (T, hd/2)
    angle = torch.cat([angle, angle], dim=-1)[:, None, :]                    # (T, 1, hd)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * angle.cos() + torch.cat([-x2, x1], dim=-1) * angle.sin()


def attention(x, w, v_norm: bool):
    """Causal GQA with Qwen3's per-head q/k RMSNorm (and HybridNorm's on v when v_norm)."""
    B, T, _ = x.shape
    nh, nkv, hd = CONFIG.num_attention_heads, CONFIG.num_key_value_heads, CONFIG.head_dim
    q = rmsnorm((x @ w["q_proj"].T).view(B, T, nh, hd), w["q_norm"])
    k = rmsnorm((x @ w["k_proj"].T).view(B, T, nkv, hd), w["k_norm"])
    v = (x @ w["v_proj"].T).view(B, T, nkv, hd)
    if v_norm:
        v = rmsnorm(v, w["v_norm"])
    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(nh // nkv, dim=2), v.repeat_interleave(nh // nkv, dim=2)  # kv head j serves q heads
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    y = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, T, nh * hd)
    return y @ w["o_proj"].T


def mlp(x, w):
    gate = x @ w["gate_proj"].T
    return (gate * torch.sigmoid(gate) * (x @ w["up_proj"].T)) @ w["down_proj"].T


def hand_layer(norm: str, x, w, alpha: float):
    """One decoder layer of placement `norm` by its equations; w: the layer's tensors by short name."""
    def attn(y):
        return attention(y, w, v_norm=norm in V_NORM)

    def n(name, y):
        return rmsnorm(y, w[name])

    if norm in ("pre", "hybrid-first"):  # hybrid-first: pre-norm with q/k/v norms (HybridNorm*'s layer 0)
        h = x + attn(n("attn_norm", x))
        return h + mlp(n("mlp_norm", h), w)
    if norm == "post":
        h = n("attn_norm", x + attn(x))
        return n("mlp_norm", h + mlp(h, w))
    if norm in ("sandwich", "peri"):
        h = x + n("attn_out_norm", attn(n("attn_norm", x)))
        return h + n("mlp_out_norm", mlp(n("mlp_norm", h), w))
    if norm in ("hybrid", "hybrid-star"):
        # Zhuo et al. 2025, the official code (BryceZhuo/HybridNorm, dense_model/olmo/model.py,
        # OLMoSequentialBlock with attn_norm false, ffn_norm true, ffn_residual_after_norm true):
        # Y = x + Attn_QKVnorm(x); out = N(Y) + FFN(N(Y)).
        y = x + attn(x)
        z = n("mlp_norm", y)
        return z + mlp(z, w)
    if norm == "deepnorm":
        h = n("attn_norm", alpha * x + attn(x))
        return n("mlp_norm", alpha * h + mlp(h, w))
    raise AssertionError(f"no hand equations for placement {norm!r}")


def tensors(layer):
    """The layer's tensors by their last name ("q_proj", "q_norm", "attn_norm", ...)."""
    return {name.split(".")[-2]: t for name, t in layer.state_dict().items()}


def randomise(module, seed: int):
    """Every parameter far from its init: matrices ~ 0.3 N(0, 1), RMSNorm gains in [0.5, 1.5)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim > 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen, dtype=torch.float64))
    return module


def rope_tables(T: int):
    cos, sin = model.rope_cos_sin(CONFIG, T, "cpu")
    return cos.double(), sin.double()


def token_rms(x):
    return x.double().pow(2).mean(-1).sqrt()


# ---- 1. each placement's layer -------------------------------------------------------------------

def test_every_placement_has_hand_equations():
    """A placement added to model.PLACEMENTS without equations here would go untested."""
    assert set(model.PLACEMENTS) == set(ENTRY) == set(FINAL)


@pytest.mark.parametrize("norm", list(model.PLACEMENTS))
def test_layer_equals_its_equations_by_hand(norm):
    """layer(h) equals the placement's equations for random weights (every norm gain far from 1) and
    an input of RMS ~3. residual_scale is 1.7 on every layer: DeepNorm must use it as alpha, the
    others must ignore it."""
    layer = randomise(model.DecoderLayer(CONFIG, norm).double(), seed=1)
    layer.residual_scale = 1.7
    h = 3.0 * torch.randn(2, 5, CONFIG.hidden_size, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        ours = layer(h, *rope_tables(5))
    expected = hand_layer(norm, h, tensors(layer), alpha=1.7)
    assert ours.dtype == torch.float64 and ours.shape == h.shape
    torch.testing.assert_close(ours, expected, **FP32_TOL)


def test_hybrid_owns_a_value_norm_and_only_the_mlp_norm():
    """HybridNorm's attention normalises v per head (head_dim), and the layer owns no other norm than
    the FFN's post-norm; the other placements have no v_norm."""
    shapes = {name: tuple(t.shape) for name, t in tensors(model.DecoderLayer(CONFIG, "hybrid")).items()}
    assert shapes["v_norm"] == (CONFIG.head_dim,) and shapes["mlp_norm"] == (CONFIG.hidden_size,)
    assert not {"attn_norm", "attn_out_norm", "mlp_out_norm"} & set(shapes)
    for norm in set(model.PLACEMENTS) - set(V_NORM):
        assert "v_norm" not in tensors(model.DecoderLayer(CONFIG, norm))


def test_hybridnorm_star_makes_only_the_models_first_layer_pre_norm(teacher):
    """HybridNorm* (the official code's norm_pos_special_config {0: {attn_norm: True, ffn_residual: False}}):
    layer 0 of the whole model is pre-norm with the q/k/v norms; every later layer, in block 0 too, is
    HybridNorm."""
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="hybrid-star", seed=0)
    owned = [set(tensors(layer)) for layer in student.layers]
    assert {"attn_norm", "mlp_norm", "v_norm"} <= owned[0]
    assert all("attn_norm" not in names and {"mlp_norm", "v_norm"} <= names for names in owned[1:])


# ---- 2. the student's entry and final norms ------------------------------------------------------

@pytest.fixture(scope="module")
def teacher():
    t = model.Qwen3(CONFIG)
    t.init_weights(0)
    return t.eval()


def random_student(teacher, norm: str, **kwargs):
    """A float64 3-block, 1-layer-per-block student with every parameter (entry, final and layer norms
    included, each drawn apart) randomised."""
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=1, norm=norm, seed=0, **kwargs)
    return randomise(student.double(), seed=3).eval()


def hand_student(student, ids, names, active: int, entry, final):
    """Embedding rows, the entry norm (gain `entry`, or None), the first `active` layers by their
    placements' equations, the final norm (gain `final`, or None), the head."""
    h = student.embed_tokens.weight.detach()[ids]
    if entry is not None:
        h = rmsnorm(h, entry.detach())
    for layer, name in zip(list(student.layers)[:active], names):
        h = hand_layer(name, h, tensors(layer), alpha=layer.residual_scale)
    if final is not None:
        h = rmsnorm(h, final.detach())
    return h @ student.lm_head.weight.detach().T


IDS = torch.randint(0, CONFIG.vocab_size, (2, 6), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("norm", list(model.PLACEMENTS))
def test_student_entry_and_final_norms_by_hand(teacher, norm):
    """Entry norm on the embeddings for post/peri/hybrid/deepnorm only, final norm before the head for
    pre/sandwich/peri only, at every active_blocks. A student with one of the two norms keeps it in
    `student.norm`; Peri-LN needs both, so its entry norm is the separate `student.entry_norm`."""
    student = random_student(teacher, norm)
    both = ENTRY[norm] and FINAL[norm]
    assert (student.entry_norm is not None) == both
    entry = (student.entry_norm if both else student.norm).weight if ENTRY[norm] else None
    final = student.norm.weight if FINAL[norm] else None
    for active in (1, 2, 3):
        with torch.no_grad():
            ours = student(IDS, active_blocks=active)
        names = [FIRST_LAYER.get(norm, norm)] + [norm] * 2
        expected = hand_student(student, IDS, names, active, entry, final)
        torch.testing.assert_close(ours, expected, **FP32_TOL)


def test_schedule_pre_post_post_by_hand(teacher):
    """Schedule "pre,post,post": block 0 a pre layer, blocks 1-2 post layers; block 0 is pre, so no entry norm;
    the final norm only when the last active block is the pre one (active_blocks=1)."""
    student = random_student(teacher, "pre,post,post")
    assert student.entry_norm is None
    names = ["pre", "post", "post"]
    for active, final in ((1, student.norm.weight), (2, None), (3, None)):
        with torch.no_grad():
            ours = student(IDS, active_blocks=active)
        torch.testing.assert_close(ours, hand_student(student, IDS, names, active, None, final), **FP32_TOL)


def test_schedule_post_pre_pre_by_hand(teacher):
    """Schedule "post,pre,pre": block 0 is post, so the embeddings are normalised by the separate
    `student.entry_norm`; the final norm `student.norm` when a pre block is last (active 2 and 3), not
    after the post block alone (active 1)."""
    student = random_student(teacher, "post,pre,pre")
    assert student.entry_norm is not None and student.entry_norm is not student.norm
    assert not torch.equal(student.entry_norm.weight, student.norm.weight)
    names = ["post", "pre", "pre"]
    entry = student.entry_norm.weight
    for active, final in ((1, None), (2, student.norm.weight), (3, student.norm.weight)):
        with torch.no_grad():
            ours = student(IDS, active_blocks=active)
        torch.testing.assert_close(ours, hand_student(student, IDS, names, active, entry, final), **FP32_TOL)


# ---- 3. DeepNorm's constants and init ------------------------------------------------------------

@pytest.mark.parametrize("n", [3, 9, 18])
def test_deepnet_constants_are_the_decoder_only_formulas(n):
    """DeepNet (Wang et al. 2022; torchscale decoder.py), decoder-only: alpha = (2N)^(1/4), beta = (8N)^(-1/4)."""
    assert placements.deepnet_alpha(n) == pytest.approx((2 * n) ** (1 / 4), rel=1e-12)
    assert placements.deepnet_beta(n) == pytest.approx((8 * n) ** (-1 / 4), rel=1e-12)


def test_deepnet_constants_for_18_layers_in_closed_form():
    """N = 18: alpha = 36^(1/4) = sqrt(6), beta = 144^(-1/4) = 1/sqrt(12), independent of any power."""
    assert placements.deepnet_alpha(18) == pytest.approx(math.sqrt(6), rel=1e-12)
    assert placements.deepnet_beta(18) == pytest.approx(1 / math.sqrt(12), rel=1e-12)


def test_deepnorm_student_alpha_and_beta_init(teacher):
    """A 3x3 DeepNorm student: every layer's residual scale is alpha for N = 9 layers (the final depth), and
    the weights DeepNet's reference code scales are beta times those of a post-norm student of the same
    seed (the same draws). microsoft/torchscale divides, after the base init, every parameter whose name
    holds fc1, fc2, out_proj or v_proj by (8N)^(1/4) (architecture/decoder.py, and architecture/retnet.py
    for its gated FFN component/gate_linear_unit.py: out = fc2(act(fc1(x)) * gate(x))): our v_proj,
    o_proj, gate_proj (fc1, the activated one) and down_proj (fc2); not q, k, nor up_proj (`gate`)."""
    deep = model.Student.from_teacher(teacher, blocks=3, layers_per_block=3, norm="deepnorm", seed=0)
    post = model.Student.from_teacher(teacher, blocks=3, layers_per_block=3, norm="post", seed=0)
    alpha, beta = (2 * 9) ** 0.25, (8 * 9) ** -0.25
    assert len(deep.layers) == 9
    for d, p in zip(deep.layers, post.layers):
        assert d.residual_scale == pytest.approx(alpha, rel=1e-12) and p.residual_scale == 1.0
        dw, pw = tensors(d), tensors(p)
        for name in ("v_proj", "o_proj", "gate_proj", "down_proj"):
            torch.testing.assert_close(dw[name], beta * pw[name], rtol=1e-6, atol=0)
        for name in ("q_proj", "k_proj", "up_proj"):
            assert torch.equal(dw[name], pw[name])


# ---- 4. the straight-through rescale at block boundaries ----------------------------------------

def test_rescale_forward_sets_per_token_rms_and_keeps_direction():
    """Forward: every token's RMS becomes the target (a number, or one per token as (B, T, 1)), its
    direction unchanged."""
    gen = torch.Generator().manual_seed(5)
    h = 3.0 * torch.randn(2, 5, 16, generator=gen)
    per_token = 0.5 + torch.rand(2, 5, 1, generator=gen)
    for target, expected_rms in ((2.5, torch.full((2, 5), 2.5)), (per_token, per_token[..., 0])):
        out = boundary.rescale(h, target, "identity")
        assert out.shape == h.shape
        torch.testing.assert_close(token_rms(out), expected_rms.double(), rtol=1e-5, atol=0)
        torch.testing.assert_close(out / token_rms(out)[..., None], h / token_rms(h)[..., None], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(token_rms(h), torch.full((2, 5), 2.5, dtype=torch.float64), rtol=0.1)


def test_rescale_backward_is_the_identity():
    """Backward: the gradient reaching h is the upstream gradient itself, bit for bit, though the
    forward scaled h (the identity's gradient, not the rescale's)."""
    gen = torch.Generator().manual_seed(6)
    h = (3.0 * torch.randn(2, 5, 16, generator=gen)).requires_grad_(True)
    g = torch.randn(2, 5, 16, generator=gen)
    for target in (2.5, 0.5 + torch.rand(2, 5, 1, generator=gen)):
        (grad,) = torch.autograd.grad(boundary.rescale(h, target, "identity"), h, g)
        assert torch.equal(grad, g)


def block_inputs(student, ids):
    """The stream entering the first layer of each block (after any boundary intervention), and the
    returned boundaries ([input of block 0, output of block 0, ...])."""
    seen = {}
    hooks = [student.block_layers(b)[0].register_forward_pre_hook(lambda _, args, b=b: seen.__setitem__(b, args[0]))
             for b in range(student.blocks)]
    try:
        with torch.no_grad():
            _, boundaries = student(ids, return_boundaries=True)
    finally:
        for hook in hooks:
            hook.remove()
    return seen, boundaries


def test_rescale_fwd_student_enters_blocks_1_and_2_at_unit_rms(teacher):
    """boundary="rescale-fwd", scale 1: blocks 1 and 2 receive the previous block's output rescaled to
    unit RMS per token (same direction); block 0 receives the untouched embeddings."""
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=1, norm="pre", seed=0,
                                         boundary="rescale-fwd", boundary_scale=1.0)
    randomise(student.layers, seed=8)  # block outputs far from unit RMS, so the rescale has work to do
    seen, boundaries = block_inputs(student.eval(), IDS)
    assert torch.equal(seen[0], student.embed_tokens.weight[IDS])
    for b in (1, 2):
        previous = boundaries[b]  # the output of block b - 1, before the rescale
        assert (token_rms(previous) - 1).abs().max() > 0.5
        torch.testing.assert_close(token_rms(seen[b]), torch.ones(IDS.shape, dtype=torch.float64), rtol=0, atol=1e-5)
        torch.testing.assert_close(seen[b], previous / token_rms(previous)[..., None].float(), rtol=1e-5, atol=1e-6)


def test_norm_boundary_student_normalises_each_block_input_by_hand(teacher):
    """boundary="norm": one RMSNorm per boundary (blocks - 1), and block b >= 1 receives
    RMSNorm_b(output of block b - 1) with that boundary's own (here random) gain; block 0 the
    embeddings."""
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=1, norm="pre", seed=0,
                                         boundary="norm").eval()
    assert len(student.boundary_norms) == 2
    assert all(tuple(n.weight.shape) == (CONFIG.hidden_size,) for n in student.boundary_norms)
    randomise(student.boundary_norms, seed=7)
    seen, boundaries = block_inputs(student, IDS)
    assert torch.equal(seen[0], student.embed_tokens.weight[IDS])
    for b in (1, 2):
        gain = student.boundary_norms[b - 1].weight.detach().double()
        expected = rmsnorm(boundaries[b].double(), gain)
        torch.testing.assert_close(seen[b].double(), expected, **FP32_TOL)
        other = rmsnorm(boundaries[b].double(), student.boundary_norms[2 - b].weight.detach().double())
        assert not torch.allclose(seen[b].double(), other, **FP32_TOL)  # each boundary has its own gain


# ---- 5. the tests above catch a wrong placement ---------------------------------------------------

MUTATIONS = {  # a deliberately broken model.py or interventions/placements.py: each must fail the equations above
    "HybridNorm as the kit once had it: y = N(h + FFN(h))": (
        "interventions/placements.py", "    z = layer.mlp_norm(h)\n    return layer.mlp(z) + z",
        "    return layer.mlp_norm(layer.mlp(h) + h)"),
    "HybridNorm with an entry norm": ("model.py", '"hybrid": Placement(hybrid_layer, entry_norm=False',
                                      '"hybrid": Placement(hybrid_layer, entry_norm=True'),
    "HybridNorm* without its pre-norm first layer": (
        "model.py", "layer_names[0] = placement(layer_names[0]).first_layer or layer_names[0]", "pass"),
    "DeepNorm's beta on up_proj too": ("interventions/placements.py", '"mlp.gate_proj", "mlp.down_proj")',
                                       '"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")'),
}


@pytest.mark.slow
@pytest.mark.parametrize("broken", list(MUTATIONS))
def test_a_deliberately_broken_model_fails_these_tests(broken, tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    for path in root.glob("*.py"):
        shutil.copy(path, tmp_path)
    for init in root.glob("*/__init__.py"):  # the kit's folders (plumbing, interventions, ...)
        shutil.copytree(init.parent, tmp_path / init.parent.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "pytest.ini", tmp_path)
    file, old, new = MUTATIONS[broken]
    source = (tmp_path / file).read_text()
    assert source.count(old) == 1, broken
    (tmp_path / file).write_text(source.replace(old, new))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
                          "tests/test_placements.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and " failed" in out.stdout, out.stdout[-2000:]


def test_the_three_rescales_share_a_forward_and_differ_only_in_backward():
    """rescale-fwd (straight-through), -detached and -full give the same forward (each token at RMS t);
    the detached one's gradient is the upstream gradient times the per-token factor t / r; the full one's
    is the true Jacobian (t / r)(I - h^ h^T), h^ = h / |h|, which drops the radial part."""
    gen = torch.Generator().manual_seed(11)
    h0 = 3.0 * torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    upstream = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    t = 1.7
    outs, grads = {}, {}
    for backward in ("identity", "detached", "full"):
        h = h0.clone().requires_grad_(True)
        outs[backward] = boundary.rescale(h, t, backward)
        (outs[backward] * upstream).sum().backward()
        grads[backward] = h.grad
    assert torch.equal(outs["detached"], outs["identity"]) and torch.equal(outs["full"], outs["identity"])
    # The rescale computes in fp32 (as the stream does under autocast): gradients agree to fp32 rounding.
    r = token_rms(h0)[..., None]
    assert torch.equal(grads["identity"], upstream)
    torch.testing.assert_close(grads["detached"], upstream * t / r, **FP32_TOL)
    unit = h0 / h0.norm(dim=-1, keepdim=True)
    expected = t / r * (upstream - unit * (unit * upstream).sum(-1, keepdim=True))
    torch.testing.assert_close(grads["full"], expected, **FP32_TOL)
    assert (grads["full"] * unit).sum(-1).abs().max() < 1e-5  # no radial part (up to fp32 rounding)
    assert (grads["detached"] * unit).sum(-1).abs().max() > 0.1  # which the detached one keeps


@pytest.mark.parametrize("kind", ["dose-boundary", "dose-channel"])
def test_the_synthetic_dose_puts_the_declared_ratio_at_each_appended_blocks_input(teacher, kind):
    """At the input of every block after the first the boundary token carries the dose: its RMS 37 x the
    median RMS of the other positions, or its channel 0 at 1000 x the row's median |activation|; block 0's
    input is untouched, and so are the other positions; the gradient passes as the identity."""
    ratio = 37.0 if kind == "dose-boundary" else 1000.0
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=1, norm="post", seed=0,
                                         boundary=kind, boundary_scale=ratio).double()
    seen = {}
    for i, layer in enumerate(student.layers):
        layer.register_forward_pre_hook(lambda module, args, i=i: seen.__setitem__(i, args[0].detach().clone()))
    with torch.no_grad():
        student(IDS)
    plain = model.Student.from_teacher(teacher, blocks=3, layers_per_block=1, norm="post", seed=0).double()
    plain_seen = {}
    for i, layer in enumerate(plain.layers):
        layer.register_forward_pre_hook(lambda module, args, i=i: plain_seen.__setitem__(i, args[0].detach().clone()))
    with torch.no_grad():
        plain(IDS)
    assert torch.equal(seen[0], plain_seen[0])
    for b in (1, 2):
        h = seen[b]
        if kind == "dose-boundary":
            rms = token_rms(h)
            torch.testing.assert_close(rms[:, 0] / rms[:, 1:].median(dim=1).values,
                                       torch.full((IDS.shape[0],), ratio, dtype=torch.float64), rtol=1e-5, atol=0)
        else:
            median = h.abs().flatten(1).median(dim=1).values  # after the dose: one value moved, by a rank or so
            assert ((h[:, 0, 0] / median - ratio).abs() < 0.1 * ratio).all()
    x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64, requires_grad=True)
    y = boundary.dose(x, ratio, kind)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # forward only: the identity backward
    assert torch.equal(y[:, 1:], x[:, 1:])          # only the boundary token changes
    if kind == "dose-channel":  # exactly the declared multiple of the row's median |activation| before the dose
        torch.testing.assert_close(y[:, 0, 0], ratio * x.detach().abs().flatten(1).median(dim=1).values, **FP32_TOL)
        assert torch.equal(y[:, 0, 1:], x[:, 0, 1:])
