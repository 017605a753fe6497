"""The distillation loss, computed in token chunks so [tokens x vocab] logits never exist at once.

Per real (non-padding) target token:

    L = alpha * tau^2 * KL(softmax(z_T / tau) || softmax(z_S / tau)) + gamma * CE(y, z_S)

with z = hidden @ head_weight.T for the student (S) and the teacher (T), averaged over real targets.

    loss, kd_term, ce_term = kd.kd_loss(h_S, W_S, h_T, W_T, targets, mask,   # (B, T, H), (V, H), ..., (B, T)
                                        denominator=real_targets_in_global_batch)
    loss.backward()          # gradients reach h_S and W_S only
    sums = kd.kd_sums(...)   # no grad: float64 sums of kl, soft_ce, ce and the count n, for evaluation
    log_q_T = kd.teacher_log_probs(h_T, W_T, targets, mask)   # several students of one batch: the teacher's
    kd.kd_loss(h_S, W_S, None, None, targets, mask, teacher_log_probs=log_q_T)   # head and softmax once

How: the masked tokens are gathered (padding costs nothing), then processed `chunk_size` tokens at a time.
Each chunk's logits go into two [chunk x V] buffers allocated once per call; the softmax math runs over a
few rows at a time in fp32 (fp64 for fp64 inputs), and because the loss is a plain sum over tokens, the
gradient of each chunk is finished during the forward pass (as Liger-Kernel's fused linear cross-entropy
does): the rows of the student's logit buffer are overwritten with dL/dz_S, which two matmuls turn into the
chunk's share of dL/dhidden and dL/dW. backward() then only scales the stored gradients by grad_output, so
logits are never recomputed. dL/dz_S per token (q = softmax(z/tau), p = softmax(z)):

    d/dz_S [tau^2 * KL(q_T || q_S)] = tau^2 * (q_S - q_T) / tau = tau * (q_S - q_T)
    d/dz_S [CE(y, z_S)]             = p_S - onehot(y)

`denominator` is the number of real targets the mean is over; the training loop passes the count of the
whole global batch (summed over micro-batches and ranks), so gradient accumulation and data parallelism
never change the result. A zero denominator (an all-padding batch) gives a loss of 0 and zero gradients.
"""
import torch
from torch.autograd.function import once_differentiable

# The softmax math runs over blocks of about this many logits, so its ~8 temporaries stay small. CPU: blocks of
# one core's L2 (512 KiB of fp32) ran the toy's loss math 1.4x as fast as 127-row blocks, and 3 rows at V=151,936
# ~3x as fast as 100-row ones; GPU: large blocks (small ones only add kernel launches).
ROW_BLOCK_ELEMENTS = {"cpu": 2**17, "cuda": 2**26}
# The logit buffers' row strides are a multiple of 32 elements (128 bytes in fp32; the rest unused): MKL's
# sgemm wrote the toy's unaligned rows (V=4,097) at 0.7x the rate of aligned ones; the values are the same.
LOGIT_ROW_ALIGN = 32
# Two [chunk x V] logit buffers are the loss's memory: 1.2 GB in fp32 at 1024 x 151,936.
DEFAULT_CHUNK_SIZE = 1024


# Per-token terms of a block of rows

def _teacher_log_probs(z_T, tau):
    """A function, not inline in _teacher_blocks: the upcast block it is given is freed when it returns (memory.py)."""
    return torch.log_softmax(z_T if tau == 1 else z_T / tau, dim=-1)


def _token_terms(z_S, log_q_T, y, *, alpha, gamma, tau, want_grad, want_soft_ce):
    """Per-token ce, kl (tau^2 * KL), soft_ce (tau^2 * H(q_T, q_S)) and grad = d(alpha * kl + gamma * ce)/dz_S
    (rows, V) from fp32 (or fp64) student logits z_S and teacher log-probabilities log_q_T (rows, V); None for
    what has no teacher or was not asked for."""
    log_p_S = torch.log_softmax(z_S, dim=-1)
    ce = -log_p_S.gather(1, y[:, None]).squeeze(1)
    kl = soft_ce = None
    if log_q_T is not None:
        log_q_S = log_p_S if tau == 1 else torch.log_softmax(z_S / tau, dim=-1)
        q_T = log_q_T.exp()
        # KL summed directly, not as soft_ce - entropy, whose difference loses a small KL's digits in fp32.
        kl = tau**2 * (q_T * (log_q_T - log_q_S)).sum(-1)
        soft_ce = -tau**2 * (q_T * log_q_S).sum(-1) if want_soft_ce else None
    if not want_grad:
        return ce, kl, soft_ce, None
    if log_q_T is None:
        grad = log_p_S.exp_().mul_(gamma)                                   # gamma * (p_S - onehot(y))
    elif tau == 1:  # q_S = p_S: grad = (alpha + gamma) p_S - alpha q_T - gamma onehot(y), one exp fewer
        grad = log_p_S.exp().mul_(alpha + gamma).sub_(q_T, alpha=alpha)
    else:
        grad = log_p_S.exp().mul_(gamma).add_(log_q_S.exp().sub_(q_T), alpha=alpha * tau)
    grad[torch.arange(len(y), device=y.device), y] -= gamma
    return ce, kl, soft_ce, grad


# The one chunk loop: sums over tokens, and (optionally) the gradients of the summed loss

@torch.no_grad()  # gradients here are computed by hand, never traced
def _chunk_loop(h_S, W_S, teacher, y, *, alpha, gamma, tau, chunk_size, grad_h=False, grad_W=False,
                want_soft_ce=False):
    """Walks the tokens (N, H) in chunks: float64 sums of kl, soft_ce and ce, and the gradients asked for.
    `teacher`: None, (h_T, W_T), or the teacher's log-probabilities (N, V) that teacher_log_probs computed."""
    n, vocab = len(y), W_S.shape[0]
    sums = torch.zeros(3, dtype=torch.float64, device=h_S.device)
    dh = torch.empty_like(h_S) if grad_h else None
    # Accumulate dW in fp32 (or fp64) across chunks even for a bf16 head, and cast once at the end.
    math_dtype = torch.promote_types(W_S.dtype, torch.float32)
    dW = torch.zeros(W_S.shape, dtype=math_dtype, device=W_S.device) if grad_W else None

    # Logit buffers allocated once and reused: fresh ones per chunk would cost page faults or allocator churn.
    chunk_size = max(1, min(chunk_size, n))  # no tokens: one unused row, and the loop below never runs
    z_S_buf = _logit_buffer(chunk_size, vocab, h_S)
    if teacher is None:
        teacher_blocks = None
    elif isinstance(teacher, tuple):  # (h_T, W_T): the teacher's log-probabilities made here, block by block
        teacher_blocks = (block for _, block in _teacher_blocks(*teacher, tau, chunk_size))
    else:                             # teacher_log_probs' values, read block by block
        teacher_blocks = (teacher[rows] for _, blocks in _chunks(n, chunk_size, vocab, h_S.device) for rows in blocks)
    for chunk, blocks in _chunks(n, chunk_size, vocab, h_S.device):
        z_S = torch.mm(h_S[chunk], W_S.T, out=z_S_buf[:chunk.stop - chunk.start])  # (rows, V), input dtype
        for rows in blocks:
            block = slice(rows.start - chunk.start, rows.stop - chunk.start)
            ce, kl, soft_ce, grad = _token_terms(
                _upcast(z_S[block]), None if teacher_blocks is None else next(teacher_blocks), y[rows],
                alpha=alpha, gamma=gamma, tau=tau, want_grad=grad_h or grad_W, want_soft_ce=want_soft_ce)
            for i, term in enumerate((kl, soft_ce, ce)):
                if term is not None:
                    sums[i] += term.sum(dtype=torch.float64)
            if grad is not None:
                z_S[block] = grad                    # the buffer now holds dL/dz_S (cast to its dtype)
        if grad_h:
            torch.mm(z_S, W_S, out=dh[chunk])
        if grad_W:
            if dW.dtype == z_S.dtype:
                dW.addmm_(z_S.T, h_S[chunk])         # in place: no (V, H) temporary
            else:
                dW += z_S.T @ h_S[chunk]             # bf16 product, fp32 accumulation
    return sums, dh, None if dW is None else dW.to(W_S.dtype)


def _chunks(n, chunk_size, vocab, device):
    """(chunk, its blocks) of N tokens: chunks of `chunk_size` tokens (one logit buffer each), each walked in blocks
    of rows (the softmax math's), all as slices of the N tokens."""
    rows_per_block = max(1, ROW_BLOCK_ELEMENTS.get(device.type, 2**28) // vocab)
    for start in range(0, n, chunk_size):
        chunk = slice(start, min(start + chunk_size, n))
        yield chunk, [slice(b, min(b + rows_per_block, chunk.stop)) for b in range(chunk.start, chunk.stop, rows_per_block)]


def _teacher_blocks(h_T, W_T, tau, chunk_size):
    """(rows, the teacher's log-probabilities there) block by block, in _chunk_loop's order: the same chunks, matmuls
    and blocks whether the loop asks for them or teacher_log_probs keeps them, so both give the same bits."""
    buffer = _logit_buffer(chunk_size, W_T.shape[0], h_T)
    for chunk, blocks in _chunks(len(h_T), chunk_size, W_T.shape[0], h_T.device):
        z_T = torch.mm(h_T[chunk], W_T.T, out=buffer[:chunk.stop - chunk.start])
        for rows in blocks:
            yield rows, _teacher_log_probs(_upcast(z_T[rows.start - chunk.start:rows.stop - chunk.start]), tau)


def _logit_buffer(rows, vocab, like):
    """A (rows, vocab) buffer whose rows start LOGIT_ROW_ALIGN elements apart, its unused tail columns zeros:
    oneDNN's AMX kernel for a bf16 matmul reads a row up to its stride where the width is not a multiple of 32
    (torch 2.13, the toy's V=513: a NaN left there by an earlier tensor made every gradient NaN)."""
    stride = -(-vocab // LOGIT_ROW_ALIGN) * LOGIT_ROW_ALIGN
    buffer = torch.empty(rows, stride, dtype=like.dtype, device=like.device)
    buffer[:, vocab:].zero_()  # only the tail: the matmuls write the rest (zeroing it all was 3% of the toy's loss)
    return buffer[:, :vocab]


def _upcast(z):
    """Softmax math in fp32 at least, whatever the matmul dtype (fp64 stays fp64)."""
    return z.to(torch.promote_types(z.dtype, torch.float32))


# Autograd: the gradients were finished in forward; backward scales them by grad_output

class _ChunkedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_S, W_S, teacher, y, alpha, gamma, tau, chunk_size, scale):
        sums, dh, dW = _chunk_loop(h_S, W_S, teacher, y, alpha=alpha, gamma=gamma, tau=tau,
                                   chunk_size=chunk_size, grad_h=ctx.needs_input_grad[0],
                                   grad_W=ctx.needs_input_grad[1])
        for grad in (dh, dW):
            if grad is not None:
                grad.mul_(scale)                     # in place: dW can be as large as the head
        ctx.save_for_backward(dh, dW)
        loss, kd_term, ce_term = _terms(sums, alpha, gamma, scale, _upcast(h_S).dtype)
        ctx.mark_non_differentiable(kd_term, ce_term)
        return loss, kd_term, ce_term

    @staticmethod
    @once_differentiable  # the stored gradients are constants: a second derivative would be silently wrong
    def backward(ctx, grad_loss, _grad_kd_term, _grad_ce_term):
        return tuple(None if grad is None else grad * grad_loss for grad in ctx.saved_tensors) + (None,) * 7


def _terms(sums, alpha, gamma, scale, dtype):
    """(loss, kd_term, ce_term) from the float64 sums: means over `1 / scale` real targets."""
    kd_term, ce_term = (sums[0] * scale).to(dtype), (sums[2] * scale).to(dtype)
    return alpha * kd_term + gamma * ce_term, kd_term, ce_term


# Public API

def kd_loss(student_hidden, student_head_weight, teacher_hidden, teacher_head_weight, targets, mask,
            alpha=0.7, gamma=0.3, tau=1.0, chunk_size=DEFAULT_CHUNK_SIZE, denominator=None, teacher_log_probs=None):
    """(loss, mean tau^2 * KL, mean CE) over `denominator` real targets (default mask.sum()), the terms detached.
    `teacher_log_probs` (teacher_log_probs' for the same mask, tau and chunk_size) stands in for the teacher's
    hidden states and head."""
    real = _real(mask)
    h_S, W_S = _head_inputs(student_hidden, student_head_weight, real)
    teacher, y = _teacher(teacher_hidden, teacher_head_weight, real, teacher_log_probs), targets.reshape(-1)[real].long()
    denominator = len(y) if denominator is None else float(denominator)
    scale = 1.0 / denominator if denominator > 0 else 0.0
    if torch.is_grad_enabled() and (h_S.requires_grad or W_S.requires_grad):
        return _ChunkedLoss.apply(h_S, W_S, teacher, y, alpha, gamma, tau, chunk_size, scale)
    sums, _, _ = _chunk_loop(h_S, W_S, teacher, y, alpha=alpha, gamma=gamma, tau=tau, chunk_size=chunk_size)
    return _terms(sums, alpha, gamma, scale, _upcast(h_S).dtype)


def ce_loss(hidden, head_weight, targets, mask, chunk_size=DEFAULT_CHUNK_SIZE, denominator=None):
    """Plain next-token CE, chunked the same way: (loss, its detached value)."""
    loss, _, ce_term = kd_loss(hidden, head_weight, None, None, targets, mask, alpha=0.0, gamma=1.0,
                               tau=1.0, chunk_size=chunk_size, denominator=denominator)
    return loss, ce_term


@torch.no_grad()
def kd_sums(student_hidden, student_head_weight, teacher_hidden, teacher_head_weight, targets, mask,
            tau=1.0, chunk_size=DEFAULT_CHUNK_SIZE, teacher_log_probs=None):
    """Float64 sums over real targets of kl, soft_ce, ce and the count n (without a teacher, ce and n)."""
    real = _real(mask)
    h_S, W_S = _head_inputs(student_hidden, student_head_weight, real)
    teacher, y = _teacher(teacher_hidden, teacher_head_weight, real, teacher_log_probs), targets.reshape(-1)[real].long()
    sums, _, _ = _chunk_loop(h_S, W_S, teacher, y, alpha=0.0, gamma=0.0, tau=tau, chunk_size=chunk_size,
                             want_soft_ce=True)
    out = {"kl": sums[0], "soft_ce": sums[1], "ce": sums[2]} if teacher is not None else {"ce": sums[2]}
    out["n"] = torch.tensor(float(len(y)), dtype=torch.float64, device=sums.device)
    return out


@torch.no_grad()
def teacher_log_probs(teacher_hidden, teacher_head_weight, mask, tau=1.0, chunk_size=DEFAULT_CHUNK_SIZE):
    """log softmax(z_T / tau) at each real target, (N, V) in the softmax math's dtype: bit for bit what kd_loss and
    kd_sums compute for the same mask, tau and chunk_size under the same autocast, so several students that read
    one batch share the teacher's head matmul and log-softmax. N x V floats: 25 MB at the toy's 1,500 tokens."""
    h_T, W_T = _head_inputs(teacher_hidden.detach(), teacher_head_weight.detach(), _real(mask))
    n, vocab = len(h_T), W_T.shape[0]
    chunk_size = max(1, min(chunk_size, n))  # as _chunk_loop clamps it
    out = torch.empty(n, vocab, dtype=torch.promote_types(h_T.dtype, torch.float32), device=h_T.device)
    for rows, block in _teacher_blocks(h_T, W_T, tau, chunk_size):
        out[rows] = block
    return out


def _real(mask):
    """The real targets' positions, found once: on a GPU that waits for the device, and a boolean mask used three
    times would wait three times (an index by them is what indexing by the mask does inside). mask None: every
    target is real (the rehearsal's fake tensors have no data to select by)."""
    return slice(None) if mask is None else mask.reshape(-1).nonzero().squeeze(1)


def _head_inputs(h, W, real):
    """(N, H) hidden states at the real targets and the head (V, H), in one matmul dtype (cast outside the chunk
    loop, so autograd carries the student's gradients back to the dtypes it came in)."""
    return _same_dtype(h.reshape(-1, h.shape[-1])[real], W)


def _teacher(h_T, W_T, real, log_probs):
    """What _chunk_loop reads of the teacher: its precomputed log-probabilities, (h_T, W_T) detached, or None."""
    if log_probs is not None or h_T is None:
        return log_probs
    return _head_inputs(h_T.detach(), W_T.detach(), real)


def _same_dtype(h, W):
    """The head matmul's dtype: autocast's under autocast, as F.linear's, else the wider of the two."""
    autocast = torch.is_autocast_enabled(h.device.type)
    dtype = torch.get_autocast_dtype(h.device.type) if autocast else torch.promote_types(h.dtype, W.dtype)
    return h.to(dtype), W.to(dtype)
