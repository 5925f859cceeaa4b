"""What a late step, a silent robot or an unanswered pause mean for the training loop
(ROS-free): the checks its caller runs on timers, kept apart from collecting and updating."""

from __future__ import annotations

from unilab_ros.loop.counters import Counters
from unilab_ros.loop.decisions import Decision, Silent, StepDropped
from unilab_ros.loop.robot_state import Robot
from unilab_ros.loop.states import Phase


class RobotChecks:
    """The ``TrainingLoop``'s deadline, pause and watchdog checks: a mixin of the loop,
    which owns the robots, the phase, the counters, and how a robot stalls (``_stall``),
    is cut (``_cut``) or is acted for (``_act``)."""

    robots: list[Robot]
    fleet: bool
    phase: Phase
    counters: Counters

    def check_step_deadlines(self, now: float) -> list[Decision]:
        """Drop each robot's late step: that robot stalls, the others go on. A robot
        waits for an action at the state it published last: when that came after the
        dropped step's observation, act on it now rather than leave the robot to the
        watchdog (or stalled, with watchdog_safe_action off)."""
        decisions: list[Decision] = []
        for r, robot in enumerate(self.robots):
            if not robot.source.expired(now):
                continue
            self._stall(robot)
            decisions.append(StepDropped(r))
            latest = robot.latest_obs
            if latest is not None and latest[1] > robot.acted_stamp:
                decisions.append(self._act(r, *latest, now))
        return decisions

    def pause_unanswered(self, r: int) -> list[Decision]:
        """Robot ``r``'s simulator did not answer its pause before an update. A fleet's
        robot stalls now: its free lanes fill from the others before its step can time
        out, and a dead process's service can look ready for a while, so otherwise every
        update would wait on it again. A single robot has no others to go on with."""
        robot = self.robots[r]
        if not self.fleet or robot.stalled:
            return []
        self._stall(robot)
        return [StepDropped(r, pause_unanswered=True)]

    def check_watchdogs(self, steady: float) -> list[Decision]:
        """The robots whose observations stopped while collecting; a silence's first
        check drops that robot's outstanding step and cuts its segment."""
        if self.phase not in (Phase.COLLECTING, Phase.EPISODE_END):
            return []
        decisions: list[Decision] = []
        for r, robot in enumerate(self.robots):
            silence = robot.watchdog.check(steady)
            if silence is None:
                continue
            if silence.publish_safe:
                robot.guard.hold()
            if silence.first:
                self.counters.add("watchdog_trips")
                if robot.source.drop():
                    self._cut(robot)
            decisions.append(Silent(r, silence.first, silence.publish_safe))
        return decisions
