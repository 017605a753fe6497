"""A setting's path from the command line to where it acts: `--set run.lr` walked to the optimizer's groups."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import config
from experiments import presets, suite, variants
from experiments.suite import RunName
from plumbing import devices, errors
from tests.conftest import repro_cli


def test_set_run_lr_reaches_every_optimizer_group_at_every_step(tmp_path, monkeypatch):
    """`train --set run.lr=X` trains with X as the schedule's peak: at every optimizer step of the student,
    each AdamW group's lr is config.learning_rate of the run's settings at that step, computed here apart.
    The comparison is exact: the kit sets the group's lr to that very float (no arithmetic in between)."""
    lr = 3e-4
    assert presets.PRESETS["smoke"].run["lr"] != lr  # otherwise the test could not tell --set from the default
    seen: list[list[float]] = []
    step = torch.optim.AdamW.step

    def recording(self, *args, **kwargs):
        seen.append([group["lr"] for group in self.param_groups])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    repro_cli("train", "--scale", "smoke", "--norm", "post", "--protocol", "grow", "--set", f"run.lr={lr}",
              "--runs-dir", tmp_path / "runs")
    [saved] = (tmp_path / "runs").glob("**/s42/post-grow/config.json")
    settings = config.RunConfig(**json.loads(saved.read_text()))
    assert settings.lr == lr
    expected = [config.learning_rate(settings, s, phase.index)
                for phase in config.plan_phases(settings) for s in range(phase.steps)]
    student = seen[-len(expected):]  # the kit's own teacher trained first, in this process, at its own lr
    assert [groups[0] for groups in student] == expected and all(len(set(groups)) == 1 for groups in student)
    assert max(expected) == lr  # the peak reached at warmup's end: the value given on the command line


def test_a_variant_or_grid_point_passes_the_checks_a_set_value_passes():
    """presets.with_settings is the one way a run's settings differ from its preset (--set, a regime grid point, an
    experiment's variant): the values merged as --set merges them, and a value --set would refuse refused too."""
    preset = presets.PRESETS["smoke"]
    assert presets.with_settings(preset, {"run": {"lr": 3e-4}}, "--grid").run == {**preset.run, "lr": 3e-4}
    assert presets.with_settings(preset, {"run": {"lr": 3e-4}}, "--grid") == \
        presets.apply_overrides(preset, presets.parse_overrides(preset, ["run.lr=3e-4"]))[0]
    with pytest.raises(errors.OptionError, match=r"--grid: run\.lr=1000000000\.0: expected from 0 to 1,000"):
        presets.with_settings(preset, {"run": {"lr": 1e9}}, "--grid")
    ws = suite.Workspace(preset, Path("runs") / "smoke", Path("results") / "smoke", devices.Dist())
    dose = variants.Variant("pre-grow + dose-channel 1e9x", RunName("pre", "grow"), "dose-channel-1e9",
                          {"run": {"boundary": "dose-channel", "boundary_scale": 1e9}})
    with pytest.raises(errors.OptionError, match="dose-channel 1e9x.*boundary_scale"):
        variants.variant_workspace(ws, dose, 42)
    allowed = replace(dose, settings={"run": {**dose.settings["run"], "boundary_scale": 1000.0}})
    vws = variants.variant_workspace(ws, allowed, 42)
    assert vws.preset.run == {**preset.run, "boundary": "dose-channel", "boundary_scale": 1000.0}
    assert (vws.variant, vws.student_runs) == (allowed.folder, ws.student_runs)  # its freeze runs find the suite's grow


