"""RivalHold without ROS: while a rival commands the robot the loop neither acts on the
robot nor learns, and the operator's e-stop and the rival's hold combine."""

from __future__ import annotations

import numpy as np
from test_training_loop import Driver, is_safe

from unilab_ros.loop.decisions import BeginUpdate, PublishAction
from unilab_ros.trainer.rival_hold import RivalHold

RIVAL = ["action is also published by /rival"]


class Lines:
    """A logger that keeps (level, line)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def fatal(self, message: str) -> None:
        self.lines.append(("fatal", message))

    def error(self, message: str) -> None:
        self.lines.append(("error", message))

    def info(self, message: str) -> None:
        self.lines.append(("info", message))


def test_steps_under_a_rival_are_never_stored_nor_start_an_update():
    """The trainer logged "acting stopped" and still stored 2,970 steps and ran two
    updates on steps the rival's commands took."""
    driver = Driver()
    log = Lines()
    hold = RivalHold(driver.loop, log)
    driver.start()
    driver.step()
    stored, env_steps = driver.loop.stored_steps, driver.agent.env_steps
    decisions = hold.check(RIVAL, newcomer=False)
    assert all(isinstance(d, PublishAction) and is_safe(d.command) for d in decisions)
    for _ in range(3 * driver.agent.cfg.num_steps):
        decision = driver.step()
        assert not isinstance(decision, BeginUpdate), "an update began from a rival's steps"
    assert driver.agent.env_steps == env_steps and driver.loop.updates_run == 0
    assert driver.loop.stored_steps <= stored
    # The hold forgot the step outstanding when it began: the first delivery starts anew.
    assert hold.status() == {"rivals": RIVAL, "rival_holds": 1,
                             "rival_steps_not_learned": 3 * driver.agent.cfg.num_steps - 1}
    assert driver.loop.counters["estops"] == 0, "a rival's hold is no operator e-stop"
    assert hold.check([], newcomer=False) == []
    assert [(level, line.split(":")[0]) for level, line in log.lines] == [
        ("error", RIVAL[0]), ("info", "the rival is gone")]
    # The next action answers the rival's last step and is the policy's; the step after
    # it is learned from, as the first of a new segment.
    driver.step()
    driver.step()
    assert driver.agent.env_steps == env_steps + driver.agent.cfg.num_envs
    assert hold.status() == {"rivals": [], "rival_holds": 1,
                             "rival_steps_not_learned": 3 * driver.agent.cfg.num_steps - 1}


def test_the_operators_estop_outlasts_a_rival_and_a_rival_outlasts_it():
    driver = Driver()
    hold = RivalHold(driver.loop, Lines())
    driver.start()
    hold.set_operator_estop(True)
    hold.set_rivals(RIVAL)
    hold.set_rivals([])
    assert driver.loop.estop, "the rival left, but the operator's e-stop is still on"
    hold.set_rivals(RIVAL)
    hold.set_operator_estop(False)
    assert driver.loop.estop, "the operator released, but the rival still commands"
    hold.set_rivals([])
    assert not driver.loop.estop
    assert driver.loop.counters["estops"] == 1 and hold.holds == 2


def test_a_newcomer_refuses():
    driver = Driver()
    log = Lines()
    hold = RivalHold(driver.loop, log)
    hold.check(RIVAL, newcomer=True)
    assert hold.refused and log.lines[0][0] == "fatal" and "cannot start" in log.lines[0][1]
    assert np.all(driver.agent.buffer.observations == 0)
