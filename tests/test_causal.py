"""The mechanism scale's causal test (experiments/causal.py, pages.causal_section; docs/preregistrations.md,
2026-12-03): planted references give C = Δgrow(mechanism) − Δgrow(control) paired by seed, its interval and its
reading as computed by hand; a check of the gate not met turns the reading into "not read as causal: <check>"."""
import math

from experiments import causal, pages

SEEDS = [42, 43, 44]
PASSING = {"teacher: massive_ratio_from_layer": [250.0] * 3, "teacher: sink_heads_from_layer": [0.5] * 3,
           "pre-grow: boundary_over_regular": [12.0, 1.0, 1.0], "pre-grow: kurtosis_distinct": [60.0, 1.0, 1.0],
           "pre-grow: massive_ratio": [150.0, 1.0, 1.0]}  # seed 42 alone is read: the others fail on purpose
NO_MECHANISM = {"teacher: massive_ratio_from_layer": [20.0] * 3, "teacher: sink_heads_from_layer": [0.0] * 3,
                "pre-grow: boundary_over_regular": [2.0] * 3, "pre-grow: kurtosis_distinct": [5.0] * 3,
                "pre-grow: massive_ratio": [15.0] * 3}


def planted(delta_grow, delta_joint, seeds=SEEDS, criteria=None):
    interaction = [g - j for g, j in zip(delta_grow, delta_joint)]
    tables = {"table1": {"delta_grow": delta_grow, "delta_joint": delta_joint, "interaction": interaction}}
    return {"seeds": seeds, "tables": tables | ({"criteria": criteria} if criteria else {}),
            "table_seeds": {"table1": seeds, **({"criteria": seeds} if criteria else {})}}


def pair(mechanism_criteria=PASSING, control_criteria=NO_MECHANISM):
    """C per seed by hand: (-0.10 - -0.01, -0.12 - -0.02, -0.08 - 0.00) = (-0.09, -0.10, -0.08); the control's
    seeds in another order, so pairing by position would give other numbers."""
    mechanism = planted([-0.10, -0.12, -0.08], [0.01, 0.02, 0.00], criteria=mechanism_criteria)
    control = planted([0.00, -0.01, -0.02], [0.00, 0.01, 0.01], seeds=[44, 42, 43], criteria=control_criteria)
    return mechanism, control


def test_c_is_paired_by_seed_and_read_by_the_declared_rule_when_the_gate_is_met():
    mechanism, control = pair()
    seeds, values = causal.paired(mechanism, control, "delta_grow")
    assert seeds == SEEDS and all(math.isclose(v, c, abs_tol=1e-12) for v, c in zip(values, [-0.09, -0.10, -0.08]))
    # mean -0.09, sample std 0.01; 95%: t(0.975, 2) = 4.30265 x 0.01 / sqrt(3) = 0.024841 either side;
    # the smallest tie margin: 0.09 + t(0.95, 2) = 2.91999 x 0.01 / sqrt(3) = 0.106859.
    s = pages.stats(values)
    assert math.isclose(s["ci95"][0], -0.114841, abs_tol=1e-6) and math.isclose(s["ci95"][1], -0.065159, abs_tol=1e-6)
    assert causal.gate_failure(causal.checks(mechanism, control)) is None
    text = "\n".join(pages.causal_section(mechanism, control))
    assert "C = Δgrow(mechanism) − Δgrow(control): -0.0900 [-0.1148, -0.0652] over 3 seeds reads **below 0**" in text
    assert "the smallest tie margin these seeds allow is ±0.1069." in text
    # The difference of interactions, by hand: mechanism (-0.11, -0.14, -0.08), control by seed (-0.02, -0.03, 0.00).
    _, difference = causal.paired(mechanism, control, "interaction")
    assert all(math.isclose(v, c, abs_tol=1e-12) for v, c in zip(difference, [-0.09, -0.11, -0.08]))
    assert text.count("| met |") == 3


def test_a_check_not_met_turns_the_reading_into_not_read_as_causal():
    failing_teacher = PASSING | {"teacher: massive_ratio_from_layer": [99.9] * 3}
    failing_student = PASSING | {"pre-grow: kurtosis_distinct": [49.0, 80.0, 80.0]}
    control_massive = NO_MECHANISM | {"teacher: massive_ratio_from_layer": [100.0] * 3}
    cases = [(failing_teacher, NO_MECHANISM, causal.GATE[0]), (failing_student, NO_MECHANISM, causal.GATE[1]),
             (PASSING, control_massive, causal.GATE[2]), (PASSING, PASSING, causal.GATE[2])]
    for mechanism_criteria, control_criteria, check in cases:
        mechanism, control = pair(mechanism_criteria, control_criteria)
        assert causal.gate_failure(causal.checks(mechanism, control)) == f"{check}: failed"
        text = "\n".join(pages.causal_section(mechanism, control))
        assert f"-0.0900 [-0.1148, -0.0652] over 3 seeds: **not read as causal: {check}: failed**" in text
        assert "reads **below 0**" not in text.split("Secondary")[0]
    mechanism, control = pair(None, None)  # no criteria table: nothing measured, nothing causal
    assert causal.gate_failure(causal.checks(mechanism, control)) == f"{causal.GATE[0]}: not yet measured"


def test_the_teachers_criterion_counts_only_layers_from_index_2():
    rows = [{"layer": 0, "massive_ratio": 900.0, "sink_heads": 1.0}, {"layer": 1, "massive_ratio": 500.0, "sink_heads": 0.9},
            {"layer": 2, "massive_ratio": 120.0, "sink_heads": 0.0}, {"layer": 3, "massive_ratio": None, "sink_heads": 0.25}]
    assert causal.teacher_criterion(rows) == {"massive_ratio_from_layer": 120.0, "sink_heads_from_layer": 0.25,
                                              "present": True}
    assert not causal.teacher_criterion(rows[:3])["present"]  # no sink from layer 2 on


def test_without_references_the_page_says_not_yet_run_and_shows_no_number():
    page = pages.render_mechanism(None, None)
    assert "Not yet run" in page and "C: not yet run" in page and not any(ch.isdigit() for ch in page.split("## The")[1]
                                                                         .replace("2026-12-03", ""))


def test_the_criteria_report_reaches_the_gate_through_the_reference():
    """What `repro.py scan` writes at these scales (criteria_numbers), as `repro.py reference` ships it
    (reference.report_numbers), is what the gate reads: the teacher's maxima from layer 2 at every seed, and
    seed 42's student deciding."""
    from experiments import reference
    layers = [{"layer": 1, "massive_ratio": 900.0, "sink_heads": 0.9},
              {"layer": 4, "massive_ratio": 180.0, "sink_heads": 0.5}]
    students = {43: {"boundary_over_regular": 1.0, "kurtosis_distinct": 1.0, "massive_ratio": 1.0},
                42: {"boundary_over_regular": 10.0, "kurtosis_distinct": 50.0, "massive_ratio": 100.0}}  # at the thresholds
    shipped = reference.report_numbers(causal.criteria_numbers(layers, students))
    assert shipped["teacher: massive_ratio_from_layer"] == [180.0, 180.0]
    assert shipped["pre-grow: kurtosis_distinct"] == [50.0, 1.0]
    mechanism = planted([-0.1, -0.1], [0.0, 0.0], seeds=[42, 43], criteria=shipped)
    control = planted([0.0, 0.0], [0.0, 0.0], seeds=[42, 43], criteria={k: v[:2] for k, v in NO_MECHANISM.items()})
    assert causal.checks(mechanism, control) == dict.fromkeys(causal.GATE, True)
