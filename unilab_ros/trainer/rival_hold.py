"""Acting and learning stop together while a rival commands the robot (ROS-free).

A rival (another node sending commands on the trainer's action topics, see
``graph_checks``) steps the robot with its own actions: a step the trainer stored then
pairs the trainer's action with the state and reward the rival's action led to, and its
episodes are the rival's. So while one is there the loop is held as by an e-stop: the
rollout's segments are cut, nothing is learned from or logged as an episode, and no
update can begin from those steps; the commands the held loop decides (the safe action)
are withheld too, since the rival commands the robot. When the rival is gone, collection
starts anew, the policy blending in from the safe action, as after an e-stop.

The operator's e-stop and a rival's hold combine: the loop stays held while either is on.
"""

from __future__ import annotations

from typing import Any, Protocol

from unilab_ros.loop.decisions import Decision
from unilab_ros.loop.training_loop import TrainingLoop


class Logger(Protocol):
    """A node's logger (or Python's): the levels the hold logs at."""

    def fatal(self, message: str) -> Any: ...
    def error(self, message: str) -> Any: ...
    def info(self, message: str) -> Any: ...


class RivalHold:
    """Holds ``loop`` while a rival or the operator's e-stop asks, and counts the holds
    and the steps taken meanwhile (``status``)."""

    def __init__(self, loop: TrainingLoop, logger: Logger) -> None:
        self._loop = loop
        self._logger = logger
        self.rivals: list[str] = []
        """The live rivals, one line each (empty: none)."""
        self.refused = False
        """A rival was there when this trainer started: it is the newcomer, and must not run."""
        self.operator_estop = False
        self.holds = 0
        """How often a rival stopped acting and learning."""
        self._steps_before = 0
        self._steps_not_learned = 0

    def check(self, lines: list[str], newcomer: bool) -> list[Decision]:
        """The rivals found now (``RivalWatch.check``), said once each: a ``newcomer``
        (just started) refuses to run (``refused``), the trainer that was there first
        holds until they are gone. Returns the decisions of a hold that begins or ends."""
        if lines and newcomer:
            self._logger.fatal(f"cannot start: {'; '.join(lines)} (stop it, or run this "
                               "trainer in a namespace of its own)")
            self.refused = True
        elif lines and lines != self.rivals:
            self._logger.error(f"{'; '.join(lines)}: acting and learning stopped until it "
                               "is gone (its steps are not the policy's; two trainers on one "
                               "robot corrupt each other's)")
        elif self.rivals and not lines:
            self._logger.info(f"the rival is gone: acting and learning again, on new "
                              f"segments ({self.steps_not_learned} steps not learned so far)")
        return self.set_rivals(lines)

    def set_rivals(self, lines: list[str]) -> list[Decision]:
        """The live rivals (none: empty); the decisions of a hold that begins or ends."""
        if bool(lines) == bool(self.rivals):
            self.rivals = lines
            return []
        if lines:
            self.holds += 1
            self._steps_before = self._steps_completed()
        else:
            self._steps_not_learned = self.steps_not_learned
        self.rivals = lines
        return self._apply(counted=False)

    def set_operator_estop(self, engaged: bool) -> list[Decision]:
        """The operator's e-stop (``estop`` topic) engaged or released."""
        self.operator_estop = engaged
        return self._apply(counted=True)

    @property
    def steps_not_learned(self) -> int:
        """Steps completed while a rival commanded the robot, none of them stored."""
        during = self._steps_completed() - self._steps_before if self.rivals else 0
        return self._steps_not_learned + during

    def status(self) -> dict[str, Any]:
        """The ``~/status`` entries."""
        return {"rivals": self.rivals, "rival_holds": self.holds,
                "rival_steps_not_learned": self.steps_not_learned}

    def _apply(self, counted: bool) -> list[Decision]:
        engaged = self.operator_estop or bool(self.rivals)
        engages = engaged and not self._loop.estop
        decisions = self._loop.set_estop(engaged)
        if engages and not counted:
            # The loop counts every engagement as an e-stop; a rival's is counted in
            # ``rival_holds`` instead, so ``estops`` stays the operator's.
            self._loop.counters["estops"] -= 1
        return decisions

    def _steps_completed(self) -> int:
        return self._loop.step_counters["steps_completed"]
