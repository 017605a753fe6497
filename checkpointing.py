"""A run's checkpoints: which are due when, written, found and read back, and a run's resume point (what each
folder holds and how it is written: docs/design.md's row for this file). Training waits only while a checkpoint's
tensors are copied to host memory; its files are written on plumbing/writer.py's thread, and whatever reads,
replaces or lets go of a run's checkpoints first waits for those writes (writer.wait_for_writes).

    checkpointing.save_checkpoint(run_dir, net, state, ctx, "phase-0")
    resume, step, totals, elapsed, outcome = checkpointing.resume_point(config, run_dir, net, batcher, ctx)
    checkpointing.load_latest_checkpoint(resume[0], net, optimizer, ctx)  # latest/: once the optimizer exists
"""

import base64
import shutil
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Callable

import torch

import model
import transitions
from plumbing import checkpoint, hf_qwen3, writer
from plumbing.devices import print0
from plumbing.errors import TrainingError, disk_full_reason
from plumbing.faults import kill_point
from rundir import CHECKPOINT_FOLDER, adopt_shared_prefix, read_json


def trainer_state(step, phase, batcher, totals, elapsed, outcome: dict) -> dict:
    """What a resume needs besides the weights; `outcome`: the best validation CE so far and any divergence."""
    rng = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    return {"step": step, "phase": phase, "data": batcher.state_dict(), "totals": totals,
            "elapsed": elapsed, "torch_rng": rng, "outcome": outcome}


def save_due_checkpoints(run_dir: Path, config, net, optimizer, state: dict, ctx, phase_end: bool, moments_go_on: bool):
    """Those due at the trainer state's step: phase-<p>/ at a phase's end, step-<n>/ every snapshot_interval,
    latest/ every checkpoint_interval (and before phase-<p>/ where the next phase keeps AdamW's moments)."""
    step = state["step"]
    save = partial(save_checkpoint, run_dir, net, state, ctx, background=True)
    if phase_end and moments_go_on:
        # Saved before phase-<p>/: a kill between the two resumes from these moments (a tie prefers latest/).
        save("latest", optimizer)
    if phase_end:
        save(f"phase-{state['phase']}")
    elif config.snapshot_interval and step % config.snapshot_interval == 0:
        save(f"step-{step}")
    if not phase_end and step % config.checkpoint_interval == 0:
        save("latest", optimizer)


def save_checkpoint(run_dir: Path, net, state: dict, ctx, name: str, optimizer=None, background: bool = False):
    """Checkpoint <name> (latest/ with the optimizer's state, else a kept one): the run's earlier writes finished
    first, its tensors copied to host memory now (under FSDP2 with the ranks' collectives), its files written on
    the writer thread (`background`) or here. Only the copy blocks training: the plan prices it."""
    writer.wait_for_writes(run_dir)
    writes = writer.writes()
    # the writer thread's barriers go on a group of their own; a job run inline (writes.inline) uses the default one
    own_group = background and not writes.inline and ctx.world > 1
    ranks = writer.WriterRanks(ctx.rank, ctx.world, writer.writer_group() if own_group else None)
    write = (stage_latest(run_dir, net, optimizer, state, ctx.shard_group, ranks) if name == "latest"
             else stage_kept(run_dir, name, net, state, ctx.shard_writers, ctx.shard_group, ranks))
    if background:
        writes.submit(run_dir, write)
    else:
        write()


@contextmanager
def temporary_folder(run_dir: Path, name: str, ranks):
    """run_dir/<name>.tmp, emptied (a kill may leave one); a full disk is one line naming what is still intact."""
    try:
        tmp = run_dir / f"{name}.tmp"
        if ranks.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        ranks.barrier()
        yield tmp
    except Exception as e:  # OSError, or safetensors' own error wrapping one
        why = disk_full_reason(e)
        if not why:
            raise
        intact = newest_checkpoint(run_dir)
        raise TrainingError(f"{why} while writing {run_dir / name}; "
                            + (f"the previous checkpoint {intact[0]} is intact" if intact else "no checkpoint was lost")
                            + ": free some space (or raise the limit) and rerun to resume") from None


def stage_kept(run_dir: Path, name: str, net, state: dict, writers: int, group, ranks) -> Callable[[], None]:
    """A kept checkpoint (phase-<p>/ or step-<n>/): safetensors weights any tool can load and the trainer state, no
    optimizer state (phases restart theirs). Under FSDP2 each rank that holds distinct shards (`group`) copies the
    whole tensors assigned to it (checkpoint.tensor_writers), gathered one at a time, for one file of a standard HF
    sharded checkpoint. Returns the write; rank 0 writes the index, config.json, trainer state and checksums."""
    qwen3 = isinstance(net, model.Qwen3)  # the teacher run's checkpoints are plain HF Qwen3 folders
    weights = {hf_qwen3.hf_name(k) if qwen3 else k: v for k, v in net.state_dict().items()}
    owner = checkpoint.tensor_writers({k: v.numel() * v.element_size() for k, v in weights.items()}, writers)
    mine = {}
    for key, value in weights.items():  # in the same order on every rank: the all-gathers pair up
        whole = value.full_tensor() if hasattr(value, "full_tensor") else value
        if group is not None and owner[key] == group[0]:
            mine[key] = whole.detach().to("cpu", copy=True)  # a copy: training goes on changing the original
        del whole
    # as text now: the trainer state's totals and the model's config change as training goes on
    config_text = checkpoint.json_text(net.config.to_hf() if qwen3 else net.checkpoint_config())
    state_text, step = checkpoint.json_text(state, indent=None), state["step"]

    def write():
        with temporary_folder(run_dir, name, ranks) as tmp:
            if mine:
                file = "model.safetensors" if writers == 1 else checkpoint.hf_shard_file(group[0], writers)
                part = checkpoint.write_weights(tmp, file, mine)
                checkpoint.write_json(tmp / f"part.rank{group[0]}.json", part, indent=None)
            mine.clear()
            ranks.barrier()
            if ranks.is_main:
                part_files = [tmp / f"part.rank{w}.json" for w in range(writers)]  # none from a writer given no tensor
                parts = [checkpoint.loads(part.read_text()) for part in part_files if part.is_file()]
                for part in part_files:
                    part.unlink(missing_ok=True)
                if writers > 1:
                    checkpoint.write_json(tmp / checkpoint.HF_INDEX, checkpoint.hf_index(parts))
                checkpoint.write_atomic(tmp / "config.json", config_text)
                kill_point("writing-kept", run_dir.name, step)
                checkpoint.write_atomic(tmp / "trainer_state.json", state_text)
                checkpoint.write_checksums(tmp, known={p["file"]: p["sha256"] for p in parts})
                checkpoint.replace_folder(tmp, run_dir / name, midway=lambda: kill_point("swapping-kept", run_dir.name,
                                                                                         step))
            ranks.barrier()
    return write


def stage_latest(run_dir: Path, net, optimizer, state: dict, group, ranks) -> Callable[[], None]:
    """latest/: each rank's shards of the weights and AdamW's state, resumable on any number of ranks; the write."""
    if group is not None:
        params = dict(net.named_parameters())
        moments = {f"{fqn}/{key}": value for fqn, p in params.items()
                   for key, value in optimizer.state.get(p, {}).items()}
        staged = {"model": checkpoint.stage_rows(params), "optimizer": checkpoint.stage_rows(moments)}
    state_text, step = checkpoint.json_text(state, indent=None), state["step"]

    def write():
        with temporary_folder(run_dir, "latest", ranks) as tmp:
            if group is not None:
                parts = [checkpoint.write_rows(tmp, "model", staged.pop("model"), *group)]
                kill_point("writing-latest", run_dir.name, step)
                parts.append(checkpoint.write_rows(tmp, "optimizer", staged.pop("optimizer"), *group))
                checkpoint.write_json(tmp / f"part.rank{group[0]}.json", parts, indent=None)
            ranks.barrier()
            if ranks.is_main:  # the index, the trainer state, the checksums, the folder renamed
                part_files = [tmp / f"part.rank{w}.json" for w in range(group[1])]
                index = checkpoint.merge_index([p for part in part_files for p in checkpoint.loads(part.read_text())])
                for part in part_files:
                    part.unlink()
                checkpoint.write_json(tmp / checkpoint.SHARDED_INDEX, index, indent=None)
                checkpoint.write_atomic(tmp / "trainer_state.json", state_text)
                sums = {**index["files"], **{name: checkpoint.sha256(tmp / name)
                                             for name in (checkpoint.SHARDED_INDEX, "trainer_state.json")}}
                checkpoint.write_json(tmp / checkpoint.CHECKSUMS, sums, indent=1)
                checkpoint.replace_folder(tmp, run_dir / "latest",
                                          midway=lambda: kill_point("swapping-latest", run_dir.name, step))
            ranks.barrier()
    return write


# Resume points, best first on a tie: latest/ (weights and AdamW state), phase-<p>/ (a phase starts a fresh
# AdamW), step-<n>/ (mid-phase, AdamW's moments lost: only after damage).
RESUME_RANK = {"latest": 2, "phase": 1, "step": 0}
TRAINER_STATE_KEYS = ("step", "phase", "data", "totals", "elapsed", "torch_rng")


def checkpoints(run_dir: Path) -> list[tuple[int | None, Path]]:
    """(step, folder) of every resume point: an unreadable trainer state's (step None) first, then newest first."""
    writer.wait_for_writes(run_dir)
    found = []
    for ckpt in run_dir.iterdir() if run_dir.is_dir() else []:
        if not CHECKPOINT_FOLDER.fullmatch(ckpt.name) or not ckpt.is_dir():
            continue
        try:
            step = checkpoint.loads((ckpt / "trainer_state.json").read_text())["step"]
            step = step if isinstance(step, int) else None
        except (OSError, ValueError, KeyError, TypeError):
            step = None
        found.append((step, RESUME_RANK[ckpt.name.split("-")[0]], ckpt))
    found.sort(key=lambda f: (f[0] is None, f[0] or 0, f[1]), reverse=True)
    return [(step, ckpt) for step, _, ckpt in found]


def newest_checkpoint(run_dir: Path, verify: bool = False, warn=lambda line: None,
                      ctx=None) -> tuple[Path, dict] | None:
    """The checkpoint to resume from: the newest whose trainer state reads and, with `verify`, whose files match
    their checksums (with `ctx`, the ranks share the hashing and agree); each one passed over is named in a
    warning. A snapshot step-<n>/ is taken only once a damaged checkpoint was passed over."""
    salvaging = False
    for step, ckpt in checkpoints(run_dir):
        if ckpt.name.startswith("step-") and not salvaging:
            continue
        why = "trainer_state.json is unreadable" if step is None else \
            checkpoint.damage(ckpt, (ctx.rank, ctx.world) if ctx else (0, 1)) if verify else ""
        if ctx is not None and verify and not ctx.agree(not why):
            why = why or "a file another rank checked does not match its checksum"
        if why:
            warn(f"{ckpt}: damaged ({why}); resuming from an older checkpoint")
            salvaging = True
            continue
        try:
            return ckpt, read_json(ckpt / "trainer_state.json", *TRAINER_STATE_KEYS)
        except TrainingError as e:
            warn(f"{e}; resuming from an older checkpoint")
    return None


def resume_point(config, run_dir: Path, net, batcher, ctx) -> tuple[tuple[Path, dict] | None, int, dict, float, dict]:
    """The newest intact checkpoint, the same on every rank (None: step 0), after adopting the shared prefix if
    the run has none of its own; with its step, totals, seconds trained and outcome, its data position, RNG state
    and weights restored (latest/'s weights come with its AdamW state: load_latest_checkpoint)."""
    adopting = bool(config.start_from) and newest_checkpoint(run_dir) is None
    if ctx.is_main and adopting:
        adopt_shared_prefix(config, run_dir)
    ctx.barrier()
    resume = newest_checkpoint(run_dir, verify=True, warn=lambda line: print0(ctx, line), ctx=ctx)
    step = resume[1]["step"] if resume else 0
    if not ctx.agree_on(step):  # every rank must resume from the same step, or the run would fork
        raise TrainingError(f"{run_dir}: the ranks found different resume points (rank {ctx.rank}: step {step}); "
                            "the runs folder must be one filesystem that every node shares (or copy it to each)")
    outcome = {"best_ce": None, "diverged": None}
    if not resume:
        return None, 0, {"total_tokens": 0, "active_layer_tokens": 0}, 0.0, outcome
    ckpt, state = resume
    outcome = {**outcome, **state.get("outcome", {})}
    batcher.load_state_dict(state["data"])
    for p, keep in outcome.get("transitions", {}).items():  # decisions the weights do not hold
        transitions.apply_kept(net, int(p), keep)
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch_rng"])), dtype=torch.uint8))
    if ckpt.name != "latest":  # newest_checkpoint(verify=True) has just checked its checksums
        # a student's prefix adopted from another placement schedule (a transplant) may name a norm otherwise
        name_in_file = hf_qwen3.hf_name if isinstance(net, model.Qwen3) else names_in(
            net, read_json(ckpt / "config.json", "normgrow_student")["normgrow_student"]["norm"])
        first = next(net.parameters())
        checkpoint.load_tensors(net, ckpt, first.dtype, first.device, name_in_file, checksums_checked=True)
    if ckpt.name.startswith("step-"):
        print0(ctx, f"{config.name}: warning: {ckpt} holds weights but no AdamW state; its moments restart at "
                    f"step {step}, so this run will not be bit-identical to an uninterrupted one")
    print0(ctx, f"{config.name}: adopting {config.start_from} (its first phases are this run's), continuing at "
                f"step {step}" if adopting else f"{config.name}: resuming at step {step} from {ckpt}")
    return resume, step, state["totals"], state["elapsed"], outcome


def names_in(net: model.Student, stored_norm: str) -> Callable[[str], str | None]:
    """Where each of the student's parameters lies in a checkpoint of the schedule `stored_norm` whose block 0 is
    its own (a transplant): under its own name, except that a schedule whose only norm is its entry norm stores
    it as `norm` (model.Student.__init__), and the final norm it lacks is absent (None: kept as initialised)."""
    stored = [model.placement(n) for n in model.block_norms(stored_norm, net.blocks)]
    if net.entry_norm is None or not stored[0].entry_norm or any(p.final_norm for p in stored):
        return lambda name: name
    return lambda name: {"entry_norm.weight": "norm.weight", "norm.weight": None}.get(name, name)


def load_latest_checkpoint(ckpt: Path, net, optimizer, ctx):
    """Weights and AdamW state from latest/ on any number of ranks, each reading only the rows it holds."""
    if not (ckpt / checkpoint.SHARDED_INDEX).is_file():
        raise TrainingError(f"{ckpt}: lacks {checkpoint.SHARDED_INDEX} (written by an older version of the kit, or "
                            "damaged); move the folder away and rerun to resume from the last phase checkpoint")
    from torch.distributed.tensor import DTensor
    index = read_json(ckpt / checkpoint.SHARDED_INDEX, "tensors")
    with torch.no_grad():
        for fqn, p in net.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            local.copy_(checkpoint.read_rows(ckpt, index, fqn, p))
            moments = {}
            for key in [k for k in index["tensors"] if k.startswith(f"{fqn}/")]:
                name = key.rsplit("/", 1)[1]
                if name == "step":  # a plain scalar, the same on every rank
                    moments[name] = checkpoint.read_rows(ckpt, index, key, torch.zeros(()))
                    continue
                rows = checkpoint.read_rows(ckpt, index, key, p).to(local.device)
                moments[name] = DTensor.from_local(rows, p.device_mesh, p.placements, shape=p.shape,
                                                   stride=p.stride()) if isinstance(p, DTensor) else rows
            if moments:
                optimizer.state[p] = moments
