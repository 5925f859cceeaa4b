"""The control loop's timing on the wall clock: ``ScheduleSpin`` holds a tick until a fixed
offset after its timer's scheduled time, and is off under sim time.

The spin is tested on a fake clock (what it waits for, not how long the machine takes);
the period it buys is measured by bench/control_loop.py, not here.
"""

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from ros_helpers import spin_until
from rosgraph_msgs.msg import Clock
from test_robot_train import spec_file

from unilab_ros.robot.spec import load_spec
from unilab_ros.robot.steps import RobotSteps
from unilab_ros.ros.spec_link import RobotLink, ScheduleSpin


class FakeClock:
    """Seconds that advance by ``step`` on every read; counts the reads."""

    def __init__(self, step: float) -> None:
        self.now, self.step, self.reads = 0.0, step, 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.step
        return self.now


def test_a_tick_that_woke_early_in_the_margin_waits_to_the_margin():
    clock = FakeClock(1e-5)
    spin = ScheduleSpin(period=0.005, margin=0.001, clock=clock)
    # Woken 0.2 ms after its scheduled time: 4.8 ms to the next call.
    spin.wait(until_next_call=0.0048)
    # It left at 0.8 ms of its own clock after it began, not before.
    assert clock.now == pytest.approx(0.0008, abs=2e-5)
    assert spin.summary()["late_p50_ms"] == pytest.approx(0.2)


def test_a_tick_woken_past_the_margin_runs_at_once():
    clock = FakeClock(1e-5)
    spin = ScheduleSpin(period=0.005, margin=0.001, clock=clock)
    spin.wait(until_next_call=0.0035)
    assert clock.reads == 0
    assert spin.summary() == {"margin_ms": 1.0, "late_p50_ms": 1.5, "late_p99_ms": 1.5}


def test_no_margin_never_waits_and_still_reports_the_lateness():
    clock = FakeClock(1e-5)
    spin = ScheduleSpin(period=0.02, margin=0.0, clock=clock)
    for late in (0.0001, 0.0003, 0.002):
        spin.wait(until_next_call=0.02 - late)
    assert clock.reads == 0
    summary = spin.summary()
    assert summary["late_p50_ms"] == pytest.approx(0.3)
    assert summary["late_p99_ms"] == pytest.approx(np.percentile([0.1, 0.3, 2.0], 99))


def test_the_margin_is_at_most_half_the_period_and_a_reset_timer_is_no_wake_up():
    clock = FakeClock(1e-5)
    spin = ScheduleSpin(period=0.004, margin=0.01, clock=clock)
    assert spin.margin == pytest.approx(0.002)
    # More than a period to the next call: the timer was reset, not woken late.
    spin.wait(until_next_call=0.005)
    assert clock.reads == 0
    assert spin.summary()["late_p50_ms"] is None


@pytest.mark.ros
def test_under_sim_time_the_ticks_follow_the_clock_and_never_spin(context, tmp_path):
    node = rclpy.create_node("sim_timed", context=context, parameter_overrides=[
        Parameter("use_sim_time", value=True)])
    clock_node = rclpy.create_node("sim_clock", context=context)
    publisher = clock_node.create_publisher(Clock, "/clock", 10)
    spec = load_spec(spec_file(tmp_path))
    ticks: list[float] = []
    link = RobotLink(node, spec, RobotSteps(spec, np.random.default_rng(0)), "",
                     QoSProfile(depth=10), ticks.append, spin_margin=0.001)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    executor.add_node(clock_node)
    sim_ns = 0

    def advance() -> None:
        nonlocal sim_ns
        sim_ns += 5_000_000
        publisher.publish(Clock(clock=rclpy.time.Time(nanoseconds=sim_ns).to_msg()))

    clock_node.create_timer(0.002, advance)
    try:
        assert spin_until(executor, lambda: len(ticks) >= 10, 10.0)
        # The control period (20 ms at 50 Hz) in sim time; no wake-up measured, no spin.
        assert np.all(np.diff(ticks) == pytest.approx(0.02, abs=0.0051))
        assert link.status(ticks[-1])["timer_wake"]["late_p50_ms"] is None
    finally:
        link.destroy()
        executor.shutdown()
        node.destroy_node()
        clock_node.destroy_node()
