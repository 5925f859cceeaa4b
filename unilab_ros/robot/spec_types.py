"""The robot spec's dataclasses (``spec`` reads and writes them; see its docstring for the
conventions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unilab_ros.loop.action_safety import ActionSafetyConfig

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
