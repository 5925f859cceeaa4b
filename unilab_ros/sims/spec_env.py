"""A robot spec's task on a MuJoCo robot, in process, as a Gymnasium env (ROS-free).

The same ``RobotSteps`` the trainer runs on live topics builds the observation, the reward
and the termination here, from the same ``MujocoWorld`` the MuJoCo robot node steps, with
the spec's action mapping (``JointCommands``): what a policy learns here deploys through
ROS with the same spec. What differs from the free-running robot: every control step
waits for the policy (no latency, no stale data, no dropped steps) and each sensor is read
at the control tick rather than at its own rate. That makes it the fast path for choosing
a robot's training settings over several seeds, which then hold through ROS or not: the
robot benches measure that.

    env = gym.make("unilab_ros.sims.spec_env:UnilabRobot-v0", robot="cartpole")
    env = gym.make("unilab_ros.sims.spec_env:UnilabRobot-cartpole-v0")  # the same

``robot`` names a shipped pair (``config/robot_specs/<robot>.yaml`` and
``config/robots/<robot>.yaml``; each has an id of its own, for a params file's
``env_id``); ``spec`` and ``robot_params`` give files instead. Actions are in policy units
(the spec's ``scale`` maps them to joint commands; the spec's action guard is the ROS
loop's and does not act here); an episode ends with the spec's terminations: a failure is
``terminated``, a time-out ``truncated``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml

from unilab_ros.config.paths import config_file, robot_spec_file
from unilab_ros.config.training_setup import TrainingSetup, load_setup
from unilab_ros.loop.steps import Transition
from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.robot import samples
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.spec import RobotSpec, load_spec
from unilab_ros.robot.steps import RobotSteps
from unilab_ros.sims.mujoco_config import ROBOT_SECTIONS, RobotConfig, WorldConfig
from unilab_ros.sims.mujoco_world import MujocoWorld, model_path

ENV_ID = "UnilabRobot-v0"
ROBOT_NODE_KEY = "/**/mujoco_robot"


def robot_config(path: str | Path) -> tuple[WorldConfig, RobotConfig]:
    """The world and robot settings of a MuJoCo robot node's params file."""
    document = yaml.safe_load(Path(path).read_text()) or {}
    params = dict((document.get(ROBOT_NODE_KEY) or {}).get("ros__parameters") or {})
    sections = {name: params.pop(name, {}) or {} for name in ROBOT_SECTIONS}
    known = {f.name for f in dataclasses.fields(WorldConfig)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{path}: unknown parameters {unknown}")
    world = WorldConfig(**params)
    world.validate()
    robot = RobotConfig(**{
        name: type(getattr(RobotConfig(), name))(**values) for name, values in sections.items()})
    robot.check(world.update_rate)
    return world, robot


class RobotSpecEnv(gym.Env):
    """One robot of ``MujocoWorld`` driven through a spec's ``RobotSteps``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, robot: str = "", spec: str = "", robot_params: str = "") -> None:
        self.robot_spec: RobotSpec = load_spec(robot_spec_file(spec or robot))
        world_cfg, robot_cfg = robot_config(robot_params or config_file(f"robots/{robot}.yaml"))
        ticks = world_cfg.update_rate / self.robot_spec.control_rate
        if abs(ticks - round(ticks)) > 1e-9 or round(ticks) < 1:
            raise ValueError(f"the robot's update_rate {world_cfg.update_rate:g} Hz is not a "
                             f"whole multiple of the spec's control_rate "
                             f"{self.robot_spec.control_rate:g} Hz")
        self._ticks = round(ticks)
        self._world_cfg, self._robot_cfg = world_cfg, robot_cfg
        self._world = self._make_world(world_cfg.seed)
        self._readers = {source.name: self._reader(source.type, source.topic)
                         for source in self.robot_spec.sources}
        self.commands = JointCommands(self.robot_spec)
        actions = self.commands.action_config()
        self.action_space = gym.spaces.Box(np.array(actions.action_low, np.float32),
                                           np.array(actions.action_high, np.float32))
        self._steps = RobotSteps(self.robot_spec, np.random.default_rng(0))
        dim = self._steps.observation.dim
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        self._obs: np.ndarray | None = None

    def _make_world(self, seed: int) -> MujocoWorld:
        return MujocoWorld(model_path(self._world_cfg.model), 1, self._robot_cfg,
                           self._world_cfg.update_rate, seed)

    def _reader(self, kind: str, topic: str) -> Callable[[float], samples.Sample]:
        # Each reader asks the world of the moment: a reseeding reset makes a new one.
        world = self._world
        if kind == "joint_state":
            return lambda t: _stamped(self._world.joint_state(0), t)
        if kind == "imu" and world.has_imu:
            return lambda t: _stamped(self._world.imu(0), t)
        if kind == "odometry" and world.has_odometry:
            return lambda t: _stamped(self._world.odometry(0), t)
        site = topic.removesuffix("/pose")
        if kind == "pose_stamped" and site in world.site_ids:
            return lambda t: _stamped(self._world.site_pose(0, site), t)
        raise ValueError(f"source type {kind!r} on {topic!r} has no counterpart in the "
                         f"MuJoCo robot {self._world_cfg.model!r} in process")

    def _observe(self) -> None:
        now = self._world.time
        for name, read in self._readers.items():
            self._steps.on_sample(name, read(now), now)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._world = self._make_world(seed)
            self._steps = RobotSteps(self.robot_spec, np.random.default_rng(seed))
        else:
            self._world.reset(0)
        now = self._world.time
        self._steps.start_episode(now)
        self._observe()
        start = self._steps.tick(now)
        if start is None:
            raise RuntimeError(f"no observation after a reset ({self._steps.waiting})")
        self._obs = start.obs
        return start.obs[0].astype(np.float32), {}

    def step(self, action: np.ndarray):
        if self._obs is None:
            raise RuntimeError("step before reset")
        action = np.asarray(action, np.float64).reshape(-1)
        now = self._world.time
        self._steps.action_sent(self._obs, action, 0, now)
        self._world.set_command(0, self.commands(action))
        for _ in range(self._ticks):
            self._world.step()
        now = self._world.time
        self._observe()
        step = self._steps.tick(now)
        if not isinstance(step, Transition):
            raise RuntimeError(f"the step did not complete ({self._steps.stale})")
        code = int(step.done[0])
        self._obs = step.next_obs
        info = {"fired": list(self._steps.fired),
                "reward_terms": dict(zip([term.kind for term in self.robot_spec.rewards],
                                         self._steps.reward_shares, strict=True))}
        if code != DoneCode.RUNNING:
            # What the deploy node reports of an episode's end (the distance left, say);
            # only then, to keep it off the per-step path.
            info["term_values"] = self._steps.term_values()
        return (step.next_obs[0].astype(np.float32), float(step.reward[0]),
                code == DoneCode.TERMINATED, code == DoneCode.TRUNCATED, info)


def _stamped(sample: samples.Sample, stamp: float) -> samples.Sample:
    """The world's sample as the robot's node would publish it at ``stamp``."""
    return dataclasses.replace(sample, stamp=stamp)


def spec_training_setup(params_file: str | Path, robot: str, seed: int) -> TrainingSetup:
    """An in-process run of a trainer params file that names a robot spec (a
    ``config/robot_train`` file) on the shipped robot ``robot``: what the trainer node
    takes from the spec there (the sizes, one env, the action mapping), taken here too."""
    setup = load_setup(params_file)
    agent = setup.agent
    document = yaml.safe_load(Path(params_file).read_text())
    name = next(iter(document.values()))["ros__parameters"].get("robot_spec", robot)
    spec = load_spec(robot_spec_file(name))
    return dataclasses.replace(
        setup, env_id=f"unilab_ros.sims.spec_env:UnilabRobot-{robot}-v0",
        agent=dataclasses.replace(agent, obs_dim=ObservationBuilder(spec).dim,
                                  action_dim=len(spec.actions.joints), num_envs=1, seed=seed),
        actions=JointCommands(spec).action_config())


def shipped_robots() -> list[str]:
    """The robots shipped with both a spec and a MuJoCo robot params file."""
    share = config_file("robots/cartpole.yaml").parents[1]
    return sorted(p.stem for p in (share / "robot_specs").glob("*.yaml")
                  if (share / "robots" / p.name).is_file())


gym.register(ENV_ID, entry_point=RobotSpecEnv)
for _robot in shipped_robots():
    gym.register(f"UnilabRobot-{_robot}-v0", entry_point=RobotSpecEnv, kwargs={"robot": _robot})
