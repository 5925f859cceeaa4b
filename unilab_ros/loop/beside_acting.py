"""Learning beside acting (``learn_while_acting``), ROS-free: the training loop's steps
when the learner never stops the robot. The off-policy learner's thread learns on its own
and each ``num_steps`` only closes an iteration; PPO's update of rollout k runs on a
thread while rollout k+1 is collected (``rl.background_update``)."""

from __future__ import annotations

from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.counters import Counters
from unilab_ros.loop.decisions import Decision, Finished, IterationDone
from unilab_ros.loop.robot_state import Robot
from unilab_ros.loop.states import Phase
from unilab_ros.loop.steps import Transition
from unilab_ros.rl.agent import StepOfEnvs
from unilab_ros.rl.algorithm import Agent, Collector, model_lock
from unilab_ros.rl.background_learner import BackgroundLearner
from unilab_ros.rl.background_update import BackgroundUpdate
from unilab_ros.rl.checkpoint import all_finite
from unilab_ros.rl.learner_process import LearnerProcess


class BesideActing:
    """A mixin of the ``TrainingLoop``, which owns the robots, the agent, its collector
    (``lanes``), the phase and the counters, and how a robot is acted for (``_act``), an
    update is run (``update``) and an iteration's saves are decided (``after_update``)."""

    cfg: LoopConfig
    agent: Agent
    lanes: Collector
    robots: list[Robot]
    phase: Phase
    counters: Counters
    learner: BackgroundLearner | BackgroundUpdate | LearnerProcess | None
    updates_run: int
    _good_parameters: dict
    _stale_steps: int
    _handed_over_lag: float

    learning: bool

    @property
    def _update_running(self) -> bool:
        return isinstance(self.learner, BackgroundUpdate) and self.learner.running

    def _iteration_done(self, r: int, step: Transition, now: float) -> list[Decision]:
        """Learning while acting: act (unless this iteration is the last), then close the
        iteration. The action goes out first: the iteration's report and saves would
        otherwise delay one command in every ``num_steps`` (2% of a 50 Hz loop's at 50,
        so the control period's p99 jitter) by their milliseconds."""
        last = bool(self.cfg.max_iterations
                    and self.agent.iteration + 1 >= self.cfg.max_iterations)
        acted = [] if last else [self._act(r, step.next_obs, step.next_obs_stamp, now)]
        decisions: list[Decision] = [*acted, IterationDone(self.update()),
                                     *self.after_update()]
        if last:
            self.phase = Phase.FINISHED
            decisions.append(Finished())
        return decisions

    def _complete_beside_update(self, r: int, step: Transition, now: float,
                                learner: BackgroundUpdate) -> list[Decision]:
        """PPO beside acting: store the step unless the next rollout is full already (the
        update runs behind the robot: counted), take a finished update's result, hand a
        full rollout over when none runs, then act; the robot never waits."""
        robot = self.robots[r]
        if self.learning and robot.acted_by_sampling and robot.policy_outputs is not None:
            if self.lanes.full:
                self.counters.add("steps_behind_update", len(robot.envs))
            else:
                mean, std = robot.policy_outputs
                self.lanes.record(robot.envs, StepOfEnvs(
                    step.obs, step.action, mean, std, step.reward, step.done), step.next_obs)
                if learner.running:
                    self._stale_steps += len(robot.envs)
        decisions: list[Decision] = []
        if learner.done:
            decisions += [IterationDone(self._update_landed(learner)), *self.after_update()]
            if self.cfg.max_iterations and self.agent.iteration >= self.cfg.max_iterations:
                self.phase = Phase.FINISHED
                return [*decisions, Finished()]
        elif self.lanes.full and not learner.running:
            # Not on the step an update lands: its saves are carried out first.
            self._handed_over_lag = self._stale_steps / self.lanes.filled.sum()
            self._stale_steps = 0
            learner.start(self.lanes.bootstrap_obs)
            self.lanes.clear()
        return [*decisions, self._act(r, step.next_obs, step.next_obs_stamp, now)]

    def _update_landed(self, learner: BackgroundUpdate) -> dict[str, float]:
        """The update beside acting finished: its metrics; a non-finite result is rolled
        back to the last good parameters."""
        metrics = learner.take()
        with model_lock(self.agent):
            parameters = self.agent.model.parameters()
            if all_finite(parameters):
                self._good_parameters = parameters
            else:
                self.agent.model.update(self._good_parameters)
        metrics["policy_lag"] = self._handed_over_lag
        self.updates_run += 1
        return metrics

