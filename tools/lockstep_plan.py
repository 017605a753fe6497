"""The dry run's lockstep accounting (tools/plan.py prices what it counts): which of a seed's planned runs read
the same batches and train together (grow.train_together, a group per data stream, one group after the other),
the stretches of global steps over which the same ones are resident (lockstep segments), the teacher passes that
saves, and each segment's per-GPU memory, with whether the worst fits a GPU (lockstep's default).
"""
from dataclasses import dataclass

import config
import grow
from experiments import presets
from tools import memory

MEMORY_HEADROOM = 0.9  # of the GPU's memory: allocator fragmentation and NCCL buffers take the rest


@dataclass
class PlannedRun:
    name: str
    config: config.RunConfig
    shared_phases: int  # leading phases computed by another run (a shared prefix): not paid again


def own_steps(run: PlannedRun) -> range:
    """The global steps this run computes itself (after its shared prefix)."""
    phases = config.plan_phases(run.config)
    return range(phases[run.shared_phases].first_step if run.shared_phases < len(phases) else 0,
                 phases[-1].first_step + phases[-1].steps)


def lockstep_groups(runs: list[PlannedRun]) -> list[list[PlannedRun]]:
    """The runs of a seed that train together, as training groups them (grow.lockstep_groups)."""
    return grow.lockstep_groups(runs, lambda run: run.config)


def lockstep_segments(runs: list[PlannedRun]) -> list[tuple[int, int, list[tuple[str, config.Phase]]]]:
    """(start, stop, [(run, its phase)]) of each stretch of global steps over which the same runs of a lockstep
    group train in the same phases, group after group: what is resident on a GPU changes only at these edges."""
    out = []
    for group in lockstep_groups(runs):
        live = [(r.name, ph) for r in group for ph in config.plan_phases(r.config)[r.shared_phases:]]
        edges = sorted({e for _, ph in live for e in (ph.first_step, ph.first_step + ph.steps)})
        spans = [(a, b, [(name, ph) for name, ph in live if ph.first_step <= a < ph.first_step + ph.steps])
                 for a, b in zip(edges, edges[1:])]
        out += [span for span in spans if span[2]]
    return out


def segment_memory(preset, runs: list[PlannedRun], gpus: int, nodes: int = 1,
                   replicate_teacher: bool = False) -> list[dict]:
    """Per-GPU peak of every lockstep segment: {"steps", "runs", "bytes", "moment", "phases", "norms"} (the
    resident runs' phases and placements, which the rehearsal and the count step)."""
    teacher = presets.teacher_shape(preset)
    norm = {run.name: run.config.norm for run in runs}
    out = []
    for a, b, live in lockstep_segments(runs):
        phases, norms = [ph for _, ph in live], [norm[name] for name, _ in live]
        peak = memory.step_peak(preset, teacher, gpus, nodes, phases, replicate_teacher, norms)
        out.append({"steps": (a, b), "runs": [f"{name} phase {ph.index}" for name, ph in live],
                    "bytes": peak["total"], "moment": peak["moment"], "phases": phases, "norms": norms})
    return out


def most_resident(runs: list[PlannedRun]) -> int:
    """The most lockstep runs training at once (a finished run frees its memory, a sharing one joins late)."""
    spans = [[own_steps(r) for r in group] for group in lockstep_groups(runs)]
    return max((sum(s.start <= step < s.stop for s in group) for group in spans for step in {s.start for s in group}),
               default=1)


def teacher_passes(runs: list[PlannedRun], lockstep: bool, first_epoch_kept: bool = False) -> int:
    """Teacher forward passes (optimizer steps' worth) for one seed: one a step for each lockstep group together.
    `first_epoch_kept` (one CPU process: nets.Teacher.training_hidden): a replaying run's steps after the shard's
    first epoch need none."""
    def paid(r: PlannedRun) -> range:
        steps = own_steps(r)
        if not first_epoch_kept or r.config.data_mode != "replay":
            return steps
        return range(steps.start, max(steps.start, min(steps.stop, r.config.replay_docs // r.config.global_batch)))
    if not lockstep:
        return sum(len(paid(r)) for r in runs)
    return sum(union_length([paid(r) for r in group]) for group in lockstep_groups(runs))


def union_length(spans: list[range]) -> int:
    """How many steps lie in at least one span: merged interval by interval, never a set of every step
    (a dry run of any accepted step count answers at once)."""
    total, reach = 0, min((s.start for s in spans), default=0)  # reach: the end of the steps counted so far
    for span in sorted((s for s in spans if len(s)), key=lambda s: s.start):
        total += max(0, span.stop - max(span.start, reach))
        reach = max(reach, span.stop)
    return total


def fits(preset, gpus: int, gpu_bytes: float, runs: list[PlannedRun], nodes: int = 1) -> bool:
    """Whether lockstep's worst segment fits in a GPU of `gpu_bytes` (used for the default choice)."""
    worst = max((s["bytes"] for s in segment_memory(preset, runs, gpus, nodes)), default=0.0)
    return worst <= MEMORY_HEADROOM * gpu_bytes
