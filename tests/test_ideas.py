"""The paper's seven proposed improvements as options (issue 33; docs/preregistrations.md, 2026-12-02),
each tested by value, and the `ideas` experiment at smoke scale."""
import math

import pytest
from conftest import make_config

import config
import errors

# ---- 1. transition-aware learning rate -------------------------------------------------------------

def test_asymmetric_transition_schedule_sets_the_lr_at_named_steps():
    """The toy's phases (250 steps, warmup 25, beta2 0.95): phase 0 as before; after the first append a
    warmup of 2 x 25 = 50 steps; after the second 0.5 x 25 = 12, raised to AdamW's horizon 1/(1 - 0.95) = 20."""
    c = make_config(phase_steps=250, warmup_frac=0.1, lr=3e-3, min_lr=3e-5, transition_schedule="asymmetric")
    plain = make_config(phase_steps=250, warmup_frac=0.1, lr=3e-3, min_lr=3e-5)
    lr = lambda step, phase: config.learning_rate(c, step, phase)
    assert [lr(s, 0) for s in (0, 24, 100)] == [config.learning_rate(plain, s, 0) for s in (0, 24, 100)]
    assert lr(24, 0) == pytest.approx(3e-3)
    assert lr(24, 1) == pytest.approx(3e-3 * 25 / 50) and lr(49, 1) == pytest.approx(3e-3)
    assert lr(9, 2) == pytest.approx(3e-3 * 10 / 20) and lr(19, 2) == pytest.approx(3e-3)
    # the cosine over the 230 steps after that warmup, toward min_lr
    assert lr(249, 2) == pytest.approx(3e-5 + 0.5 * (3e-3 - 3e-5) * (1 + math.cos(math.pi * 229 / 230)))


def test_explicit_transition_schedule_scales_warmup_and_peak_per_transition():
    c = make_config(phase_steps=100, warmup_frac=0.25, lr=1e-3, min_lr=1e-5, transition_schedule="1:0.5,3:2")
    assert config.learning_rate(c, 24, 1) == pytest.approx(0.5e-3)           # warmup 25, peak halved
    assert config.learning_rate(c, 74, 2) == pytest.approx(2e-3)             # warmup 75, peak doubled
    assert config.learning_rate(c, 36, 2) == pytest.approx(2e-3 * 37 / 75)
    for bad in ("fast", "2:1", "2:1,0:1", "2:1,x:1", "2:1:3,1:1"):
        with pytest.raises(errors.ConfigError, match="transition_schedule"):
            make_config(transition_schedule=bad)
