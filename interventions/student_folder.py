"""A block-stack student's checkpoint folder: config.json (the HF fields, plus the student's shape and
interventions under "normgrow_student") and model.safetensors, written atomically with checksums and read back
only after its shape is checked. model.Student takes these methods from `StudentFolder`, as it takes its boundary
modules from boundary.BoundaryInputs, whose checkpoint entries it reads and checks; moved from model.py.

    student.save("runs/x/final")                         # config.json + model.safetensors
    student = model.Student.load("runs/x/final")         # on the meta device, then filled from the file
"""
from pathlib import Path

import torch

from interventions.boundary import checkpoint_entries_problem, read_checkpoint_entries
from plumbing.checkpoint import load_tensors, read_config, write_checkpoint
from plumbing.errors import CheckpointError
from plumbing.hf_qwen3 import ModelConfig


class StudentFolder:
    """model.Student's checkpoint folder (a mixin: the student's constructor and attributes are model.py's)."""

    def checkpoint_config(self) -> dict:
        """config.json of a student checkpoint: the HF fields plus the student's shape."""
        shape = {"blocks": self.blocks, "layers_per_block": self.layers_per_block, "norm": self.norm_placement,
                 **self.checkpoint_entries()}
        return {**self.config.to_hf(), "architectures": ["NormgrowStudent"], "normgrow_student": shape}

    def save(self, path, state: dict | None = None):
        """config.json and model.safetensors; `state` replaces state_dict() (e.g. gathered shards)."""
        write_checkpoint(path, self.checkpoint_config(), self.state_dict() if state is None else state)

    @classmethod
    def load(cls, path, dtype=torch.float32, device="cpu"):
        path = Path(path)
        hf = read_config(path)
        shape = hf.get("normgrow_student")
        if not shape:
            raise CheckpointError(f"{path / 'config.json'}: not a normgrow student (no 'normgrow_student' entry); "
                                  "use model.load_qwen3 for a plain Qwen3 checkpoint")
        damaged = "the config is damaged: restore the checkpoint from a copy"
        if problem := shape_problem(shape):
            raise CheckpointError(f"{path / 'config.json'}: {problem}; {damaged}")
        boundary, boundary_scale, features, corrected = read_checkpoint_entries(shape)
        config = ModelConfig.from_hf(hf, str(path / "config.json"))
        try:  # what the shape's types leave unchecked: its placement schedule (model.block_norms)
            with torch.device("meta"):
                student = cls(config, shape["blocks"], shape["layers_per_block"], shape["norm"], boundary,
                              boundary_scale, features)
        except ValueError as e:
            raise CheckpointError(f"{path / 'config.json'}: normgrow_student.norm: {e}; {damaged}") from None
        student.corrected = corrected
        load_tensors(student, path, dtype, device, name_in_file=lambda name: name)
        student.embed_tokens.weight.requires_grad_(False)
        return student


def shape_problem(shape) -> str:
    """Why a config.json's normgrow_student entry cannot describe a student ("" if it can), checked
    before the student is built so that a bad value names the field, not a line inside the model."""
    if not isinstance(shape, dict):
        return f"normgrow_student is {shape!r}, not an object of blocks, layers_per_block and norm"
    for key in ("blocks", "layers_per_block"):
        value = shape.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return f"normgrow_student.{key} is {'missing' if key not in shape else repr(value)}, not a positive integer"
    norm = shape.get("norm")
    if not isinstance(norm, str):
        return f"normgrow_student.norm is {'missing' if 'norm' not in shape else repr(norm)}, not a placement name"
    return checkpoint_entries_problem(shape)
