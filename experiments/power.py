"""The power of the kit's reading rule (report.reading) by Monte Carlo, each seed's difference drawn from
N(effect, sd^2): what a pre-registration plans its seeds with.

    python -m experiments.power     # mini's eight-seed plan (docs/preregistrations.md, issue 57) from its reference

The plan reads the per-seed SD of mini's interaction in the shipped reference: its three seeds when the study was
planned (d4f63c5, whose preregistration quotes the numbers), its eight since, so it now gives the power as observed.
"""

import json
import math
from pathlib import Path

import numpy as np

from experiments import presets, report

PAPER_INTERACTION = -0.0332  # Table 1: Δgrow - Δjoint (paper.py's values, rounded as the paper prints them)


def draws_of(effect: float, sd: float, n: int, draws: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(means, standard errors) of `draws` samples of n seeds, seeded: the same numbers every time."""
    x = np.random.default_rng(seed).normal(effect, sd, size=(draws, n))
    return x.mean(1), x.std(1, ddof=1) / math.sqrt(n)


def power(effect: float, sd: float, n: int, draws: int = 200_000, seed: int = 0) -> float:
    """P(the 95% t-interval of n seeds excludes 0 on the side of `effect`'s sign; above 0 for 0)."""
    mean, se = draws_of(effect, sd, n, draws, seed)
    half = report.t_quantile(n - 1, 0.975) * se
    return float((mean + half < 0).mean() if effect < 0 else (mean - half > 0).mean())


def tie_power(effect: float, sd: float, n: int, margin: float, draws: int = 200_000, seed: int = 0) -> float:
    """P(the 90% t-interval of n seeds lies inside ±margin): the rule's chance to read a tie."""
    mean, se = draws_of(effect, sd, n, draws, seed)
    return float((np.abs(mean) + report.t_quantile(n - 1, 0.95) * se < margin).mean())


def mini_plan(reference: Path = Path("references/mini.json"), ns=(3, 4, 6, 8, 10, 12)) -> dict:
    """The per-seed SD of mini's interaction in `reference` and the rule's power at it, by seeds."""
    ce = {name: np.array(values) for name, values in json.loads(reference.read_text())["final_ce"].items()}
    interaction = (ce["post-grow"] - ce["pre-grow"]) - (ce["post-joint"] - ce["pre-joint"])
    sd = float(interaction.std(ddof=1))
    return {"interaction_per_seed": interaction.tolist(), "sd": sd, "margin": presets.TIE_MARGIN,
            "power": [{"n": n, "below_0_at_paper": power(PAPER_INTERACTION, sd, n),
                       "below_0_at_half_paper": power(PAPER_INTERACTION / 2, sd, n),
                       "tie_at_0": tie_power(0.0, sd, n, presets.TIE_MARGIN),
                       "tie_at_0_sd_x1.5": tie_power(0.0, 1.5 * sd, n, presets.TIE_MARGIN)} for n in ns]}


if __name__ == "__main__":
    print(json.dumps(mini_plan(), indent=1))
