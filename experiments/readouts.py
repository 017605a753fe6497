"""Reading finished runs for the paper's tables and figures: logged rows, the fixed diagnostic batch, diagnostics
over kept checkpoints, whole-block removal and the tokens its batches held. Nothing here trains.

    readouts.phase_end_eval(ws, RunName("pre", "grow"), 42, 0)["ce"]   # validation CE at phase 0's end
"""

import math
from functools import cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import config
import data
import diag
import model
import nets
import rundir
from experiments.suite import RunName, Workspace
from plumbing import checkpoint, corpora, devices, errors
from plumbing.locks import printable


@cache
def metrics(run_dir: Path) -> list[dict]:
    return rundir.read_metrics(run_dir)


def phase_end_eval(ws: Workspace, run: RunName, seed: int, phase: int) -> dict:
    step = (phase + 1) * ws.preset.run["phase_steps"]
    return logged_row(ws.run_dir(run, seed), f"the evaluation at the end of phase {phase} (step {step})",
                      lambda r: r.get("eval") and r.get("step") == step and not r.get("phase_start"))


def phase_start_eval(ws: Workspace, run: RunName, seed: int, phase: int) -> dict:
    """The evaluation of a phase's starting weights, before its first update."""
    return logged_row(ws.run_dir(run, seed), f"the evaluation at the start of phase {phase}",
                      lambda r: r.get("phase_start") and r.get("phase") == phase)


def logged_row(run_dir: Path, what: str, wanted: Callable[[dict], bool]) -> dict:
    """The first row of a finished run's metrics.jsonl that `wanted` picks, an evaluation as the kit logs it (a
    finite CE >= 0 beside its PPL, exp(CE): no upper bound, a phase's starting weights may score worse than
    uniform), or one line naming the file."""
    row = next((r for r in metrics(run_dir) if wanted(r)), {})  # a row `wanted` picks is never empty
    ce, ppl = row.get("ce"), row.get("ppl")
    if not row:
        why = "missing"
    elif not checkpoint.finite_number(ce):
        why = "not a finite CE"
    elif ce < 0 or not checkpoint.finite_number(ppl) or not math.isclose(ppl, nets.perplexity(ce), rel_tol=1e-9):
        why = f"a CE of {ce!r} with a PPL of {printable(repr(ppl), 40)}, not what an evaluation logs (a CE of at " \
              "least 0, its PPL exp(CE))"
    else:
        return row
    raise errors.TrainingError(f"{run_dir / 'metrics.jsonl'}: {what} is {why}, although the run is finished; the "
                               "log is damaged: move the run away and rerun it")


@cache
def diagnostic_batch(ws: Workspace) -> data.Batch:
    d = ws.preset.diag
    return data.diagnostic_batch(data.Shard(ws.data_dir / "val"), d["docs"], d["max_inputs"], d["seed"])


@cache
def series(ws: Workspace, run: RunName, seed: int) -> list[dict]:
    """diag.diagnose_checkpoint at every kept checkpoint of a run, in step order."""
    decode = corpora.vocabulary(ws.preset.data).decode
    return [{"step": c["step"], **diag.diagnose_checkpoint(load_student(ws, c["path"]), diagnostic_batch(ws),
                                                           decode, c["active_blocks"])}
            for c in diag.checkpoint_series(ws.run_dir(run, seed))]


def load_student(ws: Workspace, path) -> model.Student:
    """One checkpoint at a time on the run's device: the preset's compute precision on a GPU, fp32 on a CPU."""
    device = ws.ctx.device
    dtype = devices.precision_choice(ws.preset.run["precision"], device)[0] if device.type == "cuda" else torch.float32
    return model.Student.load(path, dtype, device)


@cache
def block_removal(ws: Workspace, run: RunName, seed: int) -> list[dict]:
    """Whole-block removal at the run's scheduled endpoint (its last kept checkpoint), or as a study recorded it."""
    run_dir = ws.run_dir(run, seed)
    if (run_dir / diag.DIAGNOSTICS).is_file():
        return diag.recorded_block_removal(run_dir / diag.DIAGNOSTICS)
    return diag.block_removal(load_student(ws, diag.checkpoint_series(run_dir)[-1]["path"]), diagnostic_batch(ws))


def unique_and_total_tokens(ws: Workspace, run: RunName, seed: int) -> tuple[int, int]:
    """Exactly, from the batcher: every document the run saw, counted once and with repeats."""
    settings = config.read(ws.run_dir(run, seed))
    shard = data.Shard(settings.train_data, verify=False)
    batcher = data.Batcher(shard, settings.global_batch, settings.seed, settings.data_mode, settings.replay_docs)
    seen = [batcher.global_doc_ids(s) for s in range(len(config.plan_phases(settings)) * settings.phase_steps)]
    targets = shard.lengths.astype(np.int64) - 1
    everything = np.concatenate(seen)
    return int(targets[np.unique(everything)].sum()), int(targets[everything].sum())
