"""Fixed shapes for compiled runs (data.fixed_shape): batches padded to a few bucket widths (and evaluation
batches to their full row count), masked by length, train the same documents in the same order to the same
loss and gradients up to the order of fp32 sums; the compiled layers then compile once per shape."""
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL, distil_config, make_config

import config
import data
import model
import nets
from plumbing import devices

# fp32's unit roundoff: two orders of an n-term fp32 sum differ by at most about n * U32 times the sum of the
# terms' magnitudes.
U32 = 2.0**-24


def test_the_buckets_are_what_the_rule_says():
    widths = {longest: data.bucket_width(longest, 128) for longest in (0, 1, 32, 33, 64, 65, 96, 97, 127, 128)}
    assert widths == {0: 32, 1: 32, 32: 32, 33: 64, 64: 64, 65: 96, 96: 96, 97: 128, 127: 128, 128: 128}
    assert sorted({data.bucket_width(n, 32) for n in range(33)}) == [8, 16, 24, 32]   # the tests' shards
    assert sorted({data.bucket_width(n, 130) for n in range(131)}) == [33, 66, 99, 130]  # the last one is max_len


def real_tokens(batch: data.Batch) -> tuple[list, list]:
    return batch.input_ids[batch.mask].tolist(), batch.targets[batch.mask].tolist()


def documents(batch: data.Batch) -> dict[int, tuple[list, list]]:
    """{document: its real inputs and targets}, from padded rows or a packed row."""
    lengths = batch.lengths[:len(batch.doc_ids)].tolist()
    inputs, targets = (t[batch.mask].split(lengths) for t in (batch.input_ids, batch.targets))
    return {doc: (i.tolist(), t.tolist()) for doc, i, t in zip(batch.doc_ids, inputs, targets)}


def test_fixed_shapes_train_the_same_documents_in_the_same_order(tiny_shards):
    train, val = tiny_shards
    max_len = train.manifest["max_len"]
    plain, fixed = (data.Batcher(train, 8, seed=3, replay_docs=60, micro_batch=1, fixed_shapes=f) for f in (False, True))
    widths = set()
    for _ in range(12):
        a, b = next(plain), next(fixed)
        assert (a.doc_ids, a.global_targets, a.step) == (b.doc_ids, b.global_targets, b.step)
        for x, y in zip(a.micro_batches, b.micro_batches):
            assert real_tokens(x) == real_tokens(y) and x.doc_ids == y.doc_ids and x.n_targets == y.n_targets
            assert torch.equal(y.lengths, x.lengths) and y.input_ids.shape[0] == 1
            assert y.input_ids.shape[1] == data.bucket_width(x.input_ids.shape[1], max_len) >= x.input_ids.shape[1]
            assert torch.equal(y.mask, torch.arange(y.input_ids.shape[1])[None, :] < y.lengths[:, None])  # by length
            widths.add(y.input_ids.shape[1])
    assert widths <= {8, 16, 24, 32} and len(widths) > 1
    # Evaluation: every document once, each batch the same documents; every batch of batch_size rows (16 in 5s).
    plain, fixed = list(data.eval_batches(val, 5)), list(data.eval_batches(val, 5, fixed_shapes=True))
    assert [documents(x) for x in plain] == [documents(y) for y in fixed]  # a packed row lays them longest first
    assert [y.input_ids.shape[0] for y in fixed] == [5, 5, 5, 5] and [len(x.doc_ids) for x in plain] == [5, 5, 5, 1]
    assert fixed[-1].lengths[1:].tolist() == [0, 0, 0, 0] and not fixed[-1].mask[1:].any()


def test_a_batch_padded_to_its_bucket_gives_the_same_loss_and_gradients(tiny_shards):
    """Padded positions sit after each row's document: causal attention keeps real queries from them, the
    loss reads real targets only, and their gradients are exactly zero. What padding changes is the order and
    blocking of sums: the longest of them, the weight gradients' over every position of the batch (n = rows
    x width), differs between two orders by at most about n * U32 of its terms' magnitudes; so the loss and
    every gradient must agree within n * U32 of their size (a masking bug moves them by O(1))."""
    train, _ = tiny_shards
    teacher = model.Qwen3(TINY_MODEL)
    teacher.init_weights(0)
    teacher.eval().requires_grad_(False)
    c = make_config(protocol="joint", layers_per_block=1, loss_chunk=7)
    student = model.Student.from_teacher(teacher, c.blocks, c.layers_per_block, "post", seed=0)
    phase = config.plan_phases(c)[0]
    short = np.flatnonzero(train.lengths < 26)[:4].tolist()  # widths under the top bucket, so padding is added
    batch = data.make_batch(train, short)
    padded = data.fixed_shape(batch, train, rows=6)
    assert padded.input_ids.shape == (6, data.bucket_width(batch.input_ids.shape[1], 32)) != batch.input_ids.shape
    results = []
    for x in (batch, padded):
        student.zero_grad(set_to_none=True)
        hidden = teacher(x.input_ids, output_fn=nets.hidden_only)
        loss, _, _ = nets.loss_fn(c, x, hidden, teacher.head_weight, phase, x.n_targets, student)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in student.named_parameters() if p.grad is not None}))
    (loss, grads), (padded_loss, padded_grads) = results
    n = padded.input_ids.numel()
    torch.testing.assert_close(padded_loss, loss, rtol=n * U32, atol=0)
    assert padded_grads.keys() == grads.keys() and len(grads) > 10
    for name, grad in grads.items():
        torch.testing.assert_close(padded_grads[name], grad, rtol=0, atol=n * U32 * grad.abs().max().item(), msg=name)


@pytest.mark.slow
def test_compiled_layers_match_eager_and_compile_once_per_bucket(tiny_shards, tiny_teacher_dir):
    """--compile: the layers compiled for fixed shapes, once per bucket width (lengths 9 and 12 share the
    16-wide bucket), with outputs and gradients equal to eager ones within fp32 rounding."""
    from torch._dynamo.utils import counters
    c = distil_config(tiny_shards, tiny_teacher_dir, protocol="joint")
    ctx = devices.Dist()
    teacher = nets.load_teacher(c, ctx, torch.float32)
    eager = nets.build_model(c, teacher, ctx, torch.float32)
    compiled = nets.build_model(replace(c, compile=True), teacher, ctx, torch.float32)
    torch._dynamo.reset()
    counters.clear()
    for length in (9, 12, 17, 31):
        width = data.bucket_width(length, tiny_shards[0].manifest["max_len"])
        ids = torch.randint(0, 500, (2, width), generator=torch.Generator().manual_seed(length))
        outputs = []
        for net in (eager, compiled):
            net.zero_grad(set_to_none=True)
            hidden = net(ids, output_fn=nets.hidden_only)
            hidden.pow(2).mean().backward()
            outputs.append((hidden.detach(), [p.grad for p in net.parameters() if p.requires_grad]))
        (a, grads_a), (b, grads_b) = outputs
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        for ga, gb in zip(grads_a, grads_b):
            torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-6)
    # One graph for the layers' forward per width (all layers share it): 16, 24 and 32.
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
