"""Per-GPU memory of one training step, counted tensor by tensor from the shapes (the dry run's estimate).

It counts what one rank holds in grow's heaviest step (every block active and trained, the head and the boundary norm
trained, the embedding frozen; post-norm layers, the stepping run's own entry and final norms under activation
checkpointing) under devices.shard_fn with bf16 autocast and an fp32 residual stream: each student's weights and AdamW
moments, the teacher in the compute dtype, the gradients accumulated over the step's micro-batches, one micro-batch's
saved activations and the chunked loss's buffers at its softmax, in the worst step a rank can be given: every document
of the step of the full length, so that every micro-batch holds a full token budget (micro_batch x max_len: packed end
to end where the runs pack, data.token_micro_batches; rows where they do not) and a rank holds the most micro-batches
the placement ever gives it (global_batch / world / micro_batch). The loss selects the real targets by the batch's mask
(kd._real_tokens), a copy of the teacher's states. Attention is a GPU's: its output saved in the layout o_proj reads
(varlen_attn's for a packed row). The step's largest moment is the peak: inside the loss of its last micro-batch (on top
of the gradients accumulated over the others), inside the loss of its first, or, under activation checkpointing, the
first micro-batch's backward entering layer 0. Nothing is fitted; rehearse.py measures the same step through the kit's
own code with FSDP2's memory tracker, and memcount.py counts every storage it holds (tests/test_cluster.py and
tests/test_memcount.py hold the three together). Without activation checkpointing a pre-norm layer is counted as a
post-norm one (an upper bound: two fp32 stream tensors above what it holds, by memcount.py). CUDA's context, NCCL's
buffers and the allocator's fragmentation are not counted (lockstep_plan.MEMORY_HEADROOM leaves room for them).
"""
import math

import config
import kd
import model
from plumbing.hf_qwen3 import ModelConfig

F32, BF16 = 4, 2


def layer_shapes(c: ModelConfig) -> list[tuple[int, ...]]:
    """A decoder layer's parameters (every placement has two hidden-size RMSNorms)."""
    H, q, kv, F = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, \
        c.intermediate_size
    return [(q, H), (kv, H), (kv, H), (H, q),  # q, k, v, o projections
            (c.head_dim,), (c.head_dim,),      # q_norm, k_norm
            (F, H), (F, H), (H, F),            # gate, up, down
            (H,), (H,)]                        # the layer's two norms


def layer_parameters(c: ModelConfig) -> int:
    return sum(math.prod(shape) for shape in layer_shapes(c))


def shard_numel(shape, shard: int) -> int:
    """Elements of rank 0's FSDP2 shard (dim 0 split in ceil(d0 / shard) rows; rank 0's is never short)."""
    return math.ceil(shape[0] / shard) * math.prod(shape[1:])


def saved_per_token(c: ModelConfig) -> int:
    """Bytes per token that autograd saves for one post-norm layer under bf16 autocast with an fp32
    residual stream (model.post_norm_layer, Attention, MLP, RMSNorm)."""
    H, F, nh, nkv = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads
    q, kv = nh * c.head_dim, nkv * c.head_dim
    return (3 * BF16 * H                 # the fp32 stream cast to bf16 for q_proj, k_proj and v_proj
            + (F32 + BF16) * (q + kv)    # q_norm, k_norm: their fp32 input and bf16 output
            + F32 * (nh + nkv)           # their rsqrt, per head
            + BF16 * (q + kv)            # q and k after RoPE
            + BF16 * kv                  # v
            + BF16 * q + F32 * nh        # attention's output and its logsumexp
            + 2 * F32 * H                # the two residual sums, fp32
            + 2 * F32 * H + 2 * F32      # the two norms' x * rsqrt and rsqrt
            + 2 * BF16 * H               # the MLP norm's output cast to bf16 for gate_proj and up_proj
            + 4 * BF16 * F)              # gate, up, silu(gate), silu(gate) * up


class Dims:
    """What a step's tensors are made of, on rank 0 of `gpus` x `nodes` (several: HSDP, sharded within a node)."""

    def __init__(self, preset, c: ModelConfig, gpus: int, nodes: int):
        self.preset, self.c, run = preset, c, preset.run
        self.fsdp = gpus * nodes > 1
        self.shard = gpus if self.fsdp else 1
        self.bf16 = run["precision"] in ("bf16", "auto")
        self.act = BF16 if self.bf16 else F32
        self.checkpointing = bool(run.get("activation_checkpointing"))
        self.V, self.H, self.T = c.vocab_size, c.hidden_size, preset.data["max_len"]
        self.L = run["layers_per_block"]
        self.layers = run["blocks"] * self.L
        layer = layer_shapes(c)
        self.tensors_per_layer = len(layer)
        self.P = layer_parameters(c)
        self.P_shard = sum(shard_numel(s, self.shard) for s in layer)
        self.matrices = sum(math.prod(s) for s in layer if len(s) == 2)
        self.root = [(self.V, self.H), (self.H,), (self.V, self.H)]  # embedding (frozen), boundary norm, head
        self.root_trained = [(self.H,), (self.V, self.H)]
        self.micro_per_step = run["global_batch"] // (gpus * nodes) // run["micro_batch"]
        self.N = run["micro_batch"] * self.T  # tokens of a micro-batch: a full budget of full-length documents
        # RoPE's cos and sin are made for every token of a packed row (positions restart at each document),
        # for one row's width where documents are padded rows
        self.rope = self.N if run_settings(preset).packs else self.T

    def trained_layers(self, ph) -> int:
        return len(ph.trainable_blocks) * self.L


def held(d: Dims, residents: list, replicate_teacher: bool) -> dict:
    """Held through the whole step: every resident student's fp32 weights and AdamW moments (its phase's trained parameters:
    exp_avg, exp_avg_sq and a step counter each), the teacher in the compute dtype, the stepping student's root gathered
    (FSDP2), and, with other runs resident, the teacher's hidden states of the step's other micro-batches (grow.lockstep_step
    keeps them for the group's other runs; the current one is the loss's)."""
    weights = F32 * (d.layers * d.P_shard + sum(shard_numel(s, d.shard) for s in d.root))

    def moments(ph) -> int:
        trained = d.trained_layers(ph) * d.P_shard + sum(shard_numel(s, d.shard) for s in d.root_trained) \
            * ph.trains_head
        return 2 * F32 * trained + F32 * (d.trained_layers(ph) * d.tensors_per_layer
                                          + len(d.root_trained) * ph.trains_head)
    teacher_layers = d.c.num_hidden_layers * sum(math.prod(s) if replicate_teacher else shard_numel(s, d.shard)
                                                 for s in layer_shapes(d.c))
    teacher_root = d.V * d.H + d.H + (0 if d.c.tie_word_embeddings else d.V * d.H)  # whole on every rank
    out = {"student weights (fp32)": weights, "AdamW moments (fp32)": moments(residents[0]),
           "teacher weights": d.act * (teacher_layers + teacher_root),
           "other students' weights and moments": sum(weights + moments(ph) for ph in residents[1:])}
    if len(residents) > 1:
        out["teacher hidden states kept for the step"] = (d.micro_per_step - 1) * d.act * d.N * d.H
    if d.fsdp:  # the root (fp32) stays gathered from its forward through its backward
        out["student root gathered (fp32 embedding, norm, head)"] = F32 * sum(math.prod(s) for s in d.root)
    return out


def gradients(d: Dims, ph, layers_done: int) -> dict:
    """Gradients held during a micro-batch after `layers_done` trained layers' backward. FSDP2 without
    gradient sync (every micro-batch but the last) keeps each trained layer's gradient unsharded in fp32,
    and the root's; one GPU keeps param.grad in fp32."""
    if not layers_done:
        return {}
    root = sum(math.prod(s) for s in d.root_trained) * ph.trains_head
    if d.fsdp:
        return {"accumulated gradients (fp32, unsharded)": F32 * (min(layers_done, d.trained_layers(ph)) * d.P + root)}
    return {"accumulated gradients (fp32)": F32 * (d.trained_layers(ph) * d.P + root)}


def loss_stream(preset, norm: str, ph) -> int:
    """fp32 (tokens x hidden) stream tensors a checkpointed student of placement `norm` (or a schedule)
    holds at its loss besides each active layer's input: the last layer's output; an entry norm's
    normalized x (kept for its weight's gradient; the frozen embedding's output is freed); a final norm's
    normalized x and its output, which the forward holds while the loss runs. Post-norm 2, pre-norm 3."""
    names = model.block_norms(norm, preset.run["blocks"])
    entry, final = model.placement(names[0]).entry_norm, model.placement(names[ph.active_blocks - 1]).final_norm
    return 1 + entry + 2 * final


def in_the_loss(d: Dims, ph, after_others: bool, norm: str = "post") -> dict:
    """Inside the chunked loss of the stepping run's first micro-batch, or of its last (on top of the
    gradients accumulated over the others)."""
    run, active = d.preset.run, ph.active_blocks * d.L
    chunk = min(run["loss_chunk"], d.N)
    rows = max(1, kd.ROW_BLOCK_ELEMENTS["cuda"] // d.V)  # rows of the softmax computed at once on a GPU
    blocks = [min(rows, min(start + chunk, d.N) - start - b) for start in range(0, d.N, chunk)
              for b in range(0, min(chunk, d.N - start), rows)]
    # fp32 (rows x V) temporaries of kd's softmax in a row block: the student's upcast logits (bf16 only),
    # both log-softmaxes, q_T, and the KL's difference and product (the teacher's upcast logits are freed once
    # its log-softmax is made, before the student's terms); tau != 1 divides both first. The previous block's
    # gradient is still bound while the next one's are made.
    per_row = (6 if d.bf16 else 5) + (3 if run.get("tau", 1.0) != 1 else 0)
    softmax_rows = max(per_row * b + previous for previous, b in zip([0, *blocks], blocks))
    m = gradients(d, ph, d.trained_layers(ph) if after_others else 0)
    m["loss: student and teacher logits of a chunk"] = 2 * d.act * chunk * d.V
    m["loss: softmax temporaries of a row block (fp32)"] = F32 * d.V * softmax_rows
    m["loss: head gradient accumulator (fp32)"] = F32 * d.V * d.H
    if d.bf16:  # kd._same_dtype's bf16 copy of the fp32 head (one GPU's parameter, FSDP2's root gathered in fp32),
        m["loss: head weight in bf16"] = BF16 * d.V * d.H  # made once a loss and held through its chunks
    m["loss: hidden states and their gradient"] = (3 if d.bf16 else 2) * d.act * d.N * d.H
    # kd._real_tokens: the teacher's states gathered at the real targets (the student's too where no cast copies
    # them), by their positions, with the targets there (int64)
    m["loss: states selected at the real targets"] = (1 if d.bf16 else 2) * d.act * d.N * d.H + 2 * 8 * d.N
    if d.checkpointing:  # each layer's input, and what the placement holds around them (loss_stream)
        m["checkpointed stream (fp32)"] = F32 * (active + loss_stream(d.preset, norm, ph)) * d.N * d.H
    else:
        m["saved layer activations"] = active * d.N * saved_per_token(d.c)
        m["stream at the block boundaries (fp32)"] = F32 * (ph.active_blocks + 2) * d.N * d.H
        if d.fsdp:  # model.apply_rope's casts of cos and sin, for q and for k, held by each layer
            m["RoPE cos and sin cast for each layer"] = active * 4 * d.act * d.rope * d.c.head_dim
    if d.bf16 and not d.fsdp:  # one GPU: autocast caches its bf16 casts of the fp32 weights for the step
        m["autocast's bf16 copies of the layer weights"] = BF16 * active * d.matrices
    m["RoPE cos and sin (fp32)"] = 2 * F32 * d.rope * d.c.head_dim
    if d.fsdp:  # the last layer's all-gather output, freed at the next gather
        m["last layer gathered (bf16)"] = d.act * d.shard * d.P_shard
    return m


def entering_first_trained_backward(d: Dims, ph, norm: str = "post") -> dict:
    """Activation checkpointing: the first micro-batch's backward reaches the first trained layer with
    every later layer's gradient done and that layer recomputed."""
    if d.micro_per_step > 1:
        m = gradients(d, ph, d.trained_layers(ph) - 1)
    else:  # one micro-batch: gradients reduce-scattered as they come
        m = {"gradients (fp32, sharded)": F32 * (d.trained_layers(ph) - 1) * d.P_shard
             + F32 * sum(math.prod(s) for s in d.root_trained) * ph.trains_head}
    m["recomputed layer's activations"] = d.N * saved_per_token(d.c) + (4 * d.act * d.rope * d.c.head_dim if d.fsdp else 0)
    entry = model.placement(model.block_norms(norm, d.preset.run["blocks"])[0]).entry_norm
    m["layer 0's input, and an entry norm's normalized x (fp32)"] = (1 + entry) * F32 * d.N * d.H
    m["RMSNorm backward temporaries (fp32)"] = 6 * F32 * d.N * d.H
    m["teacher hidden states"] = d.act * d.N * d.H
    m["RoPE cos and sin (fp32)"] = 2 * F32 * d.rope * d.c.head_dim
    if d.fsdp:
        m["layer 0 gathered (bf16)"] = d.act * d.shard * d.P_shard
    return m


def run_settings(preset, name: str = "x") -> config.RunConfig:
    """The preset's run as a launch's post-norm grow run takes it (what is counted, rehearsed and placed)."""
    return config.RunConfig(**{**preset.run, "name": name, "protocol": "grow", "norm": "post", "train_data": "",
                               "val_data": "", "replay_docs": 1})


def last_phase(preset) -> config.Phase:
    """Grow's last phase: every block active and trained, the head too (a joint run's phase alike)."""
    return config.plan_phases(run_settings(preset))[-1]


def costliest_first(preset, residents: list, norms: list[str] | None = None) -> tuple[list, list[str]]:
    """Resident runs' phases and placements (default post-norm), the one whose step holds the most first:
    the most trained blocks, then the most active, then a trained head, then (checkpointed) the most stream
    tensors at its loss (every other step holds less on top of what all hold)."""
    norms = norms or ["post"] * len(residents)
    stream = lambda i: loss_stream(preset, norms[i], residents[i]) if preset.run.get("activation_checkpointing") else 0
    stepping = max(range(len(residents)), key=lambda i: (len(residents[i].trainable_blocks), residents[i].active_blocks,
                                                         residents[i].trains_head, stream(i)))
    order = [stepping, *(i for i in range(len(residents)) if i != stepping)]
    return [residents[i] for i in order], [norms[i] for i in order]


def step_peak(preset, teacher: ModelConfig, gpus: int, nodes: int = 1, residents=1,
              replicate_teacher: bool = False, norms: list[str] | None = None) -> dict:
    """{"total": bytes at the peak on rank 0, "moment": where, "categories": {name: bytes} there, "moments": {name: total}}
    of a lockstep step of the students `residents` (their phases, config.Phase; an int n: n runs in grow's last phase, every
    block active and trained; their placements `norms`, default post-norm) held at once on `nodes` x `gpus`. Each resident
    steps in turn (grow.lockstep_step), so the peak is what all hold plus the costliest one's step (costliest_first)."""
    d = Dims(preset, teacher, gpus, nodes)
    residents, norms = costliest_first(preset, residents if not isinstance(residents, int)
                                       else [last_phase(preset)] * residents, norms)
    stepping, norm = residents[0], norms[0]
    candidates = {"loss, first micro-batch": in_the_loss(d, stepping, False, norm)}
    if d.micro_per_step > 1:
        candidates["loss, last micro-batch"] = in_the_loss(d, stepping, True, norm)
    if d.checkpointing:
        candidates["entering the first trained layer's backward"] = entering_first_trained_backward(d, stepping, norm)
    base = held(d, residents, replicate_teacher)
    totals = {name: sum(base.values()) + sum(m.values()) for name, m in candidates.items()}
    peak = max(totals, key=totals.get)
    return {"total": totals[peak], "moment": peak, "categories": {**base, **candidates[peak]}, "moments": totals}
