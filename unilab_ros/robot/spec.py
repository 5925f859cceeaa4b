"""The robot spec: sources, control rate, observation, rewards, terminations, actions, reset
and commands, as dataclasses read from YAML or from the JSON-ready dict a bundle carries.

Every error is a ``SpecError`` naming the field path (``observation[2].joints[1]``) and what
is wrong with it. A term's mapping holds ``kind``, ``source`` (when the kind reads one), the
manager's own fields (``scale``, ``clip``, ``history``; ``weight``; ``time_out``) and the
kind's params, all at one level. Conventions, stated once here and in each module:

- the observation pipeline per term: compute -> clip -> scale -> history; history is
  oldest first; terms are concatenated in spec order (``observation``);
- a step's reward is sum(weight x value x dt), dt = 1 / control_rate (``reward_terms``);
- done codes: 0 running, 1 a failure termination, 2 a time-out (``rl.done_codes``);
- quaternions are (x, y, z, w); joints are matched by name, never by position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from unilab_ros.loop.action_safety import ActionSafetyConfig
from unilab_ros.robot import spec_checks
from unilab_ros.robot.observation_terms import OBSERVATIONS
from unilab_ros.robot.reward_terms import REWARDS
from unilab_ros.robot.spec_checks import Reader, SpecError, TermChecks
from unilab_ros.robot.termination_terms import TERMINATIONS

__all__ = ["ActionSpec", "CommandSpec", "ObservationTermSpec", "ResetSpec", "RewardTermSpec",
           "RobotSpec", "SourceSpec", "SpecError", "TerminationSpec", "load_spec",
           "spec_from_dict", "spec_to_dict"]

INTERFACES = ("position", "velocity", "effort")
OUTPUTS = ("float64_multi_array", "joint_trajectory")
RESET_MODES = ("service", "operator")


@dataclass(frozen=True)
class SourceSpec:
    """One topic the robot publishes."""

    name: str
    """What terms call it."""
    topic: str
    """Relative topic name (a namespace or remap moves it)."""
    type: str
    """joint_state, imu, odometry, twist, twist_stamped, pose_stamped or float_array."""
    max_age: float
    """Seconds: a newer sample must exist at every tick, else the step is cut (header stamp,
    else the arrival time)."""


@dataclass(frozen=True)
class CommandSpec:
    """A command or target the policy is given: sampled per episode, or read from a topic."""

    name: str
    """What terms call it."""
    ranges: tuple[tuple[float, float], ...] = ()
    """Per value, [low, high]: drawn uniformly at the start of each episode."""
    source: str = ""
    """Instead of ``ranges``: a source it is read from at every tick."""
    fields: tuple[str, ...] = ()
    """With ``source``: the sample fields to read (``linear.x``, ``position.z``, ``data.0``)."""

    @property
    def dim(self) -> int:
        return len(self.fields) if self.source else len(self.ranges)


@dataclass(frozen=True, kw_only=True)
class TermSpec:
    """A term: a registered kind, the source it reads and its params."""

    kind: str
    """A name in the manager's registry."""
    source: str = ""
    """The source it reads, for kinds that read one."""
    params: dict[str, Any] = field(default_factory=dict)
    """The kind's params (written at the term's own level in YAML)."""


@dataclass(frozen=True, kw_only=True)
class ObservationTermSpec(TermSpec):
    """An observation term: compute -> clip -> scale -> history."""

    clip: tuple[float, float] | None = None
    """[low, high] applied to the computed values (before scale); None: no clip."""
    scale: tuple[float, ...] = (1.0,)
    """Multiplies the clipped values: one number, or one per value of a step."""
    history: int = 1
    """Steps kept (oldest first); an episode starts with its first value repeated."""


@dataclass(frozen=True, kw_only=True)
class RewardTermSpec(TermSpec):
    """A reward term: contributes weight x value x dt."""

    weight: float
    """Per second (the value x weight is multiplied by dt = 1 / control_rate)."""


@dataclass(frozen=True, kw_only=True)
class TerminationSpec(TermSpec):
    """A termination: when it fires the episode ends."""

    time_out: bool
    """True: a time-out (done 2, bootstrap); False: a failure (done 1). Defaults by kind."""


@dataclass(frozen=True)
class ActionSpec:
    """How policy outputs become joint commands."""

    joints: tuple[str, ...]
    """The commanded joints in the controller's order (its ``joints`` parameter)."""
    interface: str
    """position (default_pose + scale x action), velocity or effort (scale x action)."""
    topic: str
    """The controller's command topic, e.g. ``effort_controller/commands``."""
    output: str = "float64_multi_array"
    """float64_multi_array (forward_command_controller) or joint_trajectory (with names)."""
    scale: tuple[float, ...] = (1.0,)
    """Once or per joint."""
    low: tuple[float, ...] = (-1.0,)
    """Lower command limit in joint units, once or per joint."""
    high: tuple[float, ...] = (1.0,)
    """Upper command limit in joint units, once or per joint."""
    safe: tuple[float, ...] = ()
    """The command sent when the policy must not act, once or per joint; empty: the
    default pose for position, 0 for velocity and effort."""
    guard: ActionSafetyConfig = field(default_factory=ActionSafetyConfig)
    """Rate limit, smoothing and blend-in on the way to the robot (``loop.action_safety``)."""


@dataclass(frozen=True)
class ResetSpec:
    """What starts a new episode after a done."""

    mode: str = "service"
    """service: call ``service`` (std_srvs/Empty); operator: wait for ``~/ready`` (Trigger)."""
    service: str = "reset"
    """The reset service (relative name), e.g. the MuJoCo node's ``reset``, Gazebo's
    ``/reset_world``."""


@dataclass(frozen=True)
class RobotSpec:
    """One robot's task through standard messages."""

    name: str
    """What it is called in logs and the bundle."""
    control_rate: float
    """Hz: ticks on the node clock (sim time under use_sim_time)."""
    sources: tuple[SourceSpec, ...]
    """Every topic read."""
    observation: tuple[ObservationTermSpec, ...]
    """In the order their values are concatenated."""
    actions: ActionSpec
    """The action mapping."""
    default_pose: dict[str, float] = field(default_factory=dict)
    """Joint name -> default position (joint_pos_rel, position actions)."""
    rewards: tuple[RewardTermSpec, ...] = ()
    """Summed, each weight x value x dt."""
    terminations: tuple[TerminationSpec, ...] = ()
    """Any firing ends the episode; a failure among them wins over time-outs."""
    commands: tuple[CommandSpec, ...] = ()
    """Commands and targets."""
    reset: ResetSpec = field(default_factory=ResetSpec)
    """How an episode restarts."""

    @property
    def dt(self) -> float:
        """The control period, seconds."""
        return 1.0 / self.control_rate

    def source(self, name: str) -> SourceSpec:
        return next(s for s in self.sources if s.name == name)


def load_spec(path: str | Path) -> RobotSpec:
    """The spec in a YAML file, validated."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SpecError(f"{path}: {error}") from error
    return spec_from_dict(data)


def spec_from_dict(data: Any) -> RobotSpec:
    """The spec in a YAML- or JSON-shaped mapping, validated."""
    r = Reader(data, "")
    sources = tuple(_source(s) for s in r.items("sources"))
    spec_checks.unique([s.name for s in sources], "sources")
    default_pose = r.mapping_of_floats("default_pose")
    commands = tuple(_command(c, sources) for c in r.items("commands", required=False))
    spec_checks.unique([c.name for c in commands], "commands")
    actions = _actions(r.child("actions"), default_pose)
    checks = TermChecks(sources, {c.name: c.dim for c in commands}, default_pose,
                        len(actions.joints))
    spec = RobotSpec(
        name=r.text("name"),
        control_rate=r.positive("control_rate"),
        sources=sources,
        observation=tuple(_observation(t, checks) for t in r.items("observation")),
        actions=actions,
        default_pose=default_pose,
        rewards=tuple(_reward(t, checks) for t in r.items("rewards", required=False)),
        terminations=tuple(_termination(t, checks)
                           for t in r.items("terminations", required=False)),
        commands=commands,
        reset=_reset(r.child("reset", required=False)),
    )
    r.done()
    return spec


def spec_to_dict(spec: RobotSpec) -> dict[str, Any]:
    """The spec as JSON-ready data (lists, not tuples; params at their term's level), which
    ``spec_from_dict`` reads back to an equal spec."""
    data = _plain(asdict(spec))
    for manager in ("observation", "rewards", "terminations"):
        data[manager] = [_flatten(term) for term in data[manager]]
    return data


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _flatten(term: dict[str, Any]) -> dict[str, Any]:
    params = term.pop("params")
    if not term["source"]:
        del term["source"]
    return {**term, **params}


def _source(r: Reader) -> SourceSpec:
    source = SourceSpec(r.text("name"), r.text("topic"), r.choice("type", spec_checks.TYPES),
                        r.positive("max_age"))
    r.done()
    return source


def _command(r: Reader, sources: tuple[SourceSpec, ...]) -> CommandSpec:
    name = r.text("name")
    source = r.text("source", "")
    if source:
        sample_type = spec_checks.source_type(sources, source, r.path + ".source")
        fields_ = r.fields("fields", sample_type)
        if "ranges" in r.data:
            raise SpecError(f"{r.path}.ranges: a command read from a source has no ranges")
        command = CommandSpec(name, source=source, fields=fields_)
    else:
        command = CommandSpec(name, ranges=r.ranges("ranges"))
    r.done()
    return command


def _actions(r: Reader, default_pose: Mapping[str, float]) -> ActionSpec:
    joints = r.names("joints")
    n = len(joints)
    interface = r.choice("interface", INTERFACES)
    if interface == "position":
        spec_checks.posed(joints, default_pose, r.path + ".joints")
    scale = r.per_joint("scale", n, (1.0,))
    low, high = r.per_joint("low", n), r.per_joint("high", n)
    spec_checks.ordered(low, high, r.path)
    safe = r.per_joint("safe", n, ())
    if safe:
        spec_checks.within(safe, low, high, r.path + ".safe")
    spec = ActionSpec(joints, interface, r.text("topic"), r.choice("output", OUTPUTS,
                      OUTPUTS[0]), scale, low, high, safe,
                      _guard(r.child("guard", required=False), n))
    r.done()
    return spec


def _guard(r: Reader, n: int) -> ActionSafetyConfig:
    guard = ActionSafetyConfig(list(r.per_joint("max_action_change", n, (0.0,))),
                               r.number("action_smoothing", 0.0),
                               r.integer("blend_in_steps", 0, minimum=0))
    try:
        guard.validate()
    except ValueError as error:
        raise SpecError(f"{r.path}: {error}") from error
    r.done()
    return guard


def _observation(r: Reader, checks: TermChecks) -> ObservationTermSpec:
    name, kind, source, params = checks.read(r, OBSERVATIONS)
    term = ObservationTermSpec(kind=name, source=source, params=params, clip=r.pair("clip"),
                               scale=r.per_joint("scale", checks.dim(kind, params), (1.0,)),
                               history=r.integer("history", 1))
    r.done(list(kind.params))
    return term


def _reward(r: Reader, checks: TermChecks) -> RewardTermSpec:
    name, kind, source, params = checks.read(r, REWARDS)
    term = RewardTermSpec(kind=name, source=source, params=params, weight=r.number("weight"))
    r.done(list(kind.params))
    return term


def _termination(r: Reader, checks: TermChecks) -> TerminationSpec:
    name, kind, source, params = checks.read(r, TERMINATIONS)
    term = TerminationSpec(kind=name, source=source, params=params,
                           time_out=r.flag("time_out", kind.time_out))
    r.done(list(kind.params))
    return term


def _reset(r: Reader) -> ResetSpec:
    mode = r.choice("mode", RESET_MODES, "service")
    reset = ResetSpec(mode, r.text("service", "reset"))
    r.done()
    return reset
