"""``TickWindows``: a learner beside a periodic control loop computes between its ticks."""

import pytest

from unilab_ros.rl.tick_windows import MIN_PERIODS, TickWindows

PERIOD, QUIET, STEP = 0.020, 0.003, 0.004


def ticking(quiet: float = QUIET, step: float = STEP, jitter: float = 0.0) -> TickWindows:
    """Windows that heard MIN_PERIODS + 1 steps arrive, the last at 0.0."""
    windows = TickWindows(quiet)
    for k in range(-MIN_PERIODS, 1):
        windows.arrived(k * PERIOD + (jitter if k % 2 else 0.0))
    windows.stepped(step)
    return windows


def test_the_learner_keeps_clear_of_each_tick():
    windows = ticking()
    assert windows.period == pytest.approx(PERIOD)
    # Just after the step arrived: wait out the quiet time.
    assert windows.wait(0.001) == pytest.approx(QUIET - 0.001)
    # Between the ticks: compute.
    assert windows.wait(0.005) == 0.0
    assert windows.wait(PERIOD - QUIET - STEP) == 0.0
    # A step would run into the next tick's quiet time: wait for that tick's step (its
    # arrival ends the wait) or, if it is late, for the window after it.
    assert windows.wait(0.014) == pytest.approx(PERIOD + QUIET - 0.014)
    windows.arrived(PERIOD)
    assert windows.wait(PERIOD + 0.001) == pytest.approx(QUIET - 0.001)


def test_a_step_longer_than_the_window_still_starts_once_a_tick():
    windows = ticking(step=0.018)
    assert windows.wait(0.005) == 0.0
    assert windows.wait(0.5 * PERIOD) == 0.0
    assert windows.wait(0.011) > 0.0


@pytest.mark.parametrize("case", ["off", "too few steps", "irregular", "stopped"])
def test_without_a_periodic_loop_the_learner_computes_whenever_it_can(case):
    if case == "off":
        windows = ticking(quiet=0.0)
    elif case == "too few steps":
        windows = TickWindows(QUIET)
        for k in range(MIN_PERIODS - 1):
            windows.arrived(k * PERIOD)
    elif case == "irregular":
        windows = ticking(jitter=0.3 * PERIOD)
    else:
        windows = ticking()
        assert windows.wait(3.0 * PERIOD) == 0.0
        return
    assert windows.period is None
    assert windows.wait(0.001) == 0.0
