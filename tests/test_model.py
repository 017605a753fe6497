"""model.py against transformers' Qwen3 (the reference) and against the paper's equations by hand."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import repro_cli

import model
from plumbing import errors
from plumbing.hf_qwen3 import EXPORT_MARKER, ModelConfig, export_hf

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]

# head_dim (24) differs from hidden/heads (16); 3 query heads share each of 2 KV heads... 6 heads / 2 kv.
TINY = dict(vocab_size=513, hidden_size=96, intermediate_size=160, num_hidden_layers=4,
            num_attention_heads=6, num_key_value_heads=2, head_dim=24, rope_theta=10000.0, rms_norm_eps=1e-6)


def hf_qwen3(tie: bool, layers: int = 4, seed: int = 0):
    """A random tiny transformers Qwen3 whose every tensor (norms included) is far from its init."""
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(**{**TINY, "num_hidden_layers": layers}, tie_word_embeddings=tie)
    hf = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return hf


def hf_logits(hf, ids, lengths=None):
    lengths = lengths or [ids.shape[1]] * ids.shape[0]
    with torch.no_grad():
        return [hf(ids[i:i + 1, :n]).logits[0] for i, n in enumerate(lengths)]


def assert_close_rel(ours, ref, rel=1e-5):
    scale = ref.abs().max()
    assert (ours - ref).abs().max() <= rel * scale, f"max abs diff {(ours - ref).abs().max():.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.parametrize("disk_dtype", [torch.float32, torch.bfloat16])
def test_teacher_matches_transformers(tmp_path, tie, shard, disk_dtype):
    hf = hf_qwen3(tie).to(disk_dtype)
    hf.save_pretrained(tmp_path, max_shard_size="40KB" if shard else "1GB")
    assert (tmp_path / "model.safetensors.index.json").is_file() == shard
    # The reference reads the same checkpoint, upcast to fp32 (a bf16 model's RoPE buffer is bf16).
    hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    teacher = model.load_qwen3(tmp_path)
    assert (teacher.lm_head is None) == tie
    # Right padding: the second row is a shorter document padded with token 0.
    ids = torch.randint(0, TINY["vocab_size"], (2, 13))
    lengths = [13, 8]
    ids[1, 8:] = 0
    with torch.no_grad():
        ours = teacher(ids)
    assert ours.shape == (2, 13, TINY["vocab_size"])
    for row, (n, ref) in enumerate(zip(lengths, hf_logits(hf, ids, lengths))):
        assert_close_rel(ours[row, :n], ref)


def copy_teacher_layers(student, teacher):
    with torch.no_grad():
        for s_layer, t_layer in zip(student.layers, teacher.layers):
            s_layer.load_state_dict(t_layer.state_dict())


def test_pre_norm_student_equals_truncated_transformers(tmp_path):
    hf = hf_qwen3(tie=False, layers=4)
    hf.save_pretrained(tmp_path)
    teacher = model.load_qwen3(tmp_path)
    student = model.Student.from_teacher(teacher, blocks=2, layers_per_block=1, norm="pre", seed=1)
    copy_teacher_layers(student, teacher)
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    for active in (1, 2):  # active_blocks=k is the teacher truncated to its first k layers
        hf_short = hf_qwen3(tie=False, layers=active)
        hf_short.load_state_dict({k: v for k, v in hf.state_dict().items()
                                  if not k.startswith("model.layers.") or int(k.split(".")[2]) < active})
        with torch.no_grad():
            assert_close_rel(student(ids, active_blocks=active), hf_short(ids).logits)


# ---- the paper's post-norm equations, written out here, sharing no code with model.py ----------

def ref_rmsnorm(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def ref_rope(x, theta):  # x: (T, heads, hd), rotate-half convention
    T, _, hd = x.shape
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.cat([pos * inv, pos * inv], dim=-1)[:, None, :]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * torch.cos(ang) + torch.cat([-x2, x1], dim=-1) * torch.sin(ang)


def ref_attention(h, p, heads, kv_heads, hd, theta):  # h: (T, H), float64, one sequence
    T = h.shape[0]
    q = ref_rmsnorm((h @ p["q"].T).view(T, heads, hd), p["qn"])
    k = ref_rmsnorm((h @ p["k"].T).view(T, kv_heads, hd), p["kn"])
    v = (h @ p["v"].T).view(T, kv_heads, hd)
    q, k = ref_rope(q, theta), ref_rope(k, theta)
    group = heads // kv_heads
    out = torch.empty(T, heads, hd, dtype=h.dtype)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for head in range(heads):
        scores = q[:, head] @ k[:, head // group].T / math.sqrt(hd)
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        out[:, head] = weights @ v[:, head // group]
    return out.reshape(T, heads * hd) @ p["o"].T


def ref_mlp(x, p):
    g = x @ p["gate"].T
    return (g * torch.sigmoid(g) * (x @ p["up"].T)) @ p["down"].T


def layer_params(layer):
    a, m = layer.self_attn, layer.mlp
    return {"q": a.q_proj.weight, "k": a.k_proj.weight, "v": a.v_proj.weight, "o": a.o_proj.weight,
            "qn": a.q_norm.weight, "kn": a.k_norm.weight, "gate": m.gate_proj.weight, "up": m.up_proj.weight,
            "down": m.down_proj.weight, "n1": layer.attn_norm.weight, "n2": layer.mlp_norm.weight}


def run_random_layer(norm: str, rows: int, length: int):
    """A float64 layer of the given placement with random weights (norms far from 1), run on random
    input. Returns (our output, input, the layer's weights by short name, config)."""
    config = ModelConfig(**{**TINY, "num_hidden_layers": 1})
    layer = model.DecoderLayer(config, norm=norm).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.ndim == 1 else 0.1 * torch.randn_like(p))
    h = torch.randn(rows, length, config.hidden_size, dtype=torch.float64)
    cos, sin = model.rope_cos_sin(config, length, "cpu")
    with torch.no_grad():
        ours = layer(h, cos.double(), sin.double())
    return ours, h, {k: v.detach() for k, v in layer_params(layer).items()}, config


def test_post_norm_layer_equals_paper_equations():
    ours, h, p, config = run_random_layer("post", rows=2, length=11)
    for row in range(2):
        x = h[row]
        u = ref_attention(x, p, 6, 2, 24, config.rope_theta) + x   # u = Attn(h) + h
        h1 = ref_rmsnorm(u, p["n1"])                                # h' = RMSNorm(u)
        v = ref_mlp(h1, p) + h1                                     # v = MLP(h') + h'
        expected = ref_rmsnorm(v, p["n2"])                          # h_out = RMSNorm(v)
        torch.testing.assert_close(ours[row], expected, rtol=1e-5, atol=2e-6)  # cos/sin are fp32


def test_pre_norm_layer_equals_paper_equations():
    ours, h, p, config = run_random_layer("pre", rows=1, length=7)
    x = h[0]
    h1 = ref_attention(ref_rmsnorm(x, p["n1"]), p, 6, 2, 24, config.rope_theta) + x   # h' = Attn(RMSNorm(h)) + h
    expected = ref_mlp(ref_rmsnorm(h1, p["n2"]), p) + h1                                # MLP(RMSNorm(h')) + h'
    torch.testing.assert_close(ours[0], expected, rtol=1e-5, atol=2e-6)


# ---- the student -------------------------------------------------------------------------------

@pytest.fixture
def teacher():
    t = model.Qwen3(ModelConfig(**TINY, tie_word_embeddings=True))
    t.init_weights(seed=3)
    with torch.no_grad():
        t.norm.weight.copy_(torch.rand_like(t.norm.weight) + 0.5)
    return t.eval()


def test_student_construction_from_tied_teacher(teacher):
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="post", seed=42)
    assert len(student.layers) == 6 and student.config.num_hidden_layers == 6
    assert torch.equal(student.embed_tokens.weight, teacher.embed_tokens.weight)
    assert not student.embed_tokens.weight.requires_grad and student.lm_head.weight.requires_grad
    # The head is a trained copy: equal values, separate storage, even though the teacher ties it.
    assert torch.equal(student.lm_head.weight, teacher.embed_tokens.weight)
    assert student.lm_head.weight.data_ptr() != student.embed_tokens.weight.data_ptr()
    assert torch.equal(student.norm.weight, teacher.norm.weight)
    # Qwen3 init: linear weights N(0, 0.02), every norm exactly 1.
    q = student.layers[4].self_attn.q_proj.weight
    assert abs(q.std().item() - 0.02) < 0.002 and abs(q.mean().item()) < 0.002
    assert torch.equal(student.layers[5].mlp_norm.weight, torch.ones(TINY["hidden_size"]))
    assert torch.equal(student.layers[5].self_attn.k_norm.weight, torch.ones(TINY["head_dim"]))


def test_students_of_one_seed_share_decoder_weights(teacher):
    post = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="post", seed=42)
    pre = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="pre", seed=42)
    other = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="pre", seed=43)
    pairs = list(zip(post.layers.parameters(), pre.layers.parameters(), other.layers.parameters()))
    assert all(torch.equal(a, b) for a, b, _ in pairs)
    assert not torch.equal(pairs[0][0], pairs[0][2])
    # Blocks are distinct draws, not copies of each other.
    assert not torch.equal(post.layers[0].mlp.up_proj.weight, post.layers[2].mlp.up_proj.weight)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_active_blocks_skip_and_boundaries_by_value(teacher, norm):
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm=norm, seed=0).eval()
    ids = torch.randint(0, TINY["vocab_size"], (2, 10))
    cos, sin = model.rope_cos_sin(student.config, 10, "cpu")

    def run(layers_to_apply):
        h = student.embed_tokens(ids)
        if norm == "post":
            h = student.norm(h)
        for i in layers_to_apply:
            h = student.layers[i](h, cos, sin)
        if norm == "pre":
            h = student.norm(h)
        return h @ student.lm_head.weight.T

    with torch.no_grad():
        torch.testing.assert_close(student(ids, active_blocks=1), run([0, 1]), rtol=0, atol=0)
        torch.testing.assert_close(student(ids, active_blocks=2), run([0, 1, 2, 3]), rtol=0, atol=0)
        torch.testing.assert_close(student(ids), run(range(6)), rtol=0, atol=0)
        torch.testing.assert_close(student(ids, skip_block=1), run([0, 1, 4, 5]), rtol=0, atol=0)
        torch.testing.assert_close(student(ids, active_blocks=2, skip_block=0), run([2, 3]), rtol=0, atol=0)
        logits, bounds = student(ids, return_boundaries=True)
        _, skipped = student(ids, skip_block=1, return_boundaries=True)
    assert len(bounds) == 4
    h = bounds[0]
    expected_entry = student.embed_tokens(ids)
    torch.testing.assert_close(h, student.norm(expected_entry) if norm == "post" else expected_entry)
    for b in range(3):
        for layer in student.block_layers(b):
            h = layer(h, cos, sin)
        torch.testing.assert_close(bounds[b + 1], h, rtol=0, atol=0)
    assert torch.equal(skipped[2], skipped[1]) and not torch.equal(bounds[2], bounds[1])
    with pytest.raises(ValueError, match="active_blocks"):
        student(ids, active_blocks=4)


def ref_post_student(student, ids, active_blocks, output_gains):
    """The post-norm student by the paper's equations in float64: entry RMSNorm, then per layer
    u = Attn(h) + h, h' = RMSNorm(u), v = MLP(h') + h', out = RMSNorm(v); the head reads the last
    block's output. output_gains[b] replaces the weight of block b's last RMSNorm."""
    h = student.embed_tokens.weight.detach()[ids[0]]
    h = ref_rmsnorm(h, student.norm.weight.detach())
    for b in range(active_blocks):
        layers = list(student.block_layers(b))
        for i, layer in enumerate(layers):
            p = {k: v.detach() for k, v in layer_params(layer).items()}
            u = ref_attention(h, p, 6, 2, 24, TINY["rope_theta"]) + h
            h1 = ref_rmsnorm(u, p["n1"])
            v = ref_mlp(h1, p) + h1
            h = ref_rmsnorm(v, output_gains[b] if i == len(layers) - 1 else p["n2"])
    return h @ student.lm_head.weight.detach().T


def test_post_norm_output_gain_from_teacher_by_value(teacher):
    teacher = teacher.double()
    g_T = teacher.norm.weight.detach().clone()
    assert not torch.allclose(g_T, torch.ones_like(g_T))
    student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="post", seed=0,
                                         dtype=torch.float64, output_gain="teacher").eval()
    ids = torch.randint(0, TINY["vocab_size"], (1, 9))
    # Tolerance 1e-6, not float64's: the model's RoPE tables are fp32 by design (as transformers').
    ones = torch.ones_like(g_T)
    with torch.no_grad():
        # A fresh student: the head reads block 0's output scaled by g_T, not by ones.
        torch.testing.assert_close(student(ids, active_blocks=1)[0], ref_post_student(student, ids, 1, [g_T] * 3),
                                   rtol=1e-6, atol=1e-6)
        # Block 0 trained (its weights and its last gain moved), block 1 appended: block 1's last norm
        # starts at g_T while block 0 keeps its trained gain.
        trained_gain = g_T * 0.5 + 0.7
        for p in student.block_layers(0).parameters():
            p.add_(0.01 * torch.randn_like(p))
        student.block_layers(0)[-1].mlp_norm.weight.copy_(trained_gain)
        torch.testing.assert_close(student(ids, active_blocks=2)[0],
                                   ref_post_student(student, ids, 2, [trained_gain, g_T, g_T]), rtol=1e-6, atol=1e-6)
        # The paper's init: ones.
        paper = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="post", seed=0,
                                           dtype=torch.float64).eval()
        torch.testing.assert_close(paper(ids, active_blocks=1)[0], ref_post_student(paper, ids, 1, [ones] * 3),
                                   rtol=1e-6, atol=1e-6)
    # Internal norms are untouched, and pre-norm students ignore the option.
    assert torch.equal(student.layers[2].mlp_norm.weight, ones) and torch.equal(student.layers[3].attn_norm.weight, ones)
    assert torch.equal(student.layers[5].mlp_norm.weight, g_T)
    pre = model.Student.from_teacher(teacher, blocks=3, layers_per_block=2, norm="pre", seed=0, output_gain="teacher")
    assert all(torch.equal(layer.mlp_norm.weight, torch.ones_like(g_T).float()) for layer in pre.layers)
    with pytest.raises(ValueError, match="output_gain"):
        model.Student.from_teacher(teacher, blocks=1, layers_per_block=1, norm="post", seed=0, output_gain="g")


def test_output_fn_receives_final_hidden_and_head(teacher):
    student = model.Student.from_teacher(teacher, blocks=2, layers_per_block=1, norm="pre", seed=0)
    ids = torch.randint(0, TINY["vocab_size"], (1, 5))
    hidden, weight = student(ids, output_fn=lambda h, w: (h, w))
    assert weight is student.lm_head.weight
    torch.testing.assert_close(hidden @ weight.T, student(ids))


def test_student_save_load_roundtrip(tmp_path, teacher):
    student = model.Student.from_teacher(teacher, blocks=2, layers_per_block=2, norm="post", seed=5)
    student.save(tmp_path / "ckpt")
    loaded = model.Student.load(tmp_path / "ckpt")
    assert loaded.norm_placement == "post" and loaded.blocks == 2 and loaded.layers_per_block == 2
    assert not loaded.embed_tokens.weight.requires_grad
    for (name, a), (_, b) in zip(student.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_exported_pre_norm_student_loads_in_transformers(tmp_path, teacher):
    student = model.Student.from_teacher(teacher, blocks=2, layers_per_block=2, norm="pre", seed=5)
    with torch.no_grad():
        student.lm_head.weight.add_(0.01)  # trained head differs from the (tied) embedding
    student.save(tmp_path / "student")
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), "export", str(tmp_path / "student"),
                          str(tmp_path / "hf")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.num_hidden_layers == 4 and not hf.config.tie_word_embeddings
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    with torch.no_grad():
        assert_close_rel(student(ids), hf(ids).logits)
    post = model.Student.from_teacher(teacher, blocks=2, layers_per_block=2, norm="post", seed=5)
    with pytest.raises(errors.CheckpointError, match="pre-norm"):
        export_hf(post, tmp_path / "nope")


# ---- bad input ---------------------------------------------------------------------------------

@pytest.fixture
def saved_teacher(tmp_path):
    hf_qwen3(tie=False).save_pretrained(tmp_path / "t")
    return tmp_path / "t"


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(errors.CheckpointError, match="no such checkpoint directory"):
        model.load_qwen3(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(errors.CheckpointError, match=r"config\.json: missing"):
        model.load_qwen3(tmp_path / "empty")


def test_other_architecture(saved_teacher):
    cfg = json.loads((saved_teacher / "config.json").read_text())
    (saved_teacher / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(errors.CheckpointError, match="model_type is 'llama'"):
        model.load_qwen3(saved_teacher)


def test_missing_and_misshapen_tensors(saved_teacher):
    from safetensors.torch import load_file, save_file
    file = saved_teacher / "model.safetensors"
    tensors = load_file(file)
    key = "model.layers.2.mlp.up_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != key}, file)
    with pytest.raises(errors.CheckpointError, match=rf"'{key}' is missing"):
        model.load_qwen3(saved_teacher)
    save_file({**tensors, key: tensors[key][:, :-1].contiguous()}, file)
    with pytest.raises(errors.CheckpointError, match=rf"model\.safetensors: tensor '{key}' has shape \(160, 95\)"):
        model.load_qwen3(saved_teacher)


def test_damaged_or_mismatched_checkpoints_are_refused_not_loaded(saved_teacher):
    from safetensors.torch import load_file, save_file
    file = saved_teacher / "model.safetensors"
    tensors = load_file(file)
    key = "model.layers.1.self_attn.q_proj.weight"
    cases = [
        ({**tensors, key: tensors[key].to(torch.int32)}, rf"tensor '{key}' is I32, not a floating-point type"),
        ({**tensors, key: tensors[key].clone().fill_(float("nan"))}, rf"tensor '{key}' holds NaN or infinite values"),
    ]
    for stored, message in cases:
        save_file(stored, file)
        with pytest.raises(errors.CheckpointError, match=message):
            model.load_qwen3(saved_teacher)
    # config.json describing fewer layers than the file holds would evaluate a truncated teacher.
    save_file(tensors, file)
    config = json.loads((saved_teacher / "config.json").read_text())
    (saved_teacher / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(errors.CheckpointError, match=r"holds \d+ tensor\(s\) that its config\.json does not describe "
                                                    r"\(first: 'model\.layers\.3\."):
        model.load_qwen3(saved_teacher)
    (saved_teacher / "config.json").write_text(json.dumps(config))
    # A pickle renamed to model.safetensors, and an index without a weight map.
    file.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    with pytest.raises(errors.CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        model.load_qwen3(saved_teacher)
    (saved_teacher / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(errors.CheckpointError, match=r"index\.json: not a safetensors index"):
        model.load_qwen3(saved_teacher)


@pytest.mark.slow
def test_cli_shows_checkpoint_errors_as_one_line(tmp_path):
    """As a user starts it: its own process, one line, no traceback."""
    (tmp_path / "s").mkdir()
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), "export", str(tmp_path / "s"), str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "config.json: missing" in lines[0] and "Traceback" not in out.stderr


def test_export_force_replaces_only_an_earlier_export(tmp_path, teacher):
    import hashlib
    student = model.Student.from_teacher(teacher, blocks=1, layers_per_block=1, norm="pre", seed=5)
    student.save(tmp_path / "runs" / "s42" / "pre-grow" / "phase-0")
    checkpoint = tmp_path / "runs" / "s42" / "pre-grow" / "phase-0"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own file")

    def tree_hash(folder):
        return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()

    def export(out, *extra):
        return repro_cli("export", checkpoint, out, *extra, check=False)

    before = {d: tree_hash(d) for d in (tmp_path / "runs", tmp_path / "mine")}
    for out, message in ((tmp_path / "runs", "is or holds the checkpoint"), (checkpoint, "is or holds the checkpoint"),
                         (tmp_path / "mine", "not a folder the kit exported")):
        result = export(out, "--force")
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and len(lines) == 1 and message in lines[0], result.stderr
    assert {d: tree_hash(d) for d in before} == before  # nothing the user had was changed
    assert export(tmp_path / "hf").returncode == 0
    assert "already exists" in export(tmp_path / "hf").stderr
    assert export(tmp_path / "hf", "--force").returncode == 0 and (tmp_path / "hf" / EXPORT_MARKER).is_file()
    assert transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "hf").config.num_hidden_layers == 1


def test_a_swap_killed_midway_does_not_block_later_saves(tmp_path, teacher):
    student = model.Student.from_teacher(teacher, blocks=1, layers_per_block=1, norm="pre", seed=5)
    student.save(tmp_path / "latest")
    (tmp_path / "latest.old").mkdir()  # what a kill between the two renames leaves behind
    (tmp_path / "latest.old" / "model.safetensors").write_bytes(b"stale")
    student.save(tmp_path / "latest")
    assert not (tmp_path / "latest.old").exists() and model.Student.load(tmp_path / "latest").blocks == 1
