"""The checkpoint-interval model (tunekit.schedule.interval): Young's and Daly's formulas against their published
figures, Daly's expected runtime, the Gamma-Poisson estimate of the MTBF, and the clamps."""

from __future__ import annotations

import math

import pytest

from tunekit.errors import ConfigError
from tunekit.schedule.interval import (MtbfEstimate, choose_interval, daly_interval, expected_runtime, parse_duration,
                              young_interval)

MINUTE, HOUR = 60.0, 3600.0


def test_young_and_daly_against_the_published_example():
    # Daly (2006), section 5: M = 24 h, C = 5 min: Young's sqrt(2CM) = 120 min, the higher-order optimum 117 min
    assert young_interval(5 * MINUTE, 24 * HOUR) == pytest.approx(120 * MINUTE)
    assert daly_interval(5 * MINUTE, 24 * HOUR) / MINUTE == pytest.approx(116.7, abs=0.05)
    # beyond C >= 2M the optimum is M itself
    assert daly_interval(3 * HOUR, 1 * HOUR) == 1 * HOUR


@pytest.mark.parametrize("cost, mtbf", [(5 * MINUTE, 24 * HOUR), (2.0, 60.0), (0.5, 30.0)])
def test_dalys_interval_minimises_his_expected_runtime(cost, mtbf):
    best = daly_interval(cost, mtbf)
    at = lambda t: expected_runtime(1000 * HOUR, t, cost, mtbf)  # noqa: E731
    assert at(best) <= min(at(best * 0.8), at(best * 1.25))
    # numerically: the minimum of the model lies within 1% of Daly's closed form
    grid = [best * (0.5 + i / 1000) for i in range(1001)]
    assert min(grid, key=at) == pytest.approx(best, rel=0.01)


def test_expected_runtime_without_failures_is_the_work_plus_the_checkpoints():
    assert expected_runtime(100.0, 10.0, 0.5, None) == pytest.approx(105.0)
    # failures cost: more than the failure-free time, and more at a longer interval once T >> optimum
    assert expected_runtime(100.0, 10.0, 0.5, 30.0) > 105.0


def test_mtbf_estimate_updates_from_the_prior_with_the_failures_seen():
    no_prior = MtbfEstimate()
    assert no_prior.mtbf_s is None  # nothing known: only the overhead bound applies
    no_prior.observe(seconds=600.0)
    assert no_prior.mtbf_s is None
    no_prior.observe(seconds=600.0, failures=3)
    assert no_prior.mtbf_s == pytest.approx(400.0)  # 1200 s of training, 3 failures
    prior = MtbfEstimate(prior_s=6 * HOUR)  # Gamma(1, 6 h): one failure's weight
    assert prior.mtbf_s == pytest.approx(6 * HOUR)
    prior.observe(seconds=2 * HOUR, failures=3)  # failures far more often than believed: the estimate falls
    assert prior.mtbf_s == pytest.approx(8 * HOUR / 4)
    prior.observe(seconds=100 * HOUR)  # then none for a long time: it rises again
    assert prior.mtbf_s == pytest.approx(108 * HOUR / 4)


def test_choose_interval_clamps():
    daly = daly_interval(0.5, 30.0)
    assert choose_interval(cost_s=0.5, mtbf_s=30.0, max_overhead=None) == pytest.approx(daly)
    assert choose_interval(cost_s=0.5, mtbf_s=30.0, max_overhead=0.05) == pytest.approx(10.0)  # overhead bound
    assert choose_interval(cost_s=0.5, mtbf_s=None, max_overhead=0.05) == pytest.approx(10.0)
    assert choose_interval(cost_s=0.5, mtbf_s=30.0, write_s=8.0, max_overhead=None) == pytest.approx(8.0)
    assert choose_interval(cost_s=0.5, mtbf_s=1e9, max_overhead=0.05, max_interval_s=600.0) == 600.0
    assert choose_interval(cost_s=0.5, mtbf_s=30.0, max_overhead=None, min_interval_s=20.0) == 20.0
    assert math.isinf(choose_interval(cost_s=0.5, mtbf_s=None, max_overhead=None))


def test_durations_and_their_errors():
    assert parse_duration("6h", "f", "x") == 6 * HOUR and parse_duration("15min", "f", "x") == 15 * MINUTE
    assert parse_duration(90, "f", "x") == 90.0 and parse_duration("1.5d", "f", "x") == 1.5 * 86400
    for bad in ("soon", "-3h", 0, "6 hours", True):
        with pytest.raises(ConfigError, match=r"^CheckpointAutopilot\(mtbf=.*expected a positive duration"):
            parse_duration(bad, "CheckpointAutopilot", "mtbf")


def test_the_cost_and_interval_keys_are_bookkeeping_not_metrics():
    from tunekit._keys import INTERVAL_KEY, SAVE_BLOCKED_KEY, SAVE_WRITE_KEY
    from tunekit.experiment.snapshot import RAY_KEYS

    # status/report/gc metric lists and `tunekit check`'s run comparison skip them (a save's cost differs run to run)
    assert {SAVE_BLOCKED_KEY, SAVE_WRITE_KEY, INTERVAL_KEY} <= RAY_KEYS
