"""The simulators of a trainer's robots: paused and resumed around each update, one after
the other, and resumed once at start (a trainer killed during an update left them
paused: they would wait out their max_pause before stepping again). A configured service
not found ``SERVICE_CHECK_S`` after start is an error line naming it (once, counted): the
robot would run on through every update, so the trainer must not go on silently (a
trainer in a namespace resolves a relative name under it, an absolute one not)."""

from __future__ import annotations

import time
from collections.abc import Callable

from rclpy.clock import Clock, ClockType
from rclpy.node import Node

from unilab_ros.loop.decisions import Decision
from unilab_ros.loop.training_loop import Phase, TrainingLoop
from unilab_ros.ros.sim_pause import SimPause

START_RESUME_WINDOW = 10.0
"""Seconds after start during which the trainer resumes each simulator it can, as soon as
its resume service is discovered."""
SERVICE_CHECK_S = 5.0
"""Seconds after start by which every configured simulator service should be discovered."""


class Simulators:
    """The robots' ``SimPause`` clients; an unanswered pause goes to the loop, whose
    decisions go to ``carry_out``."""

    def __init__(
        self, node: Node, sims: list[SimPause], loop: TrainingLoop,
        carry_out: Callable[[list[Decision]], None],
    ) -> None:
        self.sims = sims
        self._node = node
        self._loop = loop
        self._carry_out = carry_out
        self.paused: list[int] = []
        """The robots whose simulators were paused for the update in progress."""
        self._unresumed = [r for r, sim in enumerate(sims) if sim.can_resume]
        self._resume_deadline = time.monotonic() + START_RESUME_WINDOW
        self._start_timer = node.create_timer(
            0.1, self._resume_at_start, clock=Clock(clock_type=ClockType.STEADY_TIME),
            autostart=bool(self._unresumed))
        self.missing_services: list[str] = []
        """The configured services not found at the start check."""
        self._check_timer = node.create_timer(
            SERVICE_CHECK_S, self._check_services,
            clock=Clock(clock_type=ClockType.STEADY_TIME),
            autostart=any(sim.configured for sim in sims))

    @property
    def calls_failed(self) -> int:
        return sum(sim.calls_failed for sim in self.sims)

    def pause(self, then: Callable[[], None]) -> None:
        """Pause the simulators the loop says, then ``then``; ``resume`` resumes them."""
        self.paused = self._loop.simulators_to_pause()
        self._call(self.paused, "pause", then)

    def running(self) -> list[int]:
        """The robots whose simulator did not answer a pause: the ones an update's safe
        action is for. A paused one takes no step until resumed, and DDS does not order the
        action topic against the resume service, so a safe action arriving after the resume
        would step a per-action simulator (the Gymnasium bridge) with a step nobody learns
        from; one that holds its last command holds the policy's until the next tick, as
        between any two."""
        return [r for r, sim in enumerate(self.sims) if not sim.paused]

    def resume(self, then: Callable[[], None]) -> None:
        self._call(self.paused, "resume", then)

    def _call(self, robots: list[int], call: str, then: Callable[[], None]) -> None:
        """Pause (resume) the simulators of ``robots``, one after the other, then ``then``.
        A pause that goes unanswered goes to the loop (a fleet stalls that robot; it is
        still resumed, in case the pause arrived late)."""
        if not robots:
            then()
            return
        r, sim = robots[0], self.sims[robots[0]]

        def next_robot() -> None:
            if call == "pause" and sim.unanswered:
                self._carry_out(self._loop.pause_unanswered(r))
            self._call(robots[1:], call, then)

        getattr(sim, call)(then=next_robot)

    def _check_services(self) -> None:
        """Name each configured service not discovered by now (see the module docstring)."""
        self._check_timer.cancel()
        if not self._node.context.ok():
            return
        for sim in self.sims:
            for name in sim.missing():
                self.missing_services.append(name)
                sim.calls_failed += 1
                self._node.get_logger().error(
                    f"simulator service {name} not found {SERVICE_CHECK_S:g} s after start: "
                    "the robot will run on through every update (its steps during one are "
                    "lost); check pause_service / resume_service: a relative name resolves "
                    f"under this node's namespace '{self._node.get_namespace()}', an "
                    "absolute one (/pause_physics) does not")

    def _resume_at_start(self) -> None:
        """Resume each simulator once its service is discovered (within
        ``START_RESUME_WINDOW``), unless an update already paused it."""
        if not self._node.context.ok():
            return
        updating = self._loop.phase is Phase.UPDATING
        for r in list(self._unresumed):
            sim = self.sims[r]
            if updating or sim.resume_ready:
                self._unresumed.remove(r)
            if not updating and sim.resume_ready:
                sim.resume(then=lambda: None)
        if not self._unresumed or time.monotonic() > self._resume_deadline:
            self._start_timer.cancel()
