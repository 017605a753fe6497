"""Lockstep training (grow.train_together): the suite's runs on one teacher pass per batch give what
each run gives alone, bit for bit, through kills at any moment and across ranks."""
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import make_config
from safetensors.torch import load_file

import config
import data
import grow
import nets
import rundir
from plumbing import checkpoint, devices, errors

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["pre-joint", "post-joint", "pre-grow", "post-grow", "pre-freeze", "post-freeze"]
STEPS = 4  # per phase


def suite(shards, teacher_dir, root: Path, **overrides) -> list[tuple[config.RunConfig, Path]]:
    """The replay runs of one seed (Tables 1 and A3), freeze starting from grow's phase 0 as in repro.py."""
    train, val = shards
    jobs = []
    for name in NAMES:
        norm, protocol = name.split("-")
        start_from = str(root / f"{norm}-grow" / "phase-0") if protocol == "freeze" else ""
        c = make_config(name=name, norm=norm, protocol=protocol, train_data=str(train.path), val_data=str(val.path),
                   teacher=str(teacher_dir), layers_per_block=1, phase_steps=STEPS, global_batch=8, micro_batch=4,
                   replay_docs=40, eval_interval=2, eval_batch=8, checkpoint_interval=3, loss_chunk=50, lr=3e-3,
                   min_lr=3e-5, warmup_frac=0.25, start_from=start_from, **overrides)
        jobs.append((c, root / name))
    return jobs


def kept_weights(folder: Path) -> dict:
    """A kept checkpoint's tensors: model.safetensors (one process) or the files of its HF index (FSDP2)."""
    return {k: v for file in sorted(set(checkpoint.tensor_files(folder).values())) for k, v in load_file(file).items()}


def without_time(rows):
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


def assert_same_runs(a: Path, b: Path, across_ranks: bool = False):
    """Every kept checkpoint, metrics.jsonl (but wall time) and done.json equal, bit for bit. Across
    ranks only the logged gradient norm may differ: each rank sums its shard's squares in float64 and
    the ranks' sums are added in another order than one process's, a float64 rounding difference
    (relative n * 2^-53 for n squares; 1e-12 bounds it with room). The clipping coefficient, rounded
    to float32, is the same (devices.clip_gradients), so the weights are."""
    for name in NAMES:
        kept = sorted(p.name for p in (a / name).iterdir() if p.name.startswith(("phase-", "step-")))
        assert kept == sorted(p.name for p in (b / name).iterdir() if p.name.startswith(("phase-", "step-"))), name
        for ckpt in kept:
            x, y = kept_weights(a / name / ckpt), kept_weights(b / name / ckpt)
            assert x.keys() == y.keys()
            for k in x:
                assert torch.equal(x[k], y[k]), f"{name}/{ckpt}/{k} differs"
        rows_a, rows_b = without_time(rundir.read_metrics(a / name)), without_time(rundir.read_metrics(b / name))
        if across_ranks:
            for ra, rb in zip(rows_a, rows_b):
                if "grad_norm" in ra:
                    assert rb.pop("grad_norm") == pytest.approx(ra.pop("grad_norm"), rel=1e-12), (name, ra["step"])
        assert rows_a == rows_b, name
        assert json.loads((a / name / "done.json").read_text()) == json.loads((b / name / "done.json").read_text()), name


@pytest.fixture(scope="module")
def separate(tiny_shards, tiny_teacher_dir, tmp_path_factory):
    """Each run alone, in an order where grow's phase 0 exists before freeze starts from it."""
    root = tmp_path_factory.mktemp("separate")
    for c, run_dir in suite(tiny_shards, tiny_teacher_dir, root):
        grow.train(c, run_dir)
    return root


def counting_teacher(monkeypatch) -> list:
    """Counts the teacher module's forward passes with a hook on the module itself."""
    calls = []
    real = nets.load_teacher

    def load(*args, **kwargs):
        teacher = real(*args, **kwargs)
        teacher.net.register_forward_hook(lambda module, inputs, output: calls.append(inputs[0].shape))
        return teacher
    monkeypatch.setattr(nets, "load_teacher", load)
    return calls


def test_lockstep_is_bit_identical_to_separate_runs_on_one_teacher_pass_per_micro_batch(
        separate, tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    calls, shared = counting_teacher(monkeypatch), []
    real_log_probs = nets.Teacher.log_probs
    def log_probs(self, hidden, batch, config, key=None):
        shared.append((key, real_log_probs(self, hidden, batch, config, key)))
        return shared[-1][1]
    monkeypatch.setattr(nets.Teacher, "log_probs", log_probs)
    jobs = suite(tiny_shards, tiny_teacher_dir, tmp_path)
    results = grow.train_together(jobs)
    assert_same_runs(separate, tmp_path)
    # ... with the teacher's log-probabilities made once per micro-batch for the runs that share it, and kept for
    # the validation set: bit-identical all the same
    assert sum(key is None and lp is not None for key, lp in shared) == 3 * STEPS * 8 // 4
    assert any(key is not None and lp is not None for key, lp in shared)
    assert results == [json.loads((separate / n / "done.json").read_text()) for n in NAMES]
    # The six runs cover global steps 0..3*STEPS-1 of the replayed shard (40 documents, 5 steps an epoch); each step
    # has 8 / 4 = 2 micro-batches, read by the teacher once for every run at that step, and in the epochs after the
    # first not at all (each document's states are kept from its first-epoch micro-batch: nets.Teacher.
    # training_hidden). The 16 validation documents (2 batches of 8) are read once and kept for every evaluation.
    micro_batches, first_epoch_steps = 8 // 4, jobs[0][0].replay_docs // 8
    val_batches = 16 // 8
    assert first_epoch_steps < 3 * STEPS and len(calls) == first_epoch_steps * micro_batches + val_batches
    # Each call one packed row (1, N): the tokens it read are the first epoch's documents' and the validation set's.
    train, val = tiny_shards
    batcher = data.Batcher(train, 8, seed=42, replay_docs=jobs[0][0].replay_docs, micro_batch=4)
    tokens = sum(next(batcher).global_targets for _ in range(first_epoch_steps)) + int((val.lengths - 1).sum())
    assert all(shape[0] == 1 for shape in calls) and sum(shape[1] for shape in calls) == tokens


def test_separate_runs_pay_for_every_teacher_pass(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    """The count the lockstep saves: alone, pre-grow reads the teacher once per micro-batch of the replayed shard's
    first epoch (5 steps) and the validation set once; with no first-epoch states kept (a GPU's, or FSDP2's),
    once per micro-batch of each of its steps."""
    calls = counting_teacher(monkeypatch)
    (c, run_dir), = suite(tiny_shards, tiny_teacher_dir, tmp_path / "kept")[2:3]
    grow.train(c, run_dir)
    assert len(calls) == c.replay_docs // 8 * 2 + 2
    monkeypatch.setattr(nets, "FIRST_EPOCH_BYTES", 0)
    calls.clear()
    (c, run_dir), = suite(tiny_shards, tiny_teacher_dir, tmp_path / "none")[2:3]
    grow.train(c, run_dir)
    assert len(calls) == 3 * STEPS * 2 + 2


def test_a_documents_teacher_states_are_its_first_epoch_micro_batchs(tiny_shards, tiny_teacher_dir):
    """training_hidden: a later epoch's micro-batch is its documents' states from the first epoch's micro-batches
    that held them, bit for bit (so a run resumed there, its teacher cold, computes the same), and within the
    rounding of a plain forward over the micro-batch itself: only the matmuls' row blocking differs, which moves the
    last bits of an fp32 dot product over the tiny teacher's width (2e-6 relative bounds a few ulp per layer)."""
    train, _ = tiny_shards
    teacher = nets.load_teacher(make_config(teacher=str(tiny_teacher_dir)), devices.Dist(), torch.float32)
    batcher = data.Batcher(train, 8, seed=42, replay_docs=40, micro_batch=4)
    first = [micro for _ in range(5) for micro in next(batcher).micro_batches]
    later = next(batcher).micro_batches[1]
    assert [sorted(m.doc_ids) for m in first] == [sorted(ids) for ids in batcher.first_epoch_micro_batches()]
    got = teacher.training_hidden(later, batcher)
    holders = [next(m for m in first if doc in m.doc_ids) for doc in later.doc_ids]
    assert len({id(m) for m in holders}) > 1  # the documents come from several first-epoch micro-batches
    for doc, row, holder in zip(later.doc_ids, got[0].split(list(later.doc_lengths)), holders):
        start = sum(holder.doc_lengths[:holder.doc_ids.index(doc)])
        alone = teacher.hidden(holder.input_ids, doc_lengths=holder.doc_lengths)[0, start:start + len(row)]
        assert torch.equal(row, alone)
    plain = teacher.hidden(later.input_ids, doc_lengths=later.doc_lengths)
    torch.testing.assert_close(got, plain, rtol=2e-6, atol=2e-6)
    assert teacher.training_hidden(first[3], batcher) is teacher.held[tuple(first[3].doc_ids)]  # the epoch itself


def test_the_long_controls_share_one_teacher_pass_on_their_fresh_documents(tiny_shards, tiny_teacher_dir, tmp_path,
                                                                            monkeypatch):
    """The long joint controls continue onto fresh documents, which pre- and post-norm read alike: grow.lockstep_groups
    puts them in a group of their own after the replay runs (training and the dry run group alike), where each step's
    micro-batches pass through the teacher once for both, and each run equals the same run trained alone."""
    def jobs(root: Path):
        out = []
        for norm in ("pre", "post"):
            joint = suite(tiny_shards, tiny_teacher_dir, root)[NAMES.index(f"{norm}-joint")]
            long = replace(joint[0], name=f"{norm}-joint-long", protocol="joint-long", joint_phases=2,
                           start_from=str(joint[1] / "phase-0"))
            out += [joint, (long, root / long.name)]
        return out
    alone = jobs(tmp_path / "alone")
    for c, run_dir in sorted(alone, key=lambda job: job[0].protocol):  # each joint before the controls adopt it
        grow.train(c, run_dir)
    calls, together = counting_teacher(monkeypatch), jobs(tmp_path / "together")
    groups = grow.lockstep_groups(together)
    assert [[c.name for c, _ in group] for group in groups] == [["pre-joint", "post-joint"],
                                                                ["pre-joint-long", "post-joint-long"]]
    for group in groups:
        grow.train_together(group)
    # Each group: STEPS steps of 8 / 4 = 2 micro-batches, once for both runs; the validation set's 2 batches once
    assert len(calls) == 2 * (STEPS * 2 + 2)
    for (_, a), (_, b) in zip(alone, together):
        assert without_time(rundir.read_metrics(a)) == without_time(rundir.read_metrics(b)), a.name
        assert json.loads((a / "done.json").read_text()) == json.loads((b / "done.json").read_text()), a.name


def start(configs, kill_at: str = ""):
    env = {**os.environ, "NORMGROW_KILL_AT": kill_at}
    return subprocess.run([sys.executable, str(ROOT / "tests" / "run_grow.py"), *map(str, configs)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_sigkill_anywhere_in_lockstep_resumes_bit_identical(separate, tiny_shards, tiny_teacher_dir, tmp_path):
    jobs = suite(tiny_shards, tiny_teacher_dir, tmp_path)
    configs = []
    for c, run_dir in jobs:
        run_dir.mkdir()
        (run_dir / "config.json").write_text(json.dumps(asdict(c)))
        configs.append(run_dir / "config.json")
    # In the order they happen: mid phase 0 before any checkpoint; the moment the first run finishes
    # (its partner at the same step not yet stepped); grow's phase transition, before freeze adopts
    # it; freeze just after adopting; mid freeze's phase 1; the last step's checkpoint, before done.json.
    for kill_at in ("stepped:post-grow:2", "done:pre-joint:4", "saved:post-grow:4", "opened:post-freeze:4",
                    "stepped:pre-freeze:7", "saved:post-grow:12"):
        out = start(configs, kill_at)
        assert out.returncode == -signal.SIGKILL, f"{kill_at} was not reached: {out.stderr[-2000:]}"
        if kill_at == "done:pre-joint:4":  # continued alone, then in lockstep again
            c, run_dir = jobs[1]
            grow.train(c, run_dir)
    c, run_dir = jobs[4]
    grow.train(c, run_dir)  # and the reverse: a run killed in lockstep finished alone
    out = start(configs)
    assert out.returncode == 0, out.stderr[-3000:]
    assert_same_runs(separate, tmp_path)


@pytest.mark.slow
def test_two_ranks_in_lockstep_match_one_process(tiny_shards, tiny_teacher_dir, tmp_path, monkeypatch):
    # Ranks run the teacher on each micro-batch (only one CPU process keeps the first epoch's states, whose rows the
    # matmuls block otherwise: the last bit on AVX2), so the process compared with them does too.
    monkeypatch.setattr(nets, "FIRST_EPOCH_BYTES", 0)
    jobs = suite(tiny_shards, tiny_teacher_dir, tmp_path / "one")
    grow.train_together(jobs)
    configs = []
    for c, run_dir in suite(tiny_shards, tiny_teacher_dir, tmp_path / "two"):
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps(asdict(c)))
        configs.append(run_dir / "config.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "run_grow.py"), *map(str, configs)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert_same_runs(tmp_path / "one", tmp_path / "two", across_ranks=True)


def test_runs_of_different_teachers_are_not_trained_together(tiny_shards, tiny_teacher_dir, tmp_path):
    jobs = suite(tiny_shards, tiny_teacher_dir, tmp_path)[:2]
    jobs[1] = (replace(jobs[1][0], teacher=str(tmp_path / "other")), jobs[1][1])
    with pytest.raises(errors.TrainingError, match="one teacher"):
        grow.train_together(jobs)
