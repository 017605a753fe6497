"""kd.py against a naive full-logit implementation written here (sharing no code with kd.py)."""

import pytest
import torch
import torch.nn.functional as F

import kd

B, T, H_S, H_T, V = 5, 10, 16, 24, 37   # 50 token positions; the teacher is wider than the student


def naive_terms(h_S, W_S, h_T, W_T, y, mask, tau):
    """(kd_term, ce_term, entropy_sum) from full logits: tau^2*KL and CE means over real targets."""
    z_S, z_T = h_S @ W_S.T, h_T @ W_T.T
    log_q_S, log_q_T = F.log_softmax(z_S / tau, -1), F.log_softmax(z_T / tau, -1)
    kl = tau**2 * (log_q_T.exp() * (log_q_T - log_q_S)).sum(-1)
    ce = F.cross_entropy(z_S.reshape(-1, V), y.reshape(-1), reduction="none").reshape(y.shape)
    entropy = -(log_q_T.exp() * log_q_T).sum(-1)
    n = mask.sum()
    return kl[mask].sum() / n, ce[mask].sum() / n, entropy[mask].sum()


def make_inputs(dtype=torch.float64, seed=0, lengths=(10, 7, 3, 9, 1)):
    g = torch.Generator().manual_seed(seed)
    h_S = torch.randn(B, T, H_S, generator=g, dtype=dtype).requires_grad_()
    W_S = (torch.randn(V, H_S, generator=g, dtype=dtype) * 0.5).requires_grad_()
    h_T = torch.randn(B, T, H_T, generator=g, dtype=dtype)
    W_T = torch.randn(V, H_T, generator=g, dtype=dtype) * 0.5
    y = torch.randint(V, (B, T), generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]   # right padding
    y[~mask] = -100                    # never a valid id: padding targets must not be read
    return h_S, W_S, h_T, W_T, y, mask


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.fixture
def small_row_blocks(monkeypatch):
    """3 rows per softmax block, so a chunk of 7 splits into blocks of 3, 3 and 1."""
    monkeypatch.setitem(kd.ROW_BLOCK_ELEMENTS, "cpu", 3 * V)


@pytest.mark.parametrize("tau", [1.0, 2.0])
@pytest.mark.parametrize("alpha,gamma", [(0.7, 0.3), (1.0, 0.0), (0.0, 1.0)])
def test_matches_naive_in_value_and_gradients(small_row_blocks, tau, alpha, gamma):
    h_S, W_S, h_T, W_T, y, mask = make_inputs()
    assert mask.sum() == 30 and 30 % 7 != 0   # chunks of 7 real tokens: 4 full, 1 partial
    loss, kd_term, ce_term = kd.kd_loss(h_S, W_S, h_T, W_T, y, mask, alpha=alpha, gamma=gamma, tau=tau,
                                        chunk_size=7)
    ref_kd, ref_ce, _ = naive_terms(h_S, W_S, h_T, W_T, y, mask, tau)
    ref_loss = alpha * ref_kd + gamma * ref_ce
    torch.testing.assert_close(kd_term, ref_kd.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(ce_term, ref_ce.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-12, atol=0)
    assert not kd_term.requires_grad and not ce_term.requires_grad
    g_h, g_W = grads(loss, h_S, W_S)
    for got, want in zip((g_h, g_W), grads(ref_loss, h_S, W_S)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    assert g_h[~mask].abs().max() == 0 and g_h[mask].abs().min() > 0   # padding gets no gradient


def test_gradcheck():
    g = torch.Generator().manual_seed(1)
    h_S = torch.randn(2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    W_S = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    h_T = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    W_T = torch.randn(6, 5, generator=g, dtype=torch.float64)
    y = torch.randint(6, (2, 4), generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    fn = lambda h, w: kd.kd_loss(h, w, h_T, W_T, y, mask, tau=2.0, chunk_size=2)[0]
    assert torch.autograd.gradcheck(fn, (h_S, W_S))


def test_global_denominator_makes_micro_batches_add_up():
    h_S, W_S, h_T, W_T, y, mask = make_inputs()
    whole = kd.kd_loss(h_S, W_S, h_T, W_T, y, mask, chunk_size=7)[0]
    halves = [kd.kd_loss(h_S[rows], W_S, h_T[rows], W_T, y[rows], mask[rows], chunk_size=7,
                         denominator=mask.sum())[0] for rows in (slice(0, 2), slice(2, B))]
    torch.testing.assert_close(halves[0] + halves[1], whole, rtol=1e-12, atol=0)
    assert not torch.allclose(halves[0], whole)
    for got, want in zip(grads(halves[0] + halves[1], h_S, W_S), grads(whole, h_S, W_S)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("case", ["all_padding", "zero_denominator"])
def test_no_real_targets_gives_zero_not_nan(case):
    h_S, W_S, h_T, W_T, y, mask = make_inputs()
    if case == "all_padding":
        mask = torch.zeros_like(mask)
    loss, kd_term, ce_term = kd.kd_loss(h_S, W_S, h_T, W_T, y, mask, chunk_size=7,
                                        denominator=0 if case == "zero_denominator" else None)
    assert loss.item() == 0 and kd_term.item() == 0 and ce_term.item() == 0
    g_h, g_W = grads(loss, h_S, W_S)
    assert g_h.abs().max() == 0 and g_W.abs().max() == 0


def test_bf16_close_to_fp32_reference_with_bf16_grads():
    h_S, W_S, h_T, W_T, y, mask = make_inputs(dtype=torch.bfloat16)
    loss, kd_term, ce_term = kd.kd_loss(h_S, W_S, h_T, W_T, y, mask, chunk_size=7)
    assert loss.dtype == torch.float32
    g_h, g_W = grads(loss, h_S, W_S)
    assert g_h.dtype == g_W.dtype == torch.bfloat16

    ref = [t.detach().float().requires_grad_(t.requires_grad) for t in (h_S, W_S, h_T, W_T)]
    ref_kd, ref_ce, _ = naive_terms(*ref, y, mask, tau=1.0)
    ref_loss = 0.7 * ref_kd + 0.3 * ref_ce
    # bf16 logits carry ~3 significant digits; the softmax math itself is fp32.
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-2, atol=0)
    torch.testing.assert_close(kd_term, ref_kd.detach(), rtol=3e-2, atol=1e-3)
    for got, want in zip((g_h, g_W), grads(ref_loss, ref[0], ref[1])):
        assert (got.float() - want).norm() / want.norm() < 2e-2


def test_autocast_bf16_hidden_with_fp32_master_head():
    h_S, W_S, h_T, W_T, y, mask = make_inputs(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = kd.kd_loss(h_S.bfloat16(), W_S, h_T.bfloat16(), W_T, y, mask, chunk_size=7)[0]
    g_h, g_W = grads(loss, h_S, W_S)
    assert g_h.dtype == g_W.dtype == torch.float32
    ref_kd, ref_ce, _ = naive_terms(h_S, W_S, h_T, W_T, y, mask, tau=1.0)
    ref_loss = 0.7 * ref_kd + 0.3 * ref_ce
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-2, atol=0)
    assert (g_W - grads(ref_loss, W_S)[0]).norm() / g_W.norm() < 3e-2


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_kd_sums_soft_ce_is_kl_plus_teacher_entropy(small_row_blocks, tau):
    h_S, W_S, h_T, W_T, y, mask = make_inputs()
    sums = kd.kd_sums(h_S, W_S, h_T, W_T, y, mask, tau=tau, chunk_size=7)
    ref_kd, ref_ce, entropy = naive_terms(h_S, W_S, h_T, W_T, y, mask, tau)
    n = mask.sum().item()
    assert sums["n"].item() == n and all(v.dtype == torch.float64 for v in sums.values())
    torch.testing.assert_close(sums["kl"], ref_kd.detach() * n, rtol=1e-12, atol=0)
    torch.testing.assert_close(sums["ce"], ref_ce.detach() * n, rtol=1e-12, atol=0)
    torch.testing.assert_close(sums["soft_ce"] - sums["kl"], tau**2 * entropy.detach(), rtol=1e-12, atol=0)
    assert entropy > 1.0                       # the identity above is not trivially 0 == 0


def test_ce_loss_equals_cross_entropy_on_real_targets():
    h_S, W_S, _, _, y, mask = make_inputs()
    loss, ce_term = kd.ce_loss(h_S, W_S, y, mask, chunk_size=7)
    ref = F.cross_entropy((h_S @ W_S.T)[mask], y[mask])
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(ce_term, ref.detach(), rtol=1e-12, atol=0)
    for got, want in zip(grads(loss, h_S, W_S), grads(ref, h_S, W_S)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    # no teacher: kd_sums reports ce and n only
    assert set(kd.kd_sums(h_S, W_S, None, None, y, mask)) == {"ce", "n"}


def test_without_grad_same_values_and_teacher_gets_no_gradient():
    h_S, W_S, h_T, W_T, y, mask = make_inputs()
    h_T.requires_grad_()
    with_grad = kd.kd_loss(h_S, W_S, h_T, W_T, y, mask, tau=2.0, chunk_size=7)
    with torch.no_grad():
        without = kd.kd_loss(h_S, W_S, h_T, W_T, y, mask, tau=2.0, chunk_size=7)
    assert not without[0].requires_grad
    for a, b in zip(with_grad, without):
        torch.testing.assert_close(a.detach(), b, rtol=1e-14, atol=0)
    with_grad[0].backward()
    assert h_T.grad is None and h_S.grad is not None


def test_the_logit_buffers_unused_columns_are_zeros_whatever_memory_they_reuse(monkeypatch):
    """On a CPU with AMX, oneDNN's bf16 matmul reads an operand's row up to its stride: a NaN left in the
    buffer's unused tail columns by an earlier tensor made every gradient NaN (tests/test_launch_path's bf16
    runs diverged at step 1). The buffer is made from memory full of NaN here, as reused memory can be: its tail
    must be zeros, and a bf16 loss over 50 tokens at V = 513 (the shapes that failed) must give finite
    gradients close to float32's."""
    real_zeros, real_empty = torch.zeros, torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")).zero_())
    buffer = kd._logit_buffer(50, 513, torch.empty(1, dtype=torch.bfloat16))
    assert buffer.stride(0) > 513 and torch.equal(buffer.as_strided((50, buffer.stride(0)), buffer.stride())[:, 513:],
                                                  real_zeros(50, buffer.stride(0) - 513, dtype=torch.bfloat16))
    g = torch.Generator().manual_seed(0)
    h_S = torch.randn(50, 32, generator=g).bfloat16().requires_grad_()
    W_S = (torch.randn(513, 32, generator=g) * 8 / 32**0.5).bfloat16().requires_grad_()
    h_T, W_T = torch.randn(50, 32, generator=g), torch.randn(513, 32, generator=g) * 8 / 32**0.5
    y, mask = torch.randint(0, 513, (50,), generator=g), torch.ones(50, dtype=torch.bool)
    loss, _, _ = kd.kd_loss(h_S, W_S, h_T, W_T, y, mask, chunk_size=50)
    g_h, g_W = grads(loss, h_S, W_S)
    ref = [t.detach().float().requires_grad_(t.requires_grad) for t in (h_S, W_S)]
    ref_loss, _, _ = kd.kd_loss(*ref, h_T, W_T, y, mask, chunk_size=50)
    for got, want in zip((g_h, g_W), grads(ref_loss, *ref)):
        assert torch.isfinite(got).all() and (got.float() - want).norm() / want.norm() < 2e-2  # bf16's 3 digits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_shared_teacher_log_probs_give_the_same_loss_gradients_and_sums_bit_for_bit(small_row_blocks, tau, dtype):
    """Students in lockstep share one teacher_log_probs per micro-batch (and evaluations one per validation
    batch): it must be exactly what the loss computes from the teacher's hidden states, since the same matmuls
    and log-softmax run on the same chunks and blocks; so equality here is exact, in fp32 and under bf16 autocast."""
    h_S, W_S, h_T, W_T, y, mask = (t.detach().float() if t.is_floating_point() else t for t in make_inputs())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        log_q_T = kd.teacher_log_probs(h_T, W_T, mask, tau=tau, chunk_size=7)
        assert log_q_T.shape == (int(mask.sum()), V) and log_q_T.dtype == torch.float32
        results = []
        for teacher in ({"teacher_hidden": h_T, "teacher_head_weight": W_T},
                        {"teacher_hidden": None, "teacher_head_weight": None, "teacher_log_probs": log_q_T}):
            h, w = h_S.clone().requires_grad_(), W_S.clone().requires_grad_()
            loss, kd_term, ce_term = kd.kd_loss(h, w, targets=y, mask=mask, tau=tau, chunk_size=7, **teacher)
            sums = kd.kd_sums(h_S, W_S, targets=y, mask=mask, tau=tau, chunk_size=7, **teacher)
            results.append((loss.detach(), kd_term, ce_term, *grads(loss, h, w), *sums.values()))
    for direct, shared in zip(*results):
        assert torch.equal(direct, shared)
    assert results[0][1] > 0 and results[0][3].abs().sum() > 0  # a KD term and gradients to compare
