"""The networks a run computes with (the frozen teacher, shared by the runs that distil from it; the model a run
trains; mirror-fwd's reference) and what they compute: a micro-batch's loss, the evaluation, the monitor's numbers.

    teacher = nets.load_teacher(config, ctx, dtype)
    net = nets.build_model(config, teacher, ctx, dtype, boundary_token=train_shard.eot)
    scores = nets.evaluate(config, net, teacher, val, active_blocks, ctx, dtype)   # ce, ppl, kd, kl, val_tokens
"""

import itertools
import math
from functools import partial
from pathlib import Path

import torch

import data
import diag
import kd
import model
from config import Phase, RunConfig
from interventions.boundary import with_tail
from plumbing import devices
from plumbing.checkpoint import read_config
from plumbing.errors import TrainingError
from plumbing.hf_qwen3 import ModelConfig

# The networks: the frozen teacher, the model a run trains, mirror-fwd's reference

TEACHER_CACHE_BYTES = 2**30  # validation hidden states and log-probabilities kept per teacher (one process only)
# A training micro-batch's teacher log-probabilities, made once for the runs in lockstep that read it, up to this
# size (the toy's: 25 MB), in one CPU process only: there the teacher's head matmul and log-softmax, repeated per
# student, were a fifth of each student's loss; a GPU's memory plan (tools/memory.py) counts no such tensor, nor
# do the rehearsals that check a launch on a CPU (their teacher is built as a GPU's, their ranks are threads).
SHARED_LOG_PROBS_BYTES = 2**28
# A CPU process's teacher keeps its hidden states of the one-phase shard's first epoch where they all fit in this size
# (the toy's: 0.19 GB, mini's 0.76 GB): grow's later phases, and the joint runs that replay them, read those documents
# again in other micro-batches, and take each document's states from the micro-batch that held it in that epoch,
# whenever the run started or resumed; 500 of the toy's 1,250 lockstep steps then run no teacher forward.
FIRST_EPOCH_BYTES = 2**30
# The teacher's modules kept whole on every rank under FSDP2: the chunked loss applies its head outside its forward.
TEACHER_REPLICATED = ("embed_tokens", "norm", "lm_head")


def hidden_only(hidden, head_weight):
    """The output function of a forward that wants the final hidden states: no head, no loss."""
    return hidden


class Teacher:
    """The frozen teacher's final hidden states (the chunked loss applies its head); `forwards` counts its passes.
    Validation batches are kept after their first pass, up to `cache_bytes` (every evaluation of every run reads
    the same ones); under FSDP2 none, so every rank runs the same sequence of sharded forwards. With
    `log_prob_bytes` (a CPU run's), batches' log-probabilities too, up to that size a training micro-batch's; with
    `first_epoch_bytes`, the first epoch's hidden states (training_hidden)."""

    def __init__(self, net: model.Qwen3, cache_bytes: int = 0, log_prob_bytes: int = 0, first_epoch_bytes: int = 0):
        self.net, self.cache_bytes, self.log_prob_bytes, self.forwards = net, cache_bytes, log_prob_bytes, 0
        self.first_epoch_bytes, self.stream, self.holders, self.held = first_epoch_bytes, None, {}, {}
        self.kept: dict = {}

    @property
    def head_weight(self) -> torch.Tensor:
        return self.net.head_weight

    @torch.no_grad()
    def hidden(self, input_ids: torch.Tensor, key=None, doc_lengths: tuple[int, ...] | None = None) -> torch.Tensor:
        if key is not None and key in self.kept:
            return self.kept[key]
        self.forwards += 1
        hidden = self.net(input_ids, output_fn=hidden_only, doc_lengths=doc_lengths)
        if key is not None and self.kept_bytes() + hidden.nbytes <= self.cache_bytes:
            self.kept[key] = hidden
        return hidden

    @torch.no_grad()
    def training_hidden(self, micro: data.Batch, batcher: data.Batcher) -> torch.Tensor:
        """A packed training micro-batch's hidden states, each document's those of the micro-batch that held it in
        the one-phase shard's first epoch (computed then, or now if this process has not). A document's states
        depend on the documents beside it only through the matmuls' row blocking (equal bits on AMX, the last bit
        on some AVX2 CPUs), so they are made the same way whatever step a run starts or resumes at. A plain forward
        where a document lies outside that epoch or the epoch's states would not fit in first_epoch_bytes."""
        kept = self._holders(batcher, micro.input_ids.device.type) if self.first_epoch_bytes and micro.doc_lengths else {}
        holders = [kept.get(doc) for doc in micro.doc_ids]
        if None in holders:
            return self.hidden(micro.input_ids, doc_lengths=micro.doc_lengths)
        for holder in {holder for holder, _, _ in holders} - self.held.keys():
            batch = micro if holder == tuple(micro.doc_ids) else \
                data.make_batch(batcher.shard, list(holder), packed=True).to(micro.input_ids.device)
            self.held[holder] = self.hidden(batch.input_ids, doc_lengths=batch.doc_lengths)
        if holders[0][0] == tuple(micro.doc_ids):  # the first epoch itself
            return self.held[holders[0][0]]
        return torch.cat([self.held[holder][:, start:start + n] for holder, start, n in holders], dim=1)

    def _holders(self, batcher: data.Batcher, device: str) -> dict:
        """{document: (the first epoch's micro-batch that holds it, its offset there, its length)} of the stream
        `batcher` reads, under the autocast in effect; {} where they would not fit. A new stream drops the last's."""
        autocast = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device)
        stream = (str(batcher.shard.path), batcher.seed, batcher.global_batch, batcher.micro_batch,
                  batcher.replay_docs, batcher.balance, batcher.packed, batcher.world_size, autocast)
        if stream != self.stream:
            self.stream, self.holders, self.held = stream, {}, {}
            if batcher.packed and batcher.world_size == 1:
                for placed in batcher.first_epoch_micro_batches():
                    lengths = (batcher.shard.lengths[list(placed)] - 1).tolist()
                    order = data.longest_first(lengths)  # the documents as the packed row lays them
                    holder, lengths = tuple(placed[i] for i in order), [lengths[i] for i in order]
                    starts = itertools.accumulate(lengths, initial=0)
                    self.holders.update({doc: (holder, start, n) for doc, start, n in zip(holder, starts, lengths)})
                tokens = sum(n for _, _, n in self.holders.values())
                self.holders = self.holders if first_epoch_bytes(tokens, self.net.config.hidden_size) <= \
                    self.first_epoch_bytes else {}
        return self.holders

    @torch.no_grad()
    def log_probs(self, hidden: torch.Tensor, batch: data.Batch, config: RunConfig, key=None) -> torch.Tensor | None:
        """kd.teacher_log_probs of a batch for several students to share (call it under their autocast), kept under
        `key` as hidden states are (else up to `log_prob_bytes`); None where they would not fit, or without them."""
        autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")  # the head matmul's dtype
        key = None if key is None else ("log_probs", key, config.tau, config.loss_chunk, autocast)
        if key in self.kept:
            return self.kept[key]
        if not self.log_prob_bytes or batch.mask is None:
            return None
        itemsize = torch.promote_types(hidden.dtype, torch.float32).itemsize
        nbytes = int(batch.mask.sum()) * self.head_weight.shape[0] * itemsize
        if nbytes > (self.log_prob_bytes if key is None else self.cache_bytes - self.kept_bytes()):
            return None
        log_probs = kd.teacher_log_probs(hidden, self.head_weight, batch.mask, tau=config.tau,
                                         chunk_size=config.loss_chunk)
        if key is not None:
            self.kept[key] = log_probs
        return log_probs

    def kept_bytes(self) -> int:
        return sum(t.nbytes for t in self.kept.values())


def load_teacher(config: RunConfig, ctx: devices.Dist, dtype: torch.dtype) -> Teacher:
    """The teacher checkpoint, sharded under FSDP2; in the compute `dtype` on a GPU, fp32 on a CPU."""
    net = model.load_qwen3(config.teacher, dtype=dtype if ctx.device.type == "cuda" else torch.float32,
                           device=ctx.device, shard_fn=devices.shard_fn(ctx, dtype, replicated=TEACHER_REPLICATED))
    if config.compile:
        devices.compile_layers(net)
    one_cpu = ctx.device.type == "cpu" and ctx.world == 1
    return Teacher(net, TEACHER_CACHE_BYTES if ctx.world == 1 else 0, SHARED_LOG_PROBS_BYTES if one_cpu else 0,
                   first_epoch_budget(ctx))


def first_epoch_budget(ctx: devices.Dist) -> int:
    """The bytes a teacher may keep of the first epoch's states: one CPU process's (ranks and GPUs keep none)."""
    return FIRST_EPOCH_BYTES if ctx.device.type == "cpu" and ctx.world == 1 else 0


def first_epoch_bytes(tokens: float, hidden_size: int) -> float:
    """The first epoch's states of `tokens` tokens, at 4 bytes a value (fp32, the most the teacher's output takes)."""
    return tokens * hidden_size * 4


def build_model(config: RunConfig, teacher: Teacher | None, ctx: devices.Dist, dtype: torch.dtype,
                boundary_token: int | None = None) -> torch.nn.Module:
    """The model a run trains, fp32 master weights computing in `dtype`: a student built from the teacher (or the
    seed alone), or for the `teacher` protocol a Qwen3 from the seed. A boundary_tail goes in the embedding's row
    `boundary_token` (the data's <|endoftext|>)."""
    shard, student = devices.shard_fn(ctx, dtype), (config.blocks, config.layers_per_block, config.student_norm, config.seed)
    options = dict(shard_fn=shard, boundary=config.boundary, boundary_scale=config.boundary_scale,
                   features=config.student_features)  # a student's, from the teacher or from scratch
    if config.protocol == "teacher":
        net = model.qwen3_on_meta(ModelConfig(**config.teacher_config), shard)
        net.to_empty(device=ctx.device)
        net.init_weights(config.seed)
    elif config.scratch_model is not None:
        net = model.Student.from_scratch(ModelConfig(**config.scratch_model), *student, device=ctx.device, **options)
    else:
        net = model.Student.from_teacher(teacher.net, *student, output_gain=config.post_output_gain, **options)
        if config.boundary_tail:
            if boundary_token is None:
                raise TrainingError("boundary_tail: the student needs the data's boundary token to carry its tail")
            with torch.no_grad():
                tail = with_tail(devices.full_tensor(net.embed_tokens.weight), boundary_token, config.boundary_tail)
                devices.fill_parameter(net.embed_tokens.weight, tail)
    net.checkpoint_layers = config.activation_checkpointing
    devices.settle_fsdp_dtypes(net)
    if config.compile:
        devices.compile_layers(net)
    return net


class BoundaryProfile:
    """mirror-fwd's target: a frozen reference student's per-token RMS at each block boundary."""

    def __init__(self, reference: model.Student):
        self.reference = reference

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, active_blocks: int, doc_lengths: tuple[int, ...] | None = None) -> dict:
        _, bounds = self.reference(input_ids, active_blocks=active_blocks - 1, output_fn=hidden_only,
                                   return_boundaries=True, doc_lengths=doc_lengths)
        return {b: bounds[b].float().pow(2).mean(-1, keepdim=True).sqrt() for b in range(1, active_blocks)}


def boundary_profile(config: RunConfig, phase: Phase, ctx: devices.Dist, dtype: torch.dtype) -> BoundaryProfile:
    """mirror-fwd: the reference pre-norm run's phase-<p>/ of the same phase."""
    path = Path(config.boundary_source) / f"phase-{phase.index}"
    if not (path / "trainer_state.json").is_file():
        raise TrainingError(f"{path}: missing; a mirror-fwd run copies the boundary profile of "
                            f"{config.boundary_source}, so finish that run first")
    # The reference only runs forward: on a GPU it is held in the compute precision, as the teacher is.
    reference_dtype = dtype if ctx.device.type == "cuda" else torch.float32
    return BoundaryProfile(model.Student.load(path, reference_dtype, ctx.device).eval())


def warn_math_attention(config: RunConfig, ctx: devices.Dist):
    """One line if this GPU has no fused attention kernel for the runs' longest document (SDPA's silent fallback)."""
    length = int(data.Shard(config.train_data, verify=False).lengths.max()) - 1
    shape = ModelConfig(**config.teacher_config) if config.teacher_config else \
        ModelConfig.from_hf(read_config(Path(config.teacher))) if config.teacher else \
        ModelConfig(**config.scratch_model)
    if problem := devices.fused_attention_problem(shape, length, ctx.device):
        scores = shape.num_attention_heads * length**2 * 4 / 2**30
        devices.print0(ctx, f"warning: no fused attention kernel on {torch.cuda.get_device_name(ctx.device)} for {length} "
                            f"tokens ({problem}); SDPA's math kernel will hold ~{scores:.1f} GiB of scores a layer and run "
                            "several times slower: use a GPU with flash attention (sm80+) or shorter documents "
                            "(data.max_len)")


# What they compute: a micro-batch's loss, the evaluation (the whole fixed validation set, token-weighted,
# on every rank), the boundary monitor's numbers

def loss_fn(config, batch, teacher_hidden, teacher_head_weight, phase, denominator, net, teacher_log_probs=None):
    """One micro-batch through the model with the chunked loss (plain CE without teacher hidden states); the
    teacher's log-probabilities where the runs in lockstep share them (Teacher.log_probs)."""
    if teacher_hidden is None:
        blocks = {"active_blocks": phase.active_blocks} if isinstance(net, model.Student) else {}
        loss, ce_term = net(batch.input_ids, **blocks, doc_lengths=batch.doc_lengths, output_fn=partial(
            kd.ce_loss, targets=batch.targets, mask=batch.mask, chunk_size=config.loss_chunk,
            denominator=denominator))
        return loss, loss.new_zeros(()), ce_term
    return net(batch.input_ids, active_blocks=phase.active_blocks, doc_lengths=batch.doc_lengths, output_fn=partial(
        kd.kd_loss, teacher_hidden=teacher_hidden, teacher_head_weight=teacher_head_weight, targets=batch.targets,
        mask=batch.mask, alpha=config.alpha, gamma=config.gamma, tau=config.tau,
        chunk_size=config.loss_chunk, denominator=denominator, teacher_log_probs=teacher_log_probs))


@torch.no_grad()
def evaluate(config: RunConfig, net, teacher: Teacher | None, val: data.Shard, active_blocks: int | None,
             ctx: devices.Dist, dtype: torch.dtype) -> dict:
    """CE, PPL, KD (soft-target CE) and KL over every validation document, token-weighted over ranks."""
    net.eval()
    sums = [0.0, 0.0, 0.0, 0.0]  # kl, soft_ce, ce, targets
    blocks = {"active_blocks": active_blocks} if isinstance(net, model.Student) else {}
    batches = data.eval_batches(val, config.eval_batch, ctx.rank, ctx.world, fixed_shapes=config.compile,
                                packed=config.packs)
    for i, batch in enumerate(batches):
        batch = batch.to(ctx.device)
        with devices.autocast(dtype, ctx):
            # Without a teacher kd_sums gives CE alone (tau is not read then).
            cache_key = (str(val.path), config.eval_batch, config.compile, config.packs, i)
            terms = {"teacher_hidden": None, "teacher_head_weight": None}
            if teacher is not None:  # every evaluation of every run reads the same batches' teacher terms
                hidden = teacher.hidden(batch.input_ids, key=cache_key, doc_lengths=batch.doc_lengths)
                terms = dict(teacher_hidden=hidden, teacher_head_weight=teacher.head_weight,
                             teacher_log_probs=teacher.log_probs(hidden, batch, config, key=cache_key))
            s = net(batch.input_ids, **blocks, doc_lengths=batch.doc_lengths, output_fn=partial(
                kd.kd_sums, **terms, targets=batch.targets, mask=batch.mask, tau=config.tau,
                chunk_size=config.loss_chunk))
        for k, key in enumerate(("kl", "soft_ce", "ce", "n")):
            sums[k] += float(s.get(key, 0.0))
    kl, soft_ce, ce, n = ctx.sum(sums)
    release(net)  # free the gathered root until the next step
    net.train()
    n = max(n, 1.0)
    return {"ce": ce / n, "ppl": perplexity(ce / n), "kd": soft_ce / n, "kl": kl / n, "val_tokens": int(n)}


def release(net: torch.nn.Module):
    """FSDP2 keeps a root gathered after its forward, its unsharded copies standing in for its parameters:
    reshard before a weight is written, or the write lands in a copy that is then freed."""
    if hasattr(net, "reshard"):
        net.reshard()


def perplexity(ce: float) -> float:
    """exp(CE), inf (not an overflow) for a CE past exp's range."""
    return math.exp(ce) if ce < 700 else math.inf


def monitor_row(captured: dict, mask: torch.Tensor, first: torch.Tensor | None = None) -> dict:
    """The boundary monitor's numbers from one training forward, diag.boundary_stats's conventions, with the
    boundary token's (each document's position 0: `first`) mean RMS over all other real tokens' (the monitor
    decodes nothing, so delimiters count as others)."""
    first = diag.row_starts(mask) if first is None else first
    rows = []
    for b, h in enumerate(captured["boundaries"]):
        stats = diag.summarize(diag.token_rms(h, mask))
        first_rms, others = diag.token_rms(h, mask & first), diag.token_rms(h, mask & ~first)
        ratio = first_rms.mean().item() / others.mean().item() if first_rms.numel() and others.numel() else None
        rows.append({"boundary": b, "label": diag.boundary_label(b), **{k: stats[k] for k in ("mean", "std", "kurtosis")},
                     "boundary_over_others": ratio, "massive_ratio": diag.massive_activation(h, mask)["massive_ratio"]})
    return {"boundaries": rows, "first_attention": diag.first_token_attention(captured["first_attention"], mask, first)}
