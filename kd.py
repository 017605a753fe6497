"""The distillation loss, computed in token chunks so [tokens x vocab] logits never exist at once.

Per real (non-padding) target token:

    L = alpha * tau^2 * KL(softmax(z_T / tau) || softmax(z_S / tau)) + gamma * CE(y, z_S)

with z = hidden @ head_weight.T for the student (S) and the teacher (T), averaged over real targets.

    loss, kd_term, ce_term = kd.kd_loss(h_S, W_S, h_T, W_T, targets, mask,   # (B, T, H), (V, H), ..., (B, T)
                                        denominator=real_targets_in_global_batch)
    loss.backward()          # gradients reach h_S and W_S only
    sums = kd.kd_sums(...)   # no grad: float64 sums of kl, soft_ce, ce and the count n, for evaluation

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


# ----------------------------------------------------------------------------------------------
# Per-token terms of a block of rows

def _token_terms(z_S, z_T, y, *, alpha, gamma, tau, want_grad, want_soft_ce):
    """Per-token ce, kl (tau^2 * KL), soft_ce (tau^2 * H(q_T, q_S)) and grad = d(alpha * kl + gamma * ce)/dz_S
    (rows, V) from fp32 (or fp64) logits z_S, z_T (rows, V); None for what has no teacher or was not asked for."""
    log_p_S = torch.log_softmax(z_S, dim=-1)
    ce = -log_p_S.gather(1, y[:, None]).squeeze(1)
    kl = soft_ce = None
    if z_T is not None:
        log_q_S = log_p_S if tau == 1 else torch.log_softmax(z_S / tau, dim=-1)
        log_q_T = torch.log_softmax(z_T if tau == 1 else z_T / tau, dim=-1)
        q_T = log_q_T.exp()
        # KL summed directly, not as soft_ce - entropy, whose difference loses a small KL's digits in fp32.
        kl = tau**2 * (q_T * (log_q_T - log_q_S)).sum(-1)
        soft_ce = -tau**2 * (q_T * log_q_S).sum(-1) if want_soft_ce else None
    if not want_grad:
        return ce, kl, soft_ce, None
    if z_T is None:
        grad = log_p_S.exp_().mul_(gamma)                                   # gamma * (p_S - onehot(y))
    elif tau == 1:  # q_S = p_S: grad = (alpha + gamma) p_S - alpha q_T - gamma onehot(y), one exp fewer
        grad = log_p_S.exp().mul_(alpha + gamma).sub_(q_T, alpha=alpha)
    else:
        grad = log_p_S.exp().mul_(gamma).add_(log_q_S.exp().sub_(q_T), alpha=alpha * tau)
    grad[torch.arange(len(y), device=y.device), y] -= gamma
    return ce, kl, soft_ce, grad


# ----------------------------------------------------------------------------------------------
# The one chunk loop: sums over tokens, and (optionally) the gradients of the summed loss

@torch.no_grad()  # gradients here are computed by hand, never traced
def _chunk_loop(h_S, W_S, h_T, W_T, y, *, alpha, gamma, tau, chunk_size, grad_h=False, grad_W=False,
                want_soft_ce=False):
    """Walks the tokens (N, H) in chunks: float64 sums of kl, soft_ce and ce, and the gradients asked for."""
    n, vocab = len(y), W_S.shape[0]
    sums = torch.zeros(3, dtype=torch.float64, device=h_S.device)
    dh = torch.empty_like(h_S) if grad_h else None
    # Accumulate dW in fp32 (or fp64) across chunks even for a bf16 head, and cast once at the end.
    math_dtype = torch.promote_types(W_S.dtype, torch.float32)
    dW = torch.zeros(W_S.shape, dtype=math_dtype, device=W_S.device) if grad_W else None

    # Logit buffers allocated once and reused: fresh ones per chunk would cost page faults or allocator churn.
    chunk_size = max(1, min(chunk_size, n))  # no tokens: one unused row, and the loop below never runs
    z_S_buf = _logit_buffer(chunk_size, vocab, h_S)
    z_T_buf = None if h_T is None else _logit_buffer(chunk_size, vocab, h_T)
    rows_per_block = max(1, ROW_BLOCK_ELEMENTS.get(h_S.device.type, 2**28) // vocab)

    for start in range(0, n, chunk_size):
        chunk = slice(start, min(start + chunk_size, n))
        rows = chunk.stop - chunk.start
        z_S = torch.mm(h_S[chunk], W_S.T, out=z_S_buf[:rows])                 # (rows, V), input dtype
        z_T = None if h_T is None else torch.mm(h_T[chunk], W_T.T, out=z_T_buf[:rows])
        for b in range(0, rows, rows_per_block):
            block = slice(b, b + rows_per_block)
            ce, kl, soft_ce, grad = _token_terms(
                _upcast(z_S[block]), None if z_T is None else _upcast(z_T[block]), y[chunk][block],
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


def _logit_buffer(rows, vocab, like):
    """A (rows, vocab) buffer whose rows start LOGIT_ROW_ALIGN elements apart, its unused tail columns zeros:
    oneDNN's AMX kernel for a bf16 matmul reads a row up to its stride where the width is not a multiple of 32
    (torch 2.13, the toy's V=513: a NaN left there by an earlier tensor made every gradient NaN)."""
    stride = -(-vocab // LOGIT_ROW_ALIGN) * LOGIT_ROW_ALIGN
    return torch.zeros(rows, stride, dtype=like.dtype, device=like.device)[:, :vocab]


def _upcast(z):
    """Softmax math in fp32 at least, whatever the matmul dtype (fp64 stays fp64)."""
    return z.to(torch.promote_types(z.dtype, torch.float32))


# ----------------------------------------------------------------------------------------------
# Autograd: the gradients were finished in forward; backward scales them by grad_output

class _ChunkedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_S, W_S, h_T, W_T, y, alpha, gamma, tau, chunk_size, scale):
        sums, dh, dW = _chunk_loop(h_S, W_S, h_T, W_T, y, alpha=alpha, gamma=gamma, tau=tau,
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
        return tuple(None if grad is None else grad * grad_loss for grad in ctx.saved_tensors) + (None,) * 8


def _terms(sums, alpha, gamma, scale, dtype):
    """(loss, kd_term, ce_term) from the float64 sums: means over `1 / scale` real targets."""
    kd_term, ce_term = (sums[0] * scale).to(dtype), (sums[2] * scale).to(dtype)
    return alpha * kd_term + gamma * ce_term, kd_term, ce_term


# ----------------------------------------------------------------------------------------------
# Public API

def kd_loss(student_hidden, student_head_weight, teacher_hidden, teacher_head_weight, targets, mask,
            alpha=0.7, gamma=0.3, tau=1.0, chunk_size=DEFAULT_CHUNK_SIZE, denominator=None):
    """(loss, mean tau^2 * KL, mean CE) over `denominator` real targets (default mask.sum()), the terms detached."""
    h_S, W_S, h_T, W_T, y = _real_tokens(student_hidden, student_head_weight, teacher_hidden, teacher_head_weight,
                                         targets, mask)
    denominator = len(y) if denominator is None else float(denominator)
    scale = 1.0 / denominator if denominator > 0 else 0.0
    if torch.is_grad_enabled() and (h_S.requires_grad or W_S.requires_grad):
        return _ChunkedLoss.apply(h_S, W_S, h_T, W_T, y, alpha, gamma, tau, chunk_size, scale)
    sums, _, _ = _chunk_loop(h_S, W_S, h_T, W_T, y, alpha=alpha, gamma=gamma, tau=tau,
                             chunk_size=chunk_size)
    return _terms(sums, alpha, gamma, scale, _upcast(h_S).dtype)


def ce_loss(hidden, head_weight, targets, mask, chunk_size=DEFAULT_CHUNK_SIZE, denominator=None):
    """Plain next-token CE, chunked the same way: (loss, its detached value)."""
    loss, _, ce_term = kd_loss(hidden, head_weight, None, None, targets, mask, alpha=0.0, gamma=1.0,
                               tau=1.0, chunk_size=chunk_size, denominator=denominator)
    return loss, ce_term


@torch.no_grad()
def kd_sums(student_hidden, student_head_weight, teacher_hidden, teacher_head_weight, targets, mask,
            tau=1.0, chunk_size=DEFAULT_CHUNK_SIZE):
    """Float64 sums over real targets of kl, soft_ce, ce and the count n (without a teacher, ce and n)."""
    h_S, W_S, h_T, W_T, y = _real_tokens(student_hidden, student_head_weight, teacher_hidden,
                                         teacher_head_weight, targets, mask)
    sums, _, _ = _chunk_loop(h_S, W_S, h_T, W_T, y, alpha=0.0, gamma=0.0, tau=tau, chunk_size=chunk_size,
                             want_soft_ce=True)
    out = {"kl": sums[0], "soft_ce": sums[1], "ce": sums[2]} if h_T is not None else {"ce": sums[2]}
    out["n"] = torch.tensor(float(len(y)), dtype=torch.float64, device=sums.device)
    return out


def _real_tokens(h_S, W_S, h_T, W_T, targets, mask):
    """Flattens leading dims and keeps only real targets; gives each hidden/head pair one matmul dtype (cast
    outside the chunk loop, so autograd carries the student's gradients back to the dtypes it came in)."""
    # mask None: every target is real (the rehearsal's fake tensors have no data to select by). Else the real
    # targets' positions, found once: on a GPU that waits for the device, and a boolean mask used three times would
    # wait three times (an index by them is what indexing by the mask does inside).
    real = slice(None) if mask is None else mask.reshape(-1).nonzero().squeeze(1)
    h_S, W_S = _same_dtype(h_S.reshape(-1, h_S.shape[-1])[real], W_S)           # (N, H), (V, H)
    if h_T is not None:
        h_T, W_T = _same_dtype(h_T.reshape(-1, h_T.shape[-1])[real].detach(), W_T.detach())  # (N, H_T)
    return h_S, W_S, h_T, W_T, targets.reshape(-1)[real].long()


def _same_dtype(h, W):
    """The head matmul's dtype: autocast's under autocast, as F.linear's, else the wider of the two."""
    if torch.is_autocast_enabled(h.device.type):
        dtype = torch.get_autocast_dtype(h.device.type)
    else:
        dtype = torch.promote_types(h.dtype, W.dtype)
    return h.to(dtype), W.to(dtype)
