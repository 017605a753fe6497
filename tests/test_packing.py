"""The packed layout (documents end to end in one row, attention and RoPE positions restarting at each) against
the padded one (a document a row, right-padded, masked by length), kept here as the reference: per-document
logits, the CE and KD losses and every parameter's gradient, for the teacher and for students of every placement,
and the boundary monitor's numbers, each with Qwen3's causal attention and with a sliding window shorter than
most documents (`attention_window`, the mechanism control's attention), which cuts inside them. The math is the
same; only the order of floating-point sums differs, so the comparisons run in float64, where that order moves a
result by ~1e-15 relative (the tolerances leave 1e5 of room for sums over a few hundred terms, and would still
catch a token attending across a document or a wrong position, which move results at 1e-2)."""
from dataclasses import replace
from functools import partial

import pytest
import torch

import diag
import kd
import model
import nets
from plumbing.hf_qwen3 import ModelConfig

CONFIG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, tie_word_embeddings=False)
WINDOWED = replace(CONFIG, attention_window=4)
LENGTHS = (7, 1, 12, 3, 9)  # mixed lengths, one of a single token (its only position is its boundary token)
EOT = 96
CLOSE = dict(rtol=1e-10, atol=1e-12)  # float64; see the module's docstring


def documents(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.tensor([EOT]), torch.randint(0, EOT, (n,), generator=g)]) for n in LENGTHS]


def layouts(docs):
    """(padded ids, targets, mask), (packed ids, targets, mask): inputs are a document but its last token."""
    width = max(LENGTHS)
    ids, targets = torch.full((len(docs), width), EOT), torch.full((len(docs), width), EOT)
    for row, d in enumerate(docs):
        ids[row, :len(d) - 1], targets[row, :len(d) - 1] = d[:-1], d[1:]
    mask = torch.arange(width)[None] < torch.tensor(LENGTHS)[:, None]
    packed_ids, packed_targets = torch.cat([d[:-1] for d in docs])[None], torch.cat([d[1:] for d in docs])[None]
    return (ids, targets, mask), (packed_ids, packed_targets, torch.ones_like(packed_ids, dtype=torch.bool))


def per_document(padded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A padded (B, T, ...) output's real positions, documents end to end: the packed layout's order."""
    return padded[mask]


@pytest.fixture(scope="module", params=[CONFIG, WINDOWED], ids=["causal", "window-4"])
def teacher(request):
    """Every test below runs with each attention: the students take the teacher's config."""
    t = model.Qwen3(request.param)
    t.init_weights(0)
    return t.double().eval().requires_grad_(False)


def test_the_teachers_logits_are_the_padded_ones(teacher):
    (ids, _, mask), (packed, _, _) = layouts(documents())
    torch.testing.assert_close(teacher(packed, doc_lengths=LENGTHS)[0], per_document(teacher(ids), mask), **CLOSE)


def test_a_document_attends_only_to_itself(teacher):
    """Changing one document changes no other document's outputs in the packed row (and does change its own)."""
    docs = documents()
    (_, _, _), (packed, _, _) = layouts(docs)
    docs[2] = documents(seed=1)[2]
    (_, _, _), (changed, _, _) = layouts(docs)
    a, b = (teacher(x, doc_lengths=LENGTHS)[0].split(LENGTHS) for x in (packed, changed))
    for i, (x, y) in enumerate(zip(a, b)):
        (torch.testing.assert_close(x, y, rtol=0, atol=0) if i != 2 else pytest.raises(AssertionError,
                                                                                         torch.testing.assert_close, x, y))


@pytest.mark.parametrize("norm", sorted(set(model.PLACEMENTS) - {"hybrid-first"}))
def test_a_students_losses_and_gradients_are_the_padded_ones(teacher, norm):
    """KD (the teacher's hidden states included) and CE losses, their gradients on every parameter, and the
    logits of each document, packed against padded, for every placement, with two of three blocks active."""
    (ids, targets, mask), (packed, packed_targets, packed_mask) = layouts(documents())
    results = []
    for x, y, m, lengths in ((ids, targets, mask, None), (packed, packed_targets, packed_mask, LENGTHS)):
        student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=1, norm=norm, seed=0).double()
        hidden = teacher(x, output_fn=nets.hidden_only, doc_lengths=lengths)
        loss, kd_term, ce_term = student(x, active_blocks=2, doc_lengths=lengths, output_fn=partial(
            kd.kd_loss, teacher_hidden=hidden, teacher_head_weight=teacher.head_weight, targets=y, mask=m, chunk_size=16))
        loss.backward()
        ce, _ = student(x, doc_lengths=lengths, output_fn=partial(kd.ce_loss, targets=y, mask=m, chunk_size=16))
        logits = student(x, active_blocks=2, doc_lengths=lengths)
        grads = {name: p.grad.clone() for name, p in student.named_parameters() if p.grad is not None}
        results.append((loss, kd_term, ce_term, ce, logits[m], grads))
    (*padded, padded_grads), (*packed_out, packed_grads) = results
    for a, b in zip(padded, packed_out):
        torch.testing.assert_close(b.detach(), a.detach(), **CLOSE)
    assert padded_grads.keys() == packed_grads.keys() and len(padded_grads) > 5
    for name in padded_grads:
        torch.testing.assert_close(packed_grads[name], padded_grads[name], **CLOSE, msg=name)


def test_the_monitors_numbers_are_the_padded_ones(teacher):
    """The boundary monitor's row (RMS moments, the boundary token's RMS over the others', the massive ratio,
    each head's attention on its document's first token) from a packed forward equals the padded forward's."""
    (ids, _, mask), (packed, _, packed_mask) = layouts(documents())
    rows = []
    for x, m, lengths in ((ids, mask, None), (packed, packed_mask, LENGTHS)):
        student = model.Student.from_teacher(teacher, blocks=3, layers_per_block=1, norm="pre", seed=0).double()
        student.capture_boundaries = True
        student(x, doc_lengths=lengths, output_fn=nets.hidden_only)
        first = None if lengths is None else torch.zeros_like(m).index_fill_(
            1, torch.tensor((0, *LENGTHS[:-1])).cumsum(0), True)
        rows.append(nets.monitor_row(student.captured, m, first))
    padded, packed_row = rows
    for a, b in zip(padded["boundaries"], packed_row["boundaries"]):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == (a[key] if isinstance(a[key], str) else pytest.approx(a[key], rel=1e-10)), key
    assert all(x is not None for x in padded["first_attention"])
    for a, b in zip(padded["first_attention"], packed_row["first_attention"]):
        assert b == pytest.approx(a, rel=1e-6)  # attention_to_first scores in float32 whatever the model's dtype
    assert diag.row_starts(mask).sum() == len(LENGTHS)


@pytest.mark.parametrize("config", [CONFIG, WINDOWED], ids=["causal", "window-4"])
def test_documents_of_one_length_attend_as_one_batch_bit_for_bit(config):
    """A run of documents of one length (a packed row lays them side by side, longest first) attends in one batched
    SDPA call: in fp32 its outputs and the gradients of q, k and v equal, bit for bit, each document's own call
    (the kernel works on each (document, head) apart, so batching moves no sum)."""
    attention = model.Attention(config)
    lengths = (9, 9, 9, 5, 5, 2, 1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, sum(lengths), config.head_dim, generator=g, requires_grad=True)
               for heads in (config.num_attention_heads, config.num_key_value_heads, config.num_key_value_heads))
    attention.doc_lengths = lengths
    batched = attention.document_attention(q, k, v)
    alone = torch.cat([attention.causal(a, b, c) for a, b, c in zip(*(t.split(lengths, 2) for t in (q, k, v)))], 2)
    assert torch.equal(batched, alone)
    weights = torch.randn(batched.shape, generator=g)
    grads = [torch.autograd.grad((y * weights).sum(), (q, k, v)) for y in (batched, alone)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))
