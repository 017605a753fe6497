"""normgrow: reproduce "Post-Norm under Curriculum Depth Growing", from a laptop to a GPU cluster.

    python repro.py --help
    python repro.py export runs/toy/pre-grow/final out/pre-grow-hf       # pre-norm student -> HF Qwen3
"""
from __future__ import annotations

from pathlib import Path

import click

import model

# Mistakes a user can make (a wrong path, a bad checkpoint, a bad value) print as one line, no trace.
USER_ERRORS = (model.CheckpointError, FileExistsError, ValueError)


class Repro(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=Repro, context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Reproduce every table and figure of the paper at the scale you choose.

    Scales: smoke (CI, minutes), toy (laptop CPU, offline), small (one GPU), full (the paper, torchrun).
    """


@cli.command()
@click.argument("student_dir", type=click.Path(path_type=Path))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite OUT_DIR if it already exists.")
def export(student_dir: Path, out_dir: Path, force: bool):
    """Write a pre-norm student checkpoint as a standard HF Qwen3 directory (transformers loads it)."""
    if out_dir.exists() and not force:
        raise FileExistsError(f"{out_dir}: already exists; choose another folder or pass --force to overwrite it")
    student = model.Student.load(student_dir)
    model.export_hf(student, out_dir)
    click.echo(f"exported {student.config.num_hidden_layers}-layer pre-norm student to {out_dir}")


if __name__ == "__main__":
    cli()
