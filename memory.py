"""Per-GPU memory of one training step, counted tensor by tensor from the shapes (the dry run's estimate).

It counts what one rank holds in grow's heaviest step (every block active and trained, the head and the
boundary norm trained, the embedding frozen; post-norm) under devices.shard_fn with bf16 autocast and an
fp32 residual stream: each student's weights and AdamW moments, the teacher in the compute dtype, the
gradients accumulated over the step's micro-batches, one micro-batch's saved activations and the
chunked loss's buffers at its softmax, in the worst step a rank can be given: every micro-batch holds
documents of the full length. The step's largest moment is the peak: inside the loss of its last
micro-batch (on top of the gradients accumulated over the others), inside the loss of its first, or,
under activation checkpointing, the first micro-batch's backward entering layer 0.
Nothing is fitted; rehearse.py measures the same step through the kit's own code with FSDP2's memory
tracker, and tests/test_cluster.py holds the two together. CUDA's context, NCCL's buffers and the
allocator's fragmentation are not counted (plan.MEMORY_HEADROOM leaves room for them).
"""
from __future__ import annotations

import math

import model

F32, BF16 = 4, 2
LOSS_ROW_BLOCK_ELEMENTS = 2**26  # kd.ROW_BLOCK_ELEMENTS["cuda"]: rows of the softmax computed at once


def layer_shapes(c: model.ModelConfig) -> list[tuple[int, ...]]:
    """A decoder layer's parameters (every placement has two hidden-size RMSNorms)."""
    H, q, kv, F = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, \
        c.intermediate_size
    return [(q, H), (kv, H), (kv, H), (H, q),  # q, k, v, o projections
            (c.head_dim,), (c.head_dim,),      # q_norm, k_norm
            (F, H), (F, H), (H, F),            # gate, up, down
            (H,), (H,)]                        # the layer's two norms


def shard_numel(shape, shard: int) -> int:
    """Elements of rank 0's FSDP2 shard (dim 0 split in ceil(d0 / shard) rows; rank 0's is never short)."""
    return math.ceil(shape[0] / shard) * math.prod(shape[1:])


def saved_per_token(c: model.ModelConfig) -> int:
    """Bytes per token that autograd saves for one post-norm layer under bf16 autocast with an fp32
    residual stream (model.post_norm_layer, Attention, MLP, RMSNorm)."""
    H, q, kv, F = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, \
        c.intermediate_size
    nh, nkv = c.num_attention_heads, c.num_key_value_heads
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


def step_peak(preset, teacher: model.ModelConfig, gpus: int, nodes: int = 1, resident: int = 1,
              replicate_teacher: bool = False) -> dict:
    """{"total": bytes at the step's peak on rank 0, "moment": where, "categories": {name: bytes} there,
    "moments": {name: total}} for `resident` students held at once (lockstep) on `nodes` x `gpus`
    (several nodes: HSDP, sharded within a node)."""
    run, c = preset.run, teacher
    world = gpus * nodes
    fsdp = world > 1
    shard = gpus if fsdp else 1
    bf16 = run["precision"] in ("bf16", "auto")
    act = BF16 if bf16 else F32
    checkpointing = bool(run.get("activation_checkpointing"))
    V, H = c.vocab_size, c.hidden_size
    layers = run["blocks"] * run["layers_per_block"]
    layer = layer_shapes(c)
    P = sum(math.prod(s) for s in layer)
    P_shard = sum(shard_numel(s, shard) for s in layer)
    matrices = sum(math.prod(s) for s in layer if len(s) == 2)
    root = [(V, H), (H,), (V, H)]  # embedding (frozen), the boundary norm, the head
    root_trained = [(H,), (V, H)]
    T = preset.data["max_len"]
    several = run["global_batch"] // world // run["micro_batch"] > 1  # micro-batches a rank a step

    weights = F32 * (layers * P_shard + sum(shard_numel(s, shard) for s in root))
    trained = layers * P_shard + sum(shard_numel(s, shard) for s in root_trained)
    moments = 2 * F32 * trained + F32 * (layers * len(layer) + len(root_trained))  # exp_avg, exp_avg_sq, step
    teacher_layers = c.num_hidden_layers * sum(math.prod(s) if replicate_teacher else shard_numel(s, shard)
                                               for s in layer)
    teacher_root = V * H + H + (0 if c.tie_word_embeddings else V * H)  # whole on every rank
    held = {"student weights (fp32)": weights, "AdamW moments (fp32)": moments,
            "teacher weights": act * (teacher_layers + teacher_root),
            "other students' weights and moments": (resident - 1) * (weights + moments)}
    if fsdp:  # the root (fp32) stays gathered from its forward through its backward
        held["student root gathered (fp32 embedding, norm, head)"] = F32 * sum(math.prod(s) for s in root)

    def gradients(layers_done: int) -> dict:
        """Gradients held during a micro-batch after `layers_done` layers' backward. FSDP2 without
        gradient sync (every micro-batch but the last) keeps each layer's gradient unsharded in fp32,
        and the root's; one GPU keeps param.grad in fp32."""
        if not layers_done:
            return {}
        if fsdp:
            return {"accumulated gradients (fp32, unsharded)":
                    F32 * (min(layers_done, layers) * P + sum(math.prod(s) for s in root_trained))}
        return {"accumulated gradients (fp32)": F32 * (layers * P + sum(math.prod(s) for s in root_trained))}

    def in_the_loss(after_others: bool) -> dict:
        N = run["micro_batch"] * T
        chunk = min(run["loss_chunk"], N)
        rows = max(1, LOSS_ROW_BLOCK_ELEMENTS // V)
        blocks = [min(rows, min(start + chunk, N) - start - b) for start in range(0, N, chunk)
                  for b in range(0, min(chunk, N - start), rows)]
        # fp32 (rows x V) temporaries of kd's softmax in a row block: the upcast logits of both (bf16
        # only), both log-softmaxes, q_T, and the KL's difference and product; tau != 1 divides both
        # first. The previous block's gradient is still bound while the next one's are made.
        per_row = (7 if bf16 else 5) + (3 if run.get("tau", 1.0) != 1 else 0)
        softmax_rows = max(per_row * b + previous for previous, b in zip([0, *blocks], blocks))
        m = gradients(layers if after_others else 0)
        m["loss: student and teacher logits of a chunk"] = 2 * act * chunk * V
        m["loss: softmax temporaries of a row block (fp32)"] = F32 * V * softmax_rows
        m["loss: head gradient accumulator (fp32)"] = F32 * V * H
        if bf16:
            m["loss: head weight in bf16"] = BF16 * V * H
        m["loss: hidden states and their gradient"] = (3 if bf16 else 2) * act * N * H
        if checkpointing:  # each layer's input, the boundary norm's saved x * rsqrt, the last output
            m["checkpointed stream (fp32)"] = F32 * (layers + 2) * N * H
        else:
            m["saved layer activations"] = layers * N * saved_per_token(c)
            m["stream at the block boundaries (fp32)"] = F32 * (run["blocks"] + 2) * N * H
            if fsdp:  # model.apply_rope's casts of cos and sin, for q and for k, held by each layer
                m["RoPE cos and sin cast for each layer"] = layers * 4 * act * T * c.head_dim
        if bf16 and not fsdp:  # one GPU: autocast caches its bf16 casts of the fp32 weights for the step
            m["autocast's bf16 copies of the layer weights"] = BF16 * layers * matrices
        m["RoPE cos and sin (fp32)"] = 2 * F32 * T * c.head_dim
        if fsdp:  # the last layer's all-gather output, freed at the next gather
            m["last layer gathered (bf16)"] = act * shard * P_shard
        return m

    def entering_layer0_backward() -> dict:
        """Activation checkpointing: the first micro-batch's backward reaches layer 0 with every later
        layer's gradient done and layer 0 recomputed."""
        N = run["micro_batch"] * T
        if several:
            m = gradients(layers - 1)
        else:  # one micro-batch: gradients reduce-scattered as they come
            m = {"gradients (fp32, sharded)": F32 * (layers - 1) * P_shard
                 + F32 * sum(math.prod(s) for s in root_trained)}
        m["recomputed layer's activations"] = N * saved_per_token(c) + (4 * act * T * c.head_dim if fsdp else 0)
        m["boundary norm's output and x * rsqrt (fp32)"] = 2 * F32 * N * H
        m["RMSNorm backward temporaries (fp32)"] = 6 * F32 * N * H
        m["teacher hidden states"] = act * N * H
        m["RoPE cos and sin (fp32)"] = 2 * F32 * T * c.head_dim
        if fsdp:
            m["layer 0 gathered (bf16)"] = act * shard * P_shard
        return m

    candidates = {"loss, first micro-batch": in_the_loss(False)}
    if several:
        candidates["loss, last micro-batch"] = in_the_loss(True)
    if checkpointing:
        candidates["entering layer 0's backward"] = entering_layer0_backward()
    base = sum(held.values())
    moments_total = {name: base + sum(m.values()) for name, m in candidates.items()}
    peak = max(moments_total, key=moments_total.get)
    return {"total": moments_total[peak], "moment": peak, "categories": {**held, **candidates[peak]},
            "moments": moments_total}
