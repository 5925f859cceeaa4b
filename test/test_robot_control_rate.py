"""Issue 41 (7): a trainer that cannot keep up with a fast robot must say so. RobotSteps
measures the control rate in the robot's time (its data's stamps) and counts a window below
90 % of the spec's rate; a step far longer than a control period in that time is not
learned from. ROS-free: the node clock here lags the robot's stamps, as a busy trainer's
/clock does."""

from __future__ import annotations

import numpy as np
import pytest
from test_robot_steps import cartpole_steps, joints

from unilab_ros.loop.steps import SegmentStart, Transition
from unilab_ros.robot.control_rate import RATE_WINDOW_S, ControlRate


def run(steps, robot_dt: float, ticks: int, node_dt: float = 0.02, start: float = 0.0):
    """``ticks`` acting ticks, the robot's stamps ``robot_dt`` apart and the node clock
    ``node_dt`` apart; the events and the shortfalls seen."""
    events, shortfalls = [], []
    for i in range(ticks):
        robot_t, node_t = start + i * robot_dt, start + i * node_dt
        steps.on_sample("joints", joints(robot_t), node_t)
        event = steps.tick(node_t)
        events.append(event)
        if steps.shortfall is not None:
            shortfalls.append(steps.shortfall)
        if event is not None and not steps.needs_reset:
            obs = event.obs if isinstance(event, SegmentStart) else event.next_obs
            steps.action_sent(obs, np.array([[0.1]], np.float32), 0, node_t)
    return events, shortfalls


def long_episodes():
    return cartpole_steps(terminations=[{"kind": "episode_length", "max_steps": 100_000}])


def test_a_loop_at_the_specs_rate_reports_it_and_no_shortfall():
    steps = long_episodes()
    _, shortfalls = run(steps, 0.02, 600)
    assert shortfalls == [] and steps.counters["rate_shortfalls"] == 0
    assert steps.rate.summary()["achieved_hz"] == pytest.approx(50.0, rel=0.01)
    assert steps.counters["late_steps"] == 0


def test_a_loop_that_misses_half_its_ticks_is_a_shortfall_in_robot_time():
    """The node clock ticks every period (it lags the robot), so only the stamps show that
    every tick comes two of the robot's periods after the last."""
    steps = long_episodes()
    events, shortfalls = run(steps, 0.04, 400)
    assert len(shortfalls) == steps.counters["rate_shortfalls"] == 3
    assert shortfalls[0].achieved_hz == pytest.approx(25.0, rel=0.01)
    assert shortfalls[0].expected_hz == 50.0 and shortfalls[0].window_s >= RATE_WINDOW_S
    # Two periods are within the step deadline (3): these steps are still learned from.
    assert all(isinstance(event, Transition) for event in events[1:])


def test_a_step_far_longer_than_a_period_in_robot_time_is_not_learned_from():
    steps = long_episodes()
    run(steps, 0.02, 3)
    # The robot's data jumped 0.5 s (25 periods) while the node clock moved one period.
    steps.on_sample("joints", joints(0.54), 0.06)
    event = steps.tick(0.06)
    assert isinstance(event, SegmentStart)
    assert steps.counters["late_steps"] == 1 and steps.counters["steps_dropped"] == 1
    assert steps.counters["steps_completed"] == 2
    # The loop cuts the segment as a time-out: ``expired`` reports the cut once.
    assert steps.cut_pending and steps.expired(0.06) and not steps.expired(0.06)
    assert not steps.needs_reset


def test_a_pause_or_a_gap_longer_than_a_window_is_no_shortfall():
    rate = ControlRate(0.02)
    for i in range(100):
        assert rate.tick(i * 0.02) is None
    # An update of a robot that was not paused: 7 s of robot time without ticks.
    assert rate.tick(2.0 + 7.0) is None
    rate.restart()
    assert all(rate.tick(20.0 + i * 0.02) is None for i in range(300))
    assert rate.achieved_hz == pytest.approx(50.0, rel=0.01)


def test_the_window_spans_episodes_shorter_than_itself():
    """Resets between 1 s episodes are left out of the window, not a reason to start it
    over: a loop at half rate is still found."""
    rate = ControlRate(0.02)
    shortfalls = []
    for episode in range(12):
        rate.restart()
        start = episode * 3.0
        shortfalls += [rate.tick(start + i * 0.04) for i in range(25)]
    found = [s for s in shortfalls if s is not None]
    assert len(found) == 2 and found[0].achieved_hz == pytest.approx(25.0, rel=0.01)
