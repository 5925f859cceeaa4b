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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from unilab_ros.loop.action_safety import ActionSafetyConfig
from unilab_ros.robot import spec_checks
from unilab_ros.robot.observation_terms import OBSERVATIONS
from unilab_ros.robot.reward_terms import REWARDS
from unilab_ros.robot.spec_checks import Reader, SpecError, TermChecks
from unilab_ros.robot.spec_types import (
    INTERFACES,
    OUTPUTS,
    RESET_MODES,
    ActionSpec,
    CommandSpec,
    ObservationTermSpec,
    ResetSpec,
    RewardTermSpec,
    RobotSpec,
    SourceSpec,
    TerminationSpec,
)
from unilab_ros.robot.termination_terms import TERMINATIONS

__all__ = ["ActionSpec", "CommandSpec", "ObservationTermSpec", "ResetSpec", "RewardTermSpec",
           "RobotSpec", "SourceSpec", "SpecError", "TerminationSpec", "load_spec",
           "spec_from_dict", "spec_to_dict"]


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
        sample_type = spec_checks.source_type(sources, source, r.at("source"))
        if r.get("ranges", []):
            raise r.fail("ranges", "a command read from a source has no ranges")
        command = CommandSpec(name, source=source, fields=r.fields("fields", sample_type))
    else:
        if r.get("fields", []):
            raise r.fail("fields", "only a command read from a source has fields")
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
    spec_checks.nonzero(scale, r.at("scale"))
    low, high = r.per_joint("low", n), r.per_joint("high", n)
    spec_checks.ordered(low, high, r.path)
    safe = r.per_joint("safe", n, ())
    if safe:
        spec_checks.within(safe, low, high, r.path + ".safe")
    else:
        # The implied safe command (the default pose, or 0) must be one the limits allow.
        implied = [default_pose[j] for j in joints] if interface == "position" else [0.0]
        spec_checks.within(implied, low, high, r.path + ".safe (unset: the default pose, "
                                               "or 0 for velocity and effort)")
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
