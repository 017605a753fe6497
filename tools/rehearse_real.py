"""The rehearsal's second way: the launch itself, with real tensors at reduced dimensions.

    python repro.py rehearse table1 --scale full --gpus 8 --nodes 4 --mode real

training.ensure_runs, what `repro.py EXPERIMENTS` runs, on every rank of the launch's mesh, each rank a
thread of torch's threaded process group (real collectives), in the preset's precision: every phase of
every run with evaluations, kept checkpoints, latest/ and a resume from a latest/ written by another
world size. What a launch would hit (a crash, a dtype, a collective on the 2-D mesh), it hits first.
The mesh keeps the launch's shape at two ranks a dimension (reduced_ranks: 1 x 2 for one node, 2 x 2
for HSDP over several), and each rank runs the micro-batches a step that a rank of the launch runs.
It counts rank 0's host syncs (HostSyncs). The full-size step, on fake tensors: rehearse.py.
"""
import contextlib
import io
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

import grow
import model
import rundir
from experiments import presets
from plumbing import devices
from plumbing.hf_qwen3 import save_qwen3
from tools.rehearse import Launch

# torch.Tensor's methods that wait for the device on a GPU: a Python number or list read from a tensor,
# an output whose size depends on the values; and an index by a boolean mask (one of __getitem__'s)
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "nonzero", "masked_select", "unique")
TORCH_CODE = str(Path(torch.__file__).parent)
TENSOR_METHODS = str(Path(torch.__file__).parent / "_tensor.py")  # e.g. __format__: read for their caller


class HostSyncs:
    """Counts the host's waits for a device value on the thread that enters it (rank 0): each call of
    READS and each index by a boolean mask; and the run-steps grow.lockstep_step takes there (a run that
    adopts another's phase has that phase's steps in its log, but never took them). It wraps those
    methods of torch.Tensor and that function while it is active, and nothing else: a dispatch mode
    would take every operator through Python, on every rank's thread, and double the rehearsal's time.
    Reads that torch's own Python code makes are put apart ("torch, on host tensors"), not counted: each
    seen here is of a tensor a launch keeps on the host too (DTensor's mesh coordinates, AdamW's step
    counters under foreach=False, a checkpoint's rows read from disk). Each other is put where the kit's
    innermost caller says: an evaluation, a checkpoint, the boundary monitor (every monitor_interval
    steps; every step at reduced size), a training step (grow.lockstep_step, those aside), or elsewhere
    (opening and resuming runs, weights read from disk among them: on the host in a launch too)."""
    WHERE = {"evaluate": "evaluations", "save_checkpoint": "checkpoints", "monitor_row": "boundary monitor",
             "lockstep_step": "training steps"}

    def __init__(self):
        self.count, self.by_place, self.run_steps = 0, {}, 0
        self.thread, self.saved = threading.get_ident(), {}

    def __enter__(self):
        for name in (*READS, "__getitem__"):
            self.saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self.counted(name, self.saved[name]))
        self.lockstep_step, grow.lockstep_step = grow.lockstep_step, self.stepped
        return self

    def __exit__(self, *exc):
        for name, method in self.saved.items():
            setattr(torch.Tensor, name, method)
        grow.lockstep_step = self.lockstep_step

    def stepped(self, runs: list, teacher):
        self.run_steps += len(runs) if threading.get_ident() == self.thread else 0
        return self.lockstep_step(runs, teacher)

    def counted(self, name: str, method):
        def read(tensor, *args, **kwargs):
            if threading.get_ident() == self.thread and (name != "__getitem__" or boolean_index(args[0])):
                self.tally(sys._getframe(1))
            return method(tensor, *args, **kwargs)
        return read

    def tally(self, frame):
        while frame.f_code.co_filename == TENSOR_METHODS:
            frame = frame.f_back
        place = "torch, on host tensors" if frame.f_code.co_filename.startswith(TORCH_CODE) else "elsewhere"
        self.count += place == "elsewhere"
        while place == "elsewhere" and frame is not None:
            place, frame = self.WHERE.get(frame.f_code.co_name, "elsewhere"), frame.f_back
        self.by_place[place] = self.by_place.get(place, 0) + 1


def boolean_index(index) -> bool:
    """Whether `index` (what tensor[index] is given) holds a boolean tensor: its output's size is its count."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in parts)


# The launch at reduced dimensions

# A teacher of the kit's own at a few hundred kB: every FSDP2 unit, the precision policy, accumulation,
# activation checkpointing and the chunked loss run as at full size, in seconds.
REDUCED_TEACHER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
REDUCED_STEPS = 2  # steps a phase: step 1 writes latest/ and a step-1/ snapshot, step 2 ends the phase
# At most this many ranks a mesh dimension: two ranks on a node run every code path eight do (FSDP2's
# all-gathers and reduce-scatters, a rank's rows of a sharded checkpoint), and two nodes every path of
# HSDP's 2-D mesh (the replicate dimension's all-reduce, clipping over the shard dimension only). Each
# rank is a thread of one process under one GIL, so the rehearsal's time grows with the ranks it runs.
REDUCED_RANKS = 2
VALIDATION_DOCUMENTS = 2  # a rank: the evaluation's loop over batches, at the full preset's one document a batch


def reduced_ranks(launch: Launch) -> Launch:
    """The ranks real mode runs for `launch`: its mesh's shape (one node: FSDP; several: HSDP's 2-D mesh)
    at REDUCED_RANKS at most a dimension."""
    return Launch(min(launch.gpus, REDUCED_RANKS), min(launch.nodes, REDUCED_RANKS))


def reduced(preset, launch: Launch, ranks: Launch):
    """`preset` at reduced dimensions on `ranks` (reduced_ranks(launch)), what a rank of `launch` runs
    kept: its precision (bf16 parameters, fp32 reduction), micro-batch (a packed one's token budget: that many
    documents of the reduced length, so that documents are placed and packed as at full size) and the most
    micro-batches a step (the global batch scaled to the ranks run), activation checkpointing, protocols and
    phases."""
    from dataclasses import replace
    micro_batch = preset.run["micro_batch"]
    micro_per_step = preset.run["global_batch"] // launch.world // micro_batch
    return replace(preset, teacher="", teacher_model=REDUCED_TEACHER, shipped_teachers=(),
                   data={"source": "toy", "vocab_size": 512, "max_len": 64, "val_docs": VALIDATION_DOCUMENTS * ranks.world},
                   run={**preset.run, "global_batch": micro_per_step * ranks.world * micro_batch,
                        "phase_steps": REDUCED_STEPS, "eval_interval": REDUCED_STEPS, "checkpoint_interval": 1,
                        "snapshot_interval": 1, "monitor_interval": 1, "loss_chunk": 64})


def first_ranks(ranks: Launch, micro_batches: int) -> Launch:
    """The interrupted first launch's ranks: one node of twice `ranks`' (`ranks` one node), or of one
    node's (HSDP over several), so that latest/ is written by two ranks or more and read by another
    number; one rank where the step's `micro_batches` do not split over them."""
    first = Launch(2 * ranks.gpus if ranks.nodes == 1 else ranks.gpus)
    return first if micro_batches % first.world == 0 else Launch(1)


def on_threads(ranks: Launch, work) -> list:
    """work(ctx) on every rank of `ranks`, each a thread of this process in torch's threaded process
    group (real collectives between the threads, the launch's mesh: HSDP over several nodes); each
    rank's result. A rank that raises stops them all, and its exception is raised here."""
    import torch.testing._internal.distributed.multi_threaded_pg as threaded
    world, store, results, failed = ranks.world, dist.HashStore(), [None] * ranks.world, []

    def rank(r: int):
        try:
            dist.init_process_group("threaded", rank=r, world_size=world, store=store)
            ctx = devices.Dist(r, world, torch.device("cpu"), ranks.gpus, devices.mesh_for("cpu", world, ranks.gpus))
            results[r] = work(ctx)
        except BaseException as e:  # noqa: BLE001 - re-raised below, after every rank has stopped
            failed.append((r, e))
            threaded.ProcessLocalGroup.exception_handle(e)
        finally:
            dist.destroy_process_group()

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    threaded._install_threaded_pg()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # several ranks on a few cores: one intra-op thread each
    try:
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        threaded.ProcessLocalGroup.reset()
        threaded._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        torch.set_num_threads(threads_before)
    if failed:
        raise min(failed, key=lambda f: f[0])[1]
    return results


def rehearse(preset, launch: Launch, names, root: Path, seed: int | None = None) -> dict:
    """The launch itself at reduced dimensions (reduced()) on reduced_ranks(launch), after a first launch on
    one node of another size (first_ranks) that stops after each lockstep run's first step, so every run
    resumes from a latest/ that several FSDP2 ranks wrote on another world size: what it ran, and how long."""
    from experiments import suite, training
    ranks = reduced_ranks(launch)
    small = reduced(preset, launch, ranks)
    seed = preset.run["seed"] if seed is None else seed
    teacher = root / "teacher"
    net = model.Qwen3(presets.teacher_shape(small))
    net.init_weights(seed)
    save_qwen3(net, teacher)
    first = first_ranks(ranks, small.run["global_batch"] // small.run["micro_batch"])
    started = time.time()

    def interrupted(ctx):
        ws = suite.Workspace(small, root / "runs", root / "results", ctx, wait=False)
        suite.prepare_data(ws)
        jobs = [(suite.run_config(ws, name, seed, teacher=teacher), ws.run_dir(name, seed))
                for name in suite.with_prefixes(names)]
        # the lockstep runs that start from scratch (one that adopts another's phase waits for it to end)
        grow.train_together([j for j in jobs if j[0].data_mode == "replay" and not j[0].start_from], ctx=ctx,
                            stop_after_step=1, wait=False)

    def launched(ctx):
        ws = suite.Workspace(small, root / "runs", root / "results", ctx, wait=False)
        # rank 0's host syncs (what it wraps is every thread's: entered once)
        with HostSyncs() if ctx.is_main else contextlib.nullcontext() as syncs:
            training.ensure_runs(ws, names, [seed], teacher=teacher)
        return syncs and (syncs, {run.name: rundir.final_eval(ws.run_dir(run, seed))
                                  for run in suite.with_prefixes(names)})

    with contextlib.redirect_stdout(io.StringIO()) as said:  # the runs' own lines; the result says it all
        on_threads(first, interrupted)
        resumed = time.time()
        syncs, runs = on_threads(ranks, launched)[0]
    run_steps = max(syncs.run_steps, 1)
    return {"world": launch.world, "gpus": launch.gpus, "nodes": launch.nodes,
            "ranks_run": {"gpus": ranks.gpus, "nodes": ranks.nodes, "world": ranks.world},
            "micro_batches_per_step": small.run["global_batch"] // ranks.world // small.run["micro_batch"],
            "first_world": first.world, "precision": small.run["precision"], "runs": runs,
            "host_syncs_rank0": syncs.count, "run_steps": syncs.run_steps,
            "host_syncs_per_run_step": syncs.count / run_steps, "host_syncs_by_place": syncs.by_place,
            "host_syncs_per_training_step": syncs.by_place.get("training steps", 0) / run_steps,
            "log_lines": len(said.getvalue().splitlines()),
            "wall_s": {"interrupted launch": resumed - started, "resumed launch": time.time() - resumed}}


def markdown(out: dict) -> list[str]:
    ranks, runs = out["ranks_run"], ", ".join(f"{name} step {r.get('step')}" for name, r in out["runs"].items())
    mesh = "HSDP's 2-D mesh" if ranks["nodes"] > 1 else "FSDP over one node"
    return [f"The launch's driver at reduced size ({out['precision']}) on {ranks['nodes']} x {ranks['gpus']} ranks, "
            f"{mesh} as on {out['nodes']} x {out['gpus']} GPUs, {out['micro_batches_per_step']} micro-batches a rank "
            f"a step as there; resumed from a launch on {out['first_world']}: {runs}; host syncs on rank 0: "
            f"{out['host_syncs_per_training_step']:.1f} a run's training step, {out['host_syncs_rank0']} in all over "
            f"{out['run_steps']} run-steps ({out['host_syncs_by_place']}); "
            + ", ".join(f"{k} {v:.0f} s" for k, v in out["wall_s"].items())]
