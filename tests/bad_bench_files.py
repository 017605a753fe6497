"""The bad-input table's cases (run by tests/test_bench.py) of the bench.json the dry run's estimate for this
CPU reads (issue 59, class 2: "the time estimate believes any number"). None is an error: each is a
train_step or environment edited, damaged, or measured elsewhere, and the estimate times a step now instead,
its line naming the file and why it was not used (tools/cpu_estimate.bench_rate)."""
import pytest

from tools import bench

GOOD_STEP = {"step_gflop": 2.0, "kit_post_fp32_s": 0.5}


def here() -> dict:
    """The environment this machine's bench would record: the CPU and thread count a bench.json must match."""
    return bench.environment()


def bench_file(id: str, content, why: str):
    """A case: bench.json holding `content` (a callable of here(), or text), and the clause saying why it was not used."""
    return pytest.param(content, why, id=id)


def with_step(**step):
    return lambda env: {"environment": env, "train_step": {**GOOD_STEP, **step}}


BENCH_FILES = [
    bench_file("a step of -0.5 s", with_step(kit_post_fp32_s=-0.5), "kit_post_fp32_s -0.5 is outside 1e-06-100000"),
    bench_file("1e300 GFLOP in 1e-300 s", with_step(step_gflop=1e300, kit_post_fp32_s=1e-300),
               "step_gflop 1e+300 is outside 1e-06-1e+06"),
    bench_file("a step of 0 s", with_step(kit_post_fp32_s=0), "kit_post_fp32_s 0 is outside 1e-06-100000"),
    bench_file("a step of true s", with_step(kit_post_fp32_s=True), "kit_post_fp32_s is 'True', not a number"),
    bench_file("step_gflop a string", with_step(step_gflop="27"), "step_gflop is '27', not a number"),
    bench_file("a rate above a petaFLOP/s", with_step(step_gflop=1e5, kit_post_fp32_s=1e-5),
               "its step runs at 1e+10 GFLOP/s"),
    bench_file("no kit_post_fp32_s", lambda env: {"environment": env, "train_step": {"step_gflop": 2.0}},
               "no kit_post_fp32_s"),
    bench_file("no environment", lambda env: {"train_step": GOOD_STEP}, "no environment or train_step"),
    bench_file("train_step a list", lambda env: {"environment": env, "train_step": [2.0, 0.5]},
               "no environment or train_step"),
    bench_file("a list", lambda env: [env, GOOD_STEP], "no environment or train_step"),
    bench_file("not JSON", "{", "not readable JSON"),
    bench_file("NaN seconds", '{"environment": {}, "train_step": {"kit_post_fp32_s": NaN}}', "not readable JSON"),
    bench_file("measured on another CPU", lambda env: {"environment": {**env, "cpu": "AMD EPYC 9654"},
                                                       "train_step": GOOD_STEP},
               "measured on another CPU or thread count (AMD EPYC 9654, "),
    bench_file("measured on another thread count", lambda env: {"environment": {**env, "threads": env["threads"] + 7},
                                                                "train_step": GOOD_STEP},
               "measured on another CPU or thread count ("),
    bench_file("an environment without its CPU", lambda env: {"environment": {"date": "2026-12-02"},
                                                               "train_step": GOOD_STEP},
               "measured on another CPU or thread count (None, None thread(s))"),
]
