"""Reading and checking the spec's mappings, each error naming its field path (``spec``'s
helpers: the spec module keeps the dataclasses, this one the checks)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from unilab_ros.robot.extract import check_field
from unilab_ros.robot.samples import SAMPLE_TYPES
from unilab_ros.robot.terms import POSE_TYPES, Sizes, TermKind

TYPES = tuple(SAMPLE_TYPES)
_TARGETS = {"target_position": "command", "site_distance": "target", "target_reached": "target"}
"""Kinds whose param names a target position (a command of 3 values)."""
_MISSING = object()


class SpecError(ValueError):
    """The spec is wrong; the message starts with the field path."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class Reader:
    """One mapping of the spec at ``path``; ``done()`` refuses the keys nobody read."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise SpecError(f"{path or 'the spec'}: must be a mapping, got {type(data).__name__}")
        self.data, self.path, self._read = data, path, set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = _MISSING) -> Any:
        self._read.add(key)
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise SpecError(f"{self.at(key)}: missing")
        return default

    def fail(self, key: str, what: str) -> SpecError:
        return SpecError(f"{self.at(key)}: {what}")

    def done(self, known: Sequence[str] = ()) -> None:
        unknown = sorted(set(self.data) - self._read)
        if unknown:
            allowed = sorted(self._read | set(known))
            raise self.fail(unknown[0], f"unknown field (known here: {allowed})")

    def text(self, key: str, default: Any = _MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str) or (not value and default is _MISSING):
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        return value

    def number(self, key: str, default: Any = _MISSING) -> float:
        value = self.get(key, default)
        if not _is_number(value):
            raise self.fail(key, f"must be a finite number, got {value!r}")
        return float(value)

    def positive(self, key: str, default: Any = _MISSING) -> float:
        value = self.number(key, default)
        if value <= 0.0:
            raise self.fail(key, f"must be > 0, got {value}")
        return value

    def integer(self, key: str, default: Any = _MISSING, minimum: int = 1) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"must be a whole number >= {minimum}, got {value!r}")
        return value

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def choice(self, key: str, options: Sequence[str], default: Any = _MISSING) -> str:
        value = self.get(key, default)
        if value not in options:
            raise self.fail(key, f"{value!r} is not one of {list(options)}")
        return value

    def _list(self, key: str, default: Any) -> list:
        value = self.get(key, default)
        if not isinstance(value, list | tuple) or not value:
            raise self.fail(key, f"must be a non-empty list, got {value!r}")
        return list(value)

    def items(self, key: str, required: bool = True) -> list[Reader]:
        """The mappings of a list: required ones must have at least one."""
        values = self.get(key, _MISSING if required else [])
        if not isinstance(values, list | tuple) or (required and not values):
            raise self.fail(key, f"must be a {'non-empty ' if required else ''}list, "
                                 f"got {values!r}")
        return [Reader(item, f"{self.at(key)}[{i}]") for i, item in enumerate(values)]

    def child(self, key: str, required: bool = True) -> Reader:
        return Reader(self.get(key, _MISSING if required else {}), self.at(key))

    def names(self, key: str) -> tuple[str, ...]:
        values = self._list(key, _MISSING)
        for i, name in enumerate(values):
            if not isinstance(name, str) or not name:
                raise SpecError(f"{self.at(key)}[{i}]: must be a non-empty string, got {name!r}")
        unique(values, self.at(key))
        return tuple(values)

    def indices(self, key: str) -> tuple[int, ...]:
        values = self._list(key, _MISSING)
        for i, index in enumerate(values):
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise SpecError(f"{self.at(key)}[{i}]: must be an index >= 0, got {index!r}")
        return tuple(values)

    def fields(self, key: str, sample_type: type) -> tuple[str, ...]:
        values = self.names(key)
        for i, name in enumerate(values):
            if why := check_field(sample_type, name):
                raise SpecError(f"{self.at(key)}[{i}]: {why}")
        return values

    def per_joint(self, key: str, n: int, default: Any = _MISSING) -> tuple[float, ...]:
        """A number or a list of 1 or ``n`` numbers; absent (or an empty list where the
        default is empty): ``default``."""
        value = self.get(key, default)
        if value is default or (default == () and isinstance(value, list | tuple)
                                and not value):
            return default
        values = list(value) if isinstance(value, list | tuple) else [value]
        self.per_joint_values(values, n, self.at(key))
        return tuple(float(v) for v in values)

    @staticmethod
    def per_joint_values(values: Sequence[Any], n: int, path: str) -> None:
        if len(values) not in (1, n):
            needs = "1 value" if n == 1 else f"1 or {n} values"
            raise SpecError(f"{path}: needs {needs}, got {len(values)}")
        for i, value in enumerate(values):
            if not _is_number(value):
                raise SpecError(f"{path}[{i}]: must be a finite number, got {value!r}")

    def ranges(self, key: str) -> tuple[tuple[float, float], ...]:
        return tuple(_pair(pair, f"{self.at(key)}[{i}]")
                     for i, pair in enumerate(self._list(key, _MISSING)))

    def pair(self, key: str) -> tuple[float, float] | None:
        """[low, high], or None when absent or null."""
        value = self.get(key, None)
        return None if value is None else _pair(value, self.at(key))

    def mapping_of_floats(self, key: str) -> dict[str, float]:
        mapping = self.child(key, required=False)
        return {name: mapping.number(name) for name in mapping.data}


def _pair(value: Any, path: str) -> tuple[float, float]:
    if (not isinstance(value, list | tuple) or len(value) != 2
            or not all(_is_number(v) for v in value)):
        raise SpecError(f"{path}: must be [low, high], got {value!r}")
    if value[0] > value[1]:
        raise SpecError(f"{path}: low {value[0]} exceeds high {value[1]}")
    return float(value[0]), float(value[1])


def unique(names: Sequence[Any], path: str) -> None:
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise SpecError(f"{path}[{i}]: {name!r} appears twice")
        seen.add(name)


def posed(joints: Sequence[str], default_pose: Mapping[str, float], path: str) -> None:
    for i, joint in enumerate(joints):
        if joint not in default_pose:
            raise SpecError(f"{path}[{i}]: {joint!r} has no default_pose entry")


def ordered(low: Sequence[float], high: Sequence[float], path: str) -> None:
    """Each low at most its high (either may be one value for every joint)."""
    if np.any(np.asarray(low) > np.asarray(high)):
        raise SpecError(f"{path}.low: exceeds high ({list(low)} > {list(high)})")


def nonzero(values: Sequence[float], path: str) -> None:
    """No value is 0 (an action scale of 0 leaves its joint at the offset whatever the
    policy does, and a command-unit rate limit has no policy-unit equivalent)."""
    for i, value in enumerate(values):
        if value == 0.0:
            raise SpecError(f"{path}[{i}]: must not be 0 (the policy could not move the "
                            "joint)")


def within(values: Sequence[float], low: Sequence[float], high: Sequence[float],
           path: str) -> None:
    n = max(len(values), len(low), len(high))
    for i in range(n):
        value, lo, hi = (seq[i if len(seq) > 1 else 0] for seq in (values, low, high))
        if not lo <= value <= hi:
            raise SpecError(f"{path}: {value} lies outside the limits [{lo}, {hi}]")


def source_type(sources: Sequence[Any], name: str, path: str,
                allowed: Sequence[str] = TYPES) -> type:
    """The sample type of source ``name``, which must exist and be of an ``allowed`` type."""
    source = next((s for s in sources if s.name == name), None)
    if source is None:
        raise SpecError(f"{path}: no source named {name!r} (sources: "
                        f"{[s.name for s in sources]})")
    if source.type not in allowed:
        raise SpecError(f"{path}: source {name!r} is a {source.type}; this needs one of "
                        f"{list(allowed)}")
    return SAMPLE_TYPES[source.type]


class TermChecks:
    """Reads a term's kind, source and params against the spec's sources and commands."""

    def __init__(self, sources: Sequence[Any], command_dims: Mapping[str, int],
                 default_pose: Mapping[str, float], action_dim: int) -> None:
        self.sources, self.command_dims = sources, command_dims
        self.default_pose, self.action_dim = default_pose, action_dim

    def read(self, r: Reader, registry: Mapping[str, TermKind]
             ) -> tuple[str, TermKind, str, dict[str, Any]]:
        """The kind's name and entry, the source (empty when it reads none) and the params;
        the caller reads its manager's own fields, then calls ``r.done(entry.params)``."""
        name = r.choice("kind", sorted(registry))
        kind = registry[name]
        source, sample_type = "", None
        if kind.sources:
            source = r.text("source")
            sample_type = source_type(self.sources, source, r.at("source"), kind.sources)
        elif "source" in r.data:
            raise r.fail("source", f"{name} reads no source")
        params: dict[str, Any] = {}
        for param, param_type in kind.params.items():
            if param not in r.data and param in kind.defaults:
                params[param] = kind.defaults[param]
                continue
            params[param] = self._param(r, param, param_type, sample_type, params)
        self._check_kind(r, name, params)
        return name, kind, source, params

    def dim(self, kind: TermKind, params: Mapping[str, Any]) -> int:
        return kind.dim(params, Sizes(self.command_dims, self.action_dim))

    def _param(self, r: Reader, name: str, param_type: str, sample_type: type | None,
               params: Mapping[str, Any]) -> Any:
        if param_type == "joints":
            return list(r.names(name))
        if param_type == "command":
            command = r.text(name)
            if command not in self.command_dims:
                raise r.fail(name, f"no command named {command!r} (commands: "
                                   f"{sorted(self.command_dims)})")
            return command
        if param_type == "pose_source":
            source = r.text(name)
            source_type(self.sources, source, r.at(name), POSE_TYPES)
            return source
        if param_type == "float":
            return r.number(name)
        if param_type == "positive":
            return r.positive(name)
        if param_type == "floats":
            values = r.per_joint(name, len(params.get("joints", ())) or 1)
            return list(values) if len(values) > 1 else values[0]
        if param_type == "steps":
            return r.integer(name)
        if param_type == "indices":
            return list(r.indices(name))
        assert param_type == "fields" and sample_type is not None, param_type
        return list(r.fields(name, sample_type))

    def _check_kind(self, r: Reader, kind: str, params: Mapping[str, Any]) -> None:
        """What one param cannot say alone: the default pose of relative joints, a target's
        size, a tracking's pairing of command values with fields."""
        if kind == "joint_pos_rel":
            posed(params["joints"], self.default_pose, r.at("joints"))
        target = _TARGETS.get(kind)
        if target and self.command_dims[params[target]] != 3:
            raise r.fail(target, f"command {params[target]!r} has "
                                 f"{self.command_dims[params[target]]} values; a target "
                                 f"position needs 3")
        if kind == "exp_tracking":
            dim = self.command_dims[params["command"]]
            if len(params["command_indices"]) != len(params["fields"]):
                raise r.fail("command_indices", f"{len(params['command_indices'])} indices "
                                                f"for {len(params['fields'])} fields")
            if max(params["command_indices"]) >= dim:
                raise r.fail("command_indices", f"command {params['command']!r} has {dim} "
                                                f"values")
