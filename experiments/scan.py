"""The layer-by-layer scan (`repro.py scan`): massive activations (max |activation| / median, with channel
and token) and sink heads at every layer's output of a scale's teacher and of any student checkpoint, on the
fixed diagnostic batch (results/<scale>/scan.md, .json and scan.png).

    python repro.py scan --scale toy runs/toy/s42/pre-grow/phase-2
"""

from pathlib import Path

import diag
import model
import rundir
from experiments import figures, readouts, report, suite
from experiments.presets import SINK
from plumbing import corpora, errors

SCAN_MASSIVE = 100.0  # max |activation| / median counted massive: Sun et al. 2024's ~10^3-10^4 at its low end


def checkpoint_blocks(path: Path) -> int:
    """The active blocks of a student checkpoint folder (a run's phase-<p>/ or step-<n>/); else one line."""
    path = Path(path)
    if not (path / "trainer_state.json").is_file() or not (path.parent / "config.json").is_file():
        raise errors.OptionError("CHECKPOINT", f"{path}: not a student checkpoint (a run's phase-<p>/ or step-<n>/ "
                                               "folder, e.g. runs/toy/s42/pre-grow/phase-2)")
    return next(c["active_blocks"] for c in diag.checkpoint_series(path.parent)
                if Path(c["path"]).resolve() == path.resolve())


def run_scan(ws: suite.Workspace, teacher: Path, checkpoints: list[Path]) -> dict:
    """diag.layer_scan of the scale's teacher and each student checkpoint (results/<scale>/scan.md, .json, .png)."""
    blocks = {Path(c): checkpoint_blocks(c) for c in checkpoints}  # every path checked before any work
    decode = corpora.vocabulary(ws.preset.data).decode
    batch = readouts.diagnostic_batch(ws)
    teacher_net = model.load_qwen3(teacher)
    scans = {"teacher": diag.layer_scan(teacher_net, batch, decode, SINK["attention"])}
    for path, active in blocks.items():
        scans[f"{path.parent.name}/{path.name}"] = diag.layer_scan(readouts.load_student(ws, path), batch, decode,
                                                                  SINK["attention"], active)
    even = diag.even_first_token_attention(batch.mask, teacher_net.config.attention_window)
    caption = f"normgrow, {ws.preset.name} scale, scan"
    figure = figures.fig_scan(scans, ws.results / "scan.png", SCAN_MASSIVE, SINK["heads"], SINK["attention"], caption)
    rows, length = batch.mask.shape[0], batch.mask.shape[1]
    out = {"experiment": "scan", "scale": ws.preset.name, "teacher": str(teacher), "checkpoints": [str(c) for c in blocks],
           "batch": {"rows": rows, "max_inputs": length, "tokens": int(batch.mask.sum())},
           "massive_threshold": SCAN_MASSIVE, "sink": SINK, "even_first_token_attention": even,
           "git_commit": rundir.git_commit(), "scans": scans, "figure": str(figure)}
    lines = [f"# Layer-by-layer scan ({ws.preset.name} scale)", "",
             f"Every decoder layer's output on the fixed diagnostic batch ({rows} documents, up to {length} inputs, "
             f"{out['batch']['tokens']} real tokens). max/median: the largest |activation| over real tokens and channels "
             f"over the median |activation| (massive at >= {SCAN_MASSIVE:g}, Sun et al. 2024); top 3: |value| at "
             "channel c, row:position (token). Sink heads: the share of the layer's heads whose mean attention on "
             f"position 0 (the document's <|endoftext|>) is >= {SINK['attention']:g} (Gu et al. 2024); a head that "
             f"spreads every query evenly over the keys it sees puts {even:.3f} there.", ""]
    for name, layers in scans.items():
        massive = [r["layer"] for r in layers if (r["massive_ratio"] or 0) >= SCAN_MASSIVE]
        sinks = [r["layer"] for r in layers if (r["sink_heads"] or 0) >= SINK["heads"]]
        lines += [f"## {name}", "", f"Layers with a massive activation: {massive or 'none'}; layers with >= "
                  f"{SINK['heads']:.0%} sink heads: {sinks or 'none'}.", "",
                  "| layer | max/median | top 3 | boundary/regular RMS | sink heads | largest head |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in layers:
            top = "; ".join(f"{t['abs']:.3g} at c{t['channel']}, {t['row']}:{t['position']} ({t['token']!r})"
                            for t in r["top"])
            lines.append(f"| {r['layer']} | {report.fmt(r['massive_ratio'], 1)} | {top} | "
                         f"{report.fmt(r['boundary_over_regular'], 2)} | {report.fmt(r['sink_heads'], 2)} | "
                         f"{report.fmt(r['max_head'], 3)} |")
        lines.append("")
    lines.append("![scan](scan.png)")
    report.write(ws.results, "scan", out, lines)
    suite.console.print("\n".join(lines), markup=False)
    return out
