"""A step's reward and done code from the spec's reward and termination terms.

reward = sum(weight x value x dt), dt = 1 / control_rate. Done: 1 when a failure
termination fires (it wins over a time-out firing on the same step), 2 when only time-outs
fire, else 0 (``rl.done_codes.DoneCode``).
"""

from __future__ import annotations

from dataclasses import replace

from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.robot.reward_terms import REWARDS
from unilab_ros.robot.spec import RobotSpec
from unilab_ros.robot.termination_terms import TERMINATIONS
from unilab_ros.robot.terms import TermContext


class Task:
    """The spec's reward and terminations, evaluated on one tick's context."""

    def __init__(self, spec: RobotSpec) -> None:
        self.spec = spec

    def done(self, ctx: TermContext) -> tuple[DoneCode, list[str]]:
        """The done code and the kinds of the terminations that fired."""
        fired = [term for term in self.spec.terminations
                 if TERMINATIONS[term.kind].fn(ctx, term.source, term.params)]
        if any(not term.time_out for term in fired):
            code = DoneCode.TERMINATED
        else:
            code = DoneCode.TRUNCATED if fired else DoneCode.RUNNING
        return code, [term.kind for term in fired]

    def reward(self, ctx: TermContext, code: DoneCode) -> tuple[float, list[float]]:
        """The step's reward and each term's share of it (weight x value x dt), in spec
        order."""
        ctx = replace(ctx, failed=code == DoneCode.TERMINATED)
        shares = [term.weight * float(REWARDS[term.kind].fn(ctx, term.source, term.params))
                  * self.spec.dt for term in self.spec.rewards]
        return sum(shares), shares
