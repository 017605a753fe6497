"""Guo et al. 2024's measures of a first-token sink, layer by layer, for a kit teacher and its kept snapshots
(reported beside the mechanism criterion of `repro.py scan`, never used to decide it):

    python -m tools.first_token --scale mechanism --runs-dir runs                     # the teacher, phase-0/
    python -m tools.first_token --scale mechanism --runs-dir runs runs/mechanism/teacher/step-500

On the scale's diagnostic batch, per layer and head: the mean attention on position 0 over the real queries, and
over those whose token is not a trigger (Guo's "dormant" queries); position 0's value state after o_proj over the
other positions' median (Guo's drained value); its residual norm after the layer over the others' median; and the
non-trigger queries' mean attention on the position before them (a copy head's) and on themselves (a no-op that
needs no sink).
"""

import math
from pathlib import Path

import click
import torch

import model
from experiments import readouts, suite
from experiments.presets import PRESETS
from interventions.monitor import visible_keys
from plumbing import checkpoint, corpora, errors


def measures(net: model.Qwen3, input_ids: torch.Tensor, lengths: torch.Tensor, dormant: torch.Tensor) -> list[dict]:
    """The module docstring's measures, one dict per layer (per head, but residual_ratio). `dormant`: (B, T) bool,
    the queries Guo's measure reads."""
    real = torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]
    after_first = dormant & real & (torch.arange(input_ids.shape[1]) > 0)[None, :]
    rows, residuals = [], []

    def attention_hook(attn, inputs, _):
        x, cos, sin = inputs
        q, k, v = attn.project(x)
        k, v = (t.repeat_interleave(attn.n_heads // attn.n_kv, 1) for t in (k, v))          # (B, heads, T, hd)
        weights = attention_weights(model.apply_rope(q, cos, sin), model.apply_rope(k, cos, sin), attn.window)
        first, previous, itself = weights[..., 0], at_offset(weights, 1), at_offset(weights, 0)  # (B, heads, T)
        out = torch.stack([v[:, h] @ attn.o_proj.weight[:, h * attn.head_dim:(h + 1) * attn.head_dim].T
                           for h in range(attn.n_heads)], 1).norm(dim=-1)                     # (B, heads, T)
        per_head = lambda weight, queries: [weight[:, h][queries].mean().item() for h in range(attn.n_heads)]
        rows.append({"attention": per_head(first, real), "dormant_attention": per_head(first, dormant & real),
                     "dormant_previous": per_head(previous, after_first), "dormant_self": per_head(itself, after_first),
                     "value_ratio": [ratio_to_median(out[:, h], lengths) for h in range(attn.n_heads)]})

    hooks = [layer.self_attn.register_forward_hook(attention_hook) for layer in net.layers]
    hooks += [layer.register_forward_hook(lambda m, i, out: residuals.append(out.norm(dim=-1))) for layer in net.layers]
    try:
        with torch.no_grad():
            net(input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return [{**row, "residual_ratio": ratio_to_median(norms, lengths)} for row, norms in zip(rows, residuals)]


def attention_weights(q: torch.Tensor, k: torch.Tensor, window: int = 0) -> torch.Tensor:
    """(B, heads, T, T) float32: the causal softmax weights of every query, from q and k after RoPE, as SDPA's."""
    T = q.shape[2]
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~visible_keys(torch.arange(T), T, window), float("-inf")).softmax(-1)


def at_offset(weights: torch.Tensor, offset: int) -> torch.Tensor:
    """(B, heads, T): the weight each query t puts on key t - offset (0 where t < offset)."""
    return torch.nn.functional.pad(weights.diagonal(offset=-offset, dim1=-2, dim2=-1), (offset, 0))


def ratio_to_median(norms: torch.Tensor, lengths: torch.Tensor) -> float:
    """The mean over rows of position 0's value over the median of the row's other real positions'."""
    return sum((n[0] / n[1:length].median()).item() for n, length in zip(norms, lengths.tolist())) / len(norms)


class OneLine(click.Command):
    """A mistake is one line, as repro.py prints it."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            error = click.ClickException(" ".join(e.format_message().split()))
            error.exit_code = 2
            raise error from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except errors.KitError as e:
            error = click.ClickException(str(e))
            error.exit_code = e.exit_code
            raise error from None


@click.command(cls=OneLine)
@click.option("--scale", type=click.Choice(list(PRESETS)), default="mechanism", show_default=True)
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
@click.argument("checkpoints", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
def main(scale: str, runs_dir: Path, checkpoints: tuple[Path, ...]):
    ws = suite.workspace(scale, runs_dir, dry_run=True)  # reads the runs folder, makes nothing in it
    # The checkpoints to measure, each a teacher's, checked before any work.
    paths = list(checkpoints) or [ws.teacher_dir / "phase-0"]
    for path in paths:
        if not path.is_dir():
            raise errors.UsageError(f"{path}: no teacher of scale {ws.preset.name} there yet; train it first: python "
                                    f"repro.py teacher --scale {ws.preset.name} --runs-dir {ws.runs.parent}")
        if "normgrow_student" in checkpoint.read_config(path):
            raise errors.UsageError(f"{path}: a student checkpoint; first_token measures a teacher (a plain Qwen3): "
                                    "pass the teacher's phase-0/ or its step-<n>/ snapshots")
    batch, d = readouts.diagnostic_batch(ws), ws.preset.data
    triggers = corpora.backcopy_chain(d["symbols"], d["triggers"], ws.preset.run["seed"])[1] \
        if d["source"] == "backcopy" else []
    dormant = ~torch.isin(batch.input_ids, torch.as_tensor(triggers, dtype=torch.long))
    click.echo("| checkpoint | layer | attention on position 0 (per head) | the same, non-trigger queries | "
               "value of position 0 / median (per head) | residual norm of position 0 / median | "
               "non-trigger queries' attention on the previous position (per head) | the same, on themselves |")
    click.echo("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in paths:
        for i, row in enumerate(measures(model.load_qwen3(path), batch.input_ids, batch.lengths, dormant)):
            cells = [", ".join(f"{v:.3f}" for v in row[key]) for key in ("attention", "dormant_attention", "value_ratio")]
            elsewhere = [", ".join(f"{v:.3f}" for v in row[key]) for key in ("dormant_previous", "dormant_self")]
            click.echo(f"| {path} | {i} | {' | '.join(cells)} | {row['residual_ratio']:.2f} | {' | '.join(elsewhere)} |")


if __name__ == "__main__":
    main()
