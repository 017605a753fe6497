"""The miniature search: a ladder of variant presets (presets.LADDERS), each rung one change more than
the one before, run on pre-norm grow with one pilot seed until the mechanism's criterion holds
(presets.MECHANISM) or the next rung would cost more than its ladder's budget (presets.LADDER_BUDGETS;
else presets.RUNG_HOURS on 2 cores). Post-norm is never run here: the criterion is calibrated on
pre-norm alone. Each rung is an ordinary set of --set overrides, so `python repro.py train --scale toy
--norm pre --protocol grow --set ...` reproduces it.

    python repro.py search --scale toy                                   # the toy's ladder
    python repro.py search --scale toy --ladder second                   # the second search
    python repro.py search --scale toy --ladder second --rung layers-3   # rung 0, then this one, past the stopping rule
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import data
import diag
import model
import rundir
from experiments import presets, readouts, reference, report, studies, suite, tables, training
from flops import forward_flops_per_token
from plumbing import checkpoint, corpora

SEARCH_RUN = tables.PRE_GROW


def rung_chain(ladder, index: int) -> list[int]:
    """The rungs `index` builds on, first to last, itself included: each rung's base (Rung.base), or the
    rung before it, back to rung 0."""
    chain = [index]
    while chain[-1] > 0:
        base = ladder[chain[-1]].base
        chain.append(chain[-1] - 1 if base < 0 else base)
    return chain[::-1]


def rung_overrides(ladder, upto: int) -> tuple[str, ...]:
    """The --set items of rung `upto`: every change of the rungs it builds on and its own, later ones winning."""
    items: dict[str, str] = {}
    for index in rung_chain(ladder, upto):
        items.update(item.split("=", 1) for item in ladder[index].overrides)
    return tuple(f"{key}={value}" for key, value in items.items())


def teacher_mechanism(taught: dict) -> dict:
    """The teacher's criterion (presets.TEACHER_MECHANISM) on diag.diagnose_teacher's result: the largest
    max/median |activation| and the largest share of sink heads among the layers from `from_layer` on,
    each layer's output (boundary_stats[l + 1]) and attention (first_token_attention[l])."""
    c = presets.TEACHER_MECHANISM
    layers = range(c["from_layer"], len(taught["first_token_attention"]))
    massive = max((taught["boundary_stats"][layer + 1]["massive_ratio"] or 0.0 for layer in layers), default=0.0)
    sinks = max((diag.sink_heads(taught["first_token_attention"], [layer], presets.SINK["attention"]) or 0.0
                 for layer in layers), default=0.0)
    return {"massive_ratio_from_layer": massive, "sink_heads_from_layer": sinks,
            "present": massive >= c["massive_ratio"] and sinks >= c["sink_heads"]}


def shipped_teacher(rws: suite.Workspace) -> bool:
    """Whether the rung's teacher is a shipped one (suite.shipped_teacher_for), installed or to be installed by
    ensure_inputs, not trained: its folder absent, or holding the shipped one's checksums. Needs the data."""
    installed, shipped = rws.teacher_dir / checkpoint.CHECKSUMS, suite.shipped_teacher_for(rws)
    if not shipped:
        return False
    if installed.is_file():
        return installed.read_bytes() == (suite.SHIPPED_ROOT / shipped / checkpoint.CHECKSUMS).read_bytes()
    return not (rws.teacher_dir / "config.json").exists()  # install_shipped_teacher's own test


def rung_workspace(ws: suite.Workspace, ladder, index: int, user_overrides: presets.Settings | None = None):
    """The workspace of one rung: the scale with the rung's overrides (and the user's, parsed, last)."""
    return suite.workspace(ws.preset.name, ws.runs.parent, ws.results.parent,
                           overrides=presets.merged(rung_settings(ws.preset.name, ladder, index), user_overrides or {}),
                           device=ws.ctx.device.type, tracker=ws.tracker, lockstep=ws.lockstep, wait=ws.wait)


def rung_settings(scale: str, ladder, index: int) -> presets.Settings:
    """rung_overrides parsed as the scale's fields (as `--set` parses them)."""
    return presets.parse_overrides(presets.PRESETS[scale], rung_overrides(ladder, index))


def rung_flops(rws: suite.Workspace, new_teacher: bool) -> float:
    """Training FLOPs of a rung (flops.forward_flops_per_token, as the dry run counts them): its teacher
    if it trains one (forward and backward, 3x a forward), then pre-norm grow (the teacher's forward
    every step; the student's forward, and backward from its first trainable block; both heads)."""
    preset = rws.preset
    config = presets.teacher_shape(preset)
    doc_tokens = float((data.Shard(rws.data_dir / "train", verify=False).lengths - 1).mean())
    context = doc_tokens / 2
    t_layers, head = forward_flops_per_token(config, config.num_hidden_layers, context)
    teacher_run = {**preset.run, **preset.teacher_run}
    flops = 3 * (t_layers + head) * teacher_run["phase_steps"] * teacher_run["global_batch"] * doc_tokens \
        if new_teacher else 0.0
    run, L = preset.run, preset.run["layers_per_block"]
    for phase in range(run["blocks"]):
        s_layers, _ = forward_flops_per_token(config, (phase + 1) * L, context)
        flops += (3 * s_layers + 3 * head + t_layers + head) * run["phase_steps"] * run["global_batch"] * doc_tokens
    return flops


def mechanism(diagnosis: dict) -> dict:
    """The criterion on one diagnosis (diag.diagnose_checkpoint of pre-norm grow's final checkpoint):
    the statistics after block 0 (boundary 1), whether each passes presets.MECHANISM, whether all do, and
    the attention sink in the blocks after block 0 (reported, not required)."""
    stats, types = diagnosis["boundary_stats"][1], diagnosis["token_type_rms"][1]
    values = {"boundary_over_regular": types["boundary_over_regular"], "kurtosis_distinct": stats["kurtosis_distinct"],
              "massive_ratio": stats["massive_ratio"]}
    passes = {k: v is not None and v >= presets.MECHANISM[k] for k, v in values.items()}
    return {**values, "passes": passes, "present": all(passes.values())}


def sink_summary(first_attention: list, layers) -> dict:
    """The largest per-head mean attention on position 0 over `layers`, and the fraction of their heads
    past presets.SINK's attention (a sink when at least SINK's heads)."""
    heads = [h for i in layers if first_attention[i] is not None for h in first_attention[i]]
    fraction = diag.sink_heads(first_attention, layers, presets.SINK["attention"])
    return {"max_head": max(heads) if heads else None, "sink_heads": fraction,
            "sink": fraction is not None and fraction >= presets.SINK["heads"]}


def diagnose_rung(rws: suite.Workspace, seed: int, teacher: Path) -> dict:
    """The criterion at the end of pre-norm grow, the last monitor row, and the teacher measured alike."""
    decode = corpora.vocabulary(rws.preset.data).decode
    run_dir = rws.run_dir(SEARCH_RUN, seed)
    final = diag.checkpoint_series(run_dir)[-1]
    batch = readouts.diagnostic_batch(rws)
    student = readouts.load_student(rws, final["path"])
    found = diag.diagnose_checkpoint(student, batch, decode, final["active_blocks"])
    L = rws.preset.run["layers_per_block"]
    monitor = rundir.monitor_series(run_dir)
    last = monitor[-1]["boundaries"][1] if monitor and len(monitor[-1]["boundaries"]) > 1 else {}
    taught = diag.diagnose_teacher(model.load_qwen3(teacher), batch, decode)
    return {"criterion": mechanism(found), "sink": sink_summary(found["first_token_attention"],
                                                                range(L, len(found["first_token_attention"]))),
            "boundary_after_block_0": {k: found["boundary_stats"][1][k] for k in ("mean", "std", "kurtosis",
                                                                                 "massive_channel", "massive_position")},
            "monitor_last": {k: last.get(k) for k in ("mean", "kurtosis", "boundary_over_others", "massive_ratio")},
            "ce": rundir.final_eval(run_dir)["ce"],
            "teacher": {"ce": rundir.final_eval(teacher.parent)["ce"]
                        if (teacher.parent / "done.json").is_file() else None,
                        "massive_ratio_max": max((s["massive_ratio"] or 0.0) for s in taught["boundary_stats"][1:]),
                        "boundary_over_regular_max": max((t["boundary_over_regular"] or 0.0)
                                                         for t in taught["token_type_rms"][1:]),
                        **sink_summary(taught["first_token_attention"], range(1, len(taught["first_token_attention"]))),
                        "criterion": teacher_mechanism(taught)}}


# Not studies.machine, which names a record's CPU (escaped) for the studies' machine tables: a rung's row names
# the device it trained on (a GPU by its name), in the words its recorded rows (studies.record_rung) already hold.
def machine(made: dict) -> str:
    """A run's machine in words, from its provenance.json (the CPU and torch's instructions where recorded)."""
    return f"{reference.machine_of(made) or made.get('device', '?')}, {made.get('precision', '?')}"


def run_search(ws: suite.Workspace, seed: int, force: bool = False, user_overrides: presets.Settings | None = None,
               ladder_name: str = "", chosen: tuple[str, ...] = ()) -> dict:
    """Climb a ladder of the scale (presets.LADDERS[ladder_name], default the scale's own) rung by rung
    (finished rungs are reused, an interrupted one resumes, a recorded one is read from its record where
    ws.records is set), writing results/<scale>/search[-<ladder>].md and .json after each; stop at the first
    rung that meets the criterion, or before a rung to train whose estimated cost passes the ladder's budget
    (presets.LADDER_BUDGETS; else RUNG_HOURS on 2 cores). With `chosen` rung names (--rung): rung 0, to
    calibrate, then those, whatever they cost or find: an exploration outside the stopping rule, written apart
    (search-<ladder>-chosen) and said so."""
    ladder_name = ladder_name or ws.preset.name
    ladder = presets.LADDERS[ladder_name]
    hours, budget_threads = presets.LADDER_BUDGETS.get(ladder_name, (presets.RUNG_HOURS, 2))
    rows, decision = [], "the ladder ran out without meeting the criterion"
    if chosen:
        decision = f"rungs chosen by --rung ({', '.join(chosen)}), outside the ladder's stopping rule"
    seconds_per_flop = None  # on the budget's threads, from the first rung's time (its record's machine, if recorded)
    for index, rung in enumerate(ladder):
        if chosen and index and rung.name not in chosen:
            continue
        rws = rung_workspace(ws, ladder, index, user_overrides)
        suite.prepare_data(rws, force)
        path, identity = rung_record(ws, rws, ladder_name, seed, index)
        record = ws.ctx.on_main(partial(studies.recorded_rung, path, identity, force), "reading the rung's record") \
            if path else None
        if path and not ws.ctx.agree(record is None) and record is None:  # rank 0 found it valid: every rank reads it
            record = studies.read_record(path)
        if record is not None:  # finished before, here or on another machine: its row, nothing trained
            row = {**record["row"], "folder": str(rws.run_dir(SEARCH_RUN, seed)), "teacher_dir": str(rws.teacher_dir),
                   "restored": True}
        else:
            # a teacher an earlier rung's record stands for is not here: the first rung that needs it trains it
            new_teacher = not rws.preset.teacher and not shipped_teacher(rws) and \
                not any(r["teacher_dir"] == str(rws.teacher_dir) and not r.get("restored") for r in rows)
            flops = rung_flops(rws, new_teacher)
            estimate = flops * seconds_per_flop / 3600 if seconds_per_flop else None
            if estimate is not None and estimate > hours and not chosen:
                where = f"{budget_threads} thread{'s' * (budget_threads > 1)}"
                decision = (f"stopped before rung {index} ({rung.name}): its estimated cost, {estimate:.1f} h on "
                            f"{where}, is above {hours:g} h")
                break
            row, made = train_rung(rws, ladder, index, seed, force, new_teacher, flops)
            row |= {"estimated_hours": estimate, "estimate_threads": budget_threads}
            if path:
                ws.ctx.on_main(partial(studies.record_rung, path, identity, row, made), "recording the rung")
        if seconds_per_flop is None:  # calibrated on the first rung: a machine's rate on the kit's own step
            speedup = presets.TWO_CORE_SPEEDUP ** ((budget_threads == 2) - (row["threads"] == 2))  # to the budget's
            seconds_per_flop = row["seconds"] / row["flops"] / speedup
        rows.append(row)
        write_search(ws, rows, seed, "(searching)", ladder_name, (hours, budget_threads), bool(chosen))
        if row["criterion"]["present"] and not chosen:
            decision = f"the criterion holds at rung {index} ({rung.name})"
            break
    return write_search(ws, rows, seed, decision, ladder_name, (hours, budget_threads), bool(chosen))


def rung_record(ws: suite.Workspace, rws: suite.Workspace, ladder_name: str, seed: int, index: int,
                check_data: bool = True) -> tuple[Path | None, dict]:
    """Where the rung's record is (None: the search keeps no records) and what it must match."""
    if ws.records is None:
        return None, {}
    student = suite.run_config(rws, SEARCH_RUN, seed, teacher=training.expected_teacher(rws))
    return (studies.rung_record_path(ws, ladder_name, seed, index, presets.LADDERS[ladder_name][index].name),
            studies.rung_identity(rws, student, check_data))


def train_rung(rws: suite.Workspace, ladder, index: int, seed: int, force: bool, new_teacher: bool,
               flops: float) -> tuple[dict, dict]:
    """One rung trained (its teacher first, where it has its own) and diagnosed: its row of the search, and its
    student's provenance.json."""
    rung = ladder[index]
    teacher = suite.ensure_inputs(rws, force)
    training.ensure_runs(rws, [SEARCH_RUN], [seed], force, teacher=teacher)
    seconds = studies.wall_seconds(rundir.read_metrics(rws.run_dir(SEARCH_RUN, seed)))
    if new_teacher:
        seconds += studies.wall_seconds(rundir.read_metrics(rws.teacher_dir))
    made = rundir.read_json(rws.run_dir(SEARCH_RUN, seed) / "provenance.json")
    return {"rung": index, "name": rung.name, "change": rung.change, "why": rung.why,
            "builds_on": rung_chain(ladder, index)[:-1],
            "overrides": list(rung_overrides(ladder, index)), "folder": str(rws.run_dir(SEARCH_RUN, seed)),
            "teacher_dir": str(rws.teacher_dir), "new_teacher": new_teacher, "flops": flops, "seconds": seconds,
            "threads": made.get("threads"), "machine": machine(made),
            "preset": {k: rws.preset.run[k] for k in ("phase_steps", "layers_per_block", "global_batch", "lr")}
            | {"teacher_layers": rws.preset.teacher_model.get("num_hidden_layers"),
               "width": rws.preset.teacher_model.get("hidden_size"), "max_len": rws.preset.data["max_len"],
               "paragraphs_per_document": rws.preset.data.get("paragraphs_per_document", 1)},
            **diagnose_rung(rws, seed, teacher)}, made


def write_search(ws: suite.Workspace, rows: list[dict], seed: int, decision: str, ladder_name: str, budget: tuple,
                 chosen: bool) -> dict:
    out = {"experiment": "search", "scale": ws.preset.name, "ladder": ladder_name, "seed": seed,
           "criterion": presets.MECHANISM, "teacher_criterion": presets.TEACHER_MECHANISM, "sink": presets.SINK,
           "rung_hours": budget[0], "budget_threads": budget[1], "decision": decision, "rungs": rows,
           "git_commit": rundir.git_commit()}
    name = ("search" if ladder_name == ws.preset.name else f"search-{ladder_name}") + "-chosen" * chosen
    return report.write(ws.results, name, out, search_markdown(out), echo=True)


def search_markdown(out: dict) -> list[str]:
    c, tc = out["criterion"], out["teacher_criterion"]
    num = lambda v, f=".3g": "n/a" if v is None else format(v, f)
    title = "The miniature search" if out["ladder"] == out["scale"] else f"The search, ladder {out['ladder']}"
    threads = out["budget_threads"]
    lines = [f"# {title} ({out['scale']} scale, pre-norm grow, seed {out['seed']})", "",
             f"Criterion after block 0 at the end of grow (all three): boundary/regular RMS >= "
             f"{c['boundary_over_regular']:g}, kurtosis over distinct states >= {c['kurtosis_distinct']:g}, max/median "
             f"|activation| >= {c['massive_ratio']:g}. Sink (reported): >= {out['sink']['heads']:.0%} of the appended "
             f"blocks' heads with mean attention >= {out['sink']['attention']:g} on position 0. The teacher's criterion: "
             f"max/median >= {tc['massive_ratio']:g} and >= {tc['sink_heads']:.0%} sink heads, each at some layer from "
             f"index {tc['from_layer']} on. A rung estimated above {out['rung_hours']:g} h on {threads} thread"
             f"{'s' * (threads > 1)} is not run.", "",
             f"Decision: {out['decision']}.", "",
             "Machines (each rung's student): " + "; ".join(sorted({r.get("machine", "not recorded") for r in out["rungs"]}))
             + ".", "",
             "| rung | change | cost (h, threads; estimate) | val CE (teacher) | boundary/regular | kurtosis distinct | "
             "max/median | sink heads (max head) | teacher: max/median, sink heads; from layer 2: max/median, sink "
             "heads, criterion | criterion |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in out["rungs"]:
        m, s, t = r["criterion"], r["sink"], r["teacher"]
        tcrit = t.get("criterion")
        taught = "" if tcrit is None else (f"; {num(tcrit['massive_ratio_from_layer'])}, "
                                          f"{num(tcrit['sink_heads_from_layer'], '.2f')}, "
                                          f"{'present' if tcrit['present'] else 'absent'}")
        lines.append(f"| {r['rung']} {r['name']} | {r['change']} | {r['seconds'] / 3600:.2f} ({r['threads']}; "
                     f"{num(r.get('estimated_hours'), '.2f')}) | "
                     f"{num(r['ce'], '.4f')} ({num(t['ce'], '.4f')}) | {num(m['boundary_over_regular'])} | "
                     f"{num(m['kurtosis_distinct'])} | {num(m['massive_ratio'])} | {num(s['sink_heads'], '.2f')} "
                     f"({num(s['max_head'], '.2f')}) | {num(t['massive_ratio_max'])}, {num(t['sink_heads'], '.2f')}"
                     f"{taught} | {'present' if m['present'] else 'absent'} |")
    return lines
