"""The paper's numbers, each typed once: its setup (Table A1), its tables and the values its text gives for the
figures; presets.py builds the `full` scale from RUN. The differences it states are computed from its tables,
and equal the values its text prints (tested).

    paper.PAPER["table1"]["post"]["grow"]        # 2.7330
    paper.DELTAS["interaction"]                  # -0.0332
"""

RUN = dict(  # Table A1 and the setup (Sections 3-4, Appendix C), as RunConfig fields
    seed=42, blocks=3, layers_per_block=3, phase_steps=50_000, global_batch=64, lr=1e-4, min_lr=1e-6,
    warmup_frac=0.015, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, grad_clip=0.5,
    alpha=0.7, gamma=0.3, tau=1.0, eval_interval=2000)
# The thresholds the paper's follow-up ideas name for a boundary monitor (per-token RMS, kurtosis).
MONITOR_WARN = {"rms": 20.0, "kurtosis": 1000.0}


PHASE_STEPS = RUN["phase_steps"]  # the paper's steps per phase; windows stated in paper steps scale from it

PAPER = {
    "table1": {"pre": {"joint": 2.7603, "grow": 2.7658}, "post": {"joint": 2.7607, "grow": 2.7330}},
    # Table 2: phase 0 (one block). Its "KD" has the scale of the soft-target CE H(q_T, q_S).
    "table2": {"pre": {"ce": 2.9802, "kd": 3.0155, "ppl": 19.69}, "post": {"ce": 2.9846, "kd": 3.0183, "ppl": 19.78}},
    "table3": {"post-joint": 2.7607, "post-joint-long": 2.7518, "post-joint-longer": 2.7428, "post-grow": 2.7330},
    # Table A2, in billions of tokens: (total, unique).
    "table_a2": {"post-joint": (3.11, 3.11), "post-grow": (9.34, 3.11), "post-joint-long": (6.22, 6.22),
                 "post-joint-longer": (9.34, 9.34)},
    "table_a3": {"pre": {"grow": 2.7658, "freeze": 2.9104}, "post": {"grow": 2.7330, "freeze": 2.8772},
                 "ppl_gap": {"grow": -0.51, "freeze": -0.60}},
    # Figure 3b gives no numbers; phase 0 is Table 2 (single block), phase 2 is Table 1's grow endpoint.
    "per_phase_ce": {"pre": {0: 2.9802, 2: 2.7658}, "post": {0: 2.9846, 2: 2.7330}},
    # Figure 4, after block 0: pre-norm rises first -> last grow checkpoint; post-norm stays in a range.
    "boundary_std_after_block0": {"pre": (5.81, 19.98), "post_range": (0.07, 0.19)},
    # Figure 5a: first -> last checkpoint; post-norm only at 150k ("2.45 vs 2.40": boundary, regular).
    "token_type_rms": {"pre": {"boundary": (119.0, 425.0), "regular": (7.1, 11.5)},
                       "post": {"boundary": (None, 2.45), "regular": (None, 2.40)}},
    "final_kurtosis_pre_above": 2400.0,  # Figure A1: Pearson or excess is not said; at 2400 it hardly matters
    "table4": {
        "pre-grow": {"delta_ce": (8.13, 2.36, 0.02), "angular_distance": (0.499, 0.310, 0.031)},
        "post-grow": {"delta_ce": (8.32, 3.74, 2.38), "angular_distance": (0.483, 0.365, 0.342)},
        "pre-joint": {"delta_ce": (8.05, 1.47, 2.34), "angular_distance": (0.485, 0.245, 0.360)},
        "post-joint": {"delta_ce": (0.55, 0.99, 4.00), "angular_distance": (0.395, 0.166, 0.437)},
    },
    # Table A4 (pre, post) at the two transitions, in the paper's 50k-step phases.
    "table_a4": {
        "pre": [{"jump": 0.0226, "auc_1k": 0.0694, "auc_5k": 0.1217, "recovery_steps": 101},
                {"jump": 0.0230, "auc_1k": 0.0688, "auc_5k": 0.1277, "recovery_steps": 19054}],
        "post": [{"jump": 0.2500, "auc_1k": 0.1820, "auc_5k": 0.1464, "recovery_steps": 19914},
                 {"jump": 0.2847, "auc_1k": 0.2059, "auc_5k": 0.1774, "recovery_steps": 19426}],
    },
}


def _deltas() -> dict:
    """The differences the paper states, from its own tables, rounded as it prints them (4 decimals)."""
    t1, a3 = PAPER["table1"], PAPER["table_a3"]
    joint, grow = t1["post"]["joint"] - t1["pre"]["joint"], t1["post"]["grow"] - t1["pre"]["grow"]
    freeze = a3["post"]["freeze"] - a3["pre"]["freeze"]
    return {k: round(v, 4) for k, v in {"delta_joint": joint, "delta_grow": grow, "interaction": grow - joint,
                                          "delta_freeze": freeze, "delta_freeze_minus_grow": freeze - grow}.items()}


DELTAS = _deltas()
