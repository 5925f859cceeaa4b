"""Values out of decoded samples: joints by name, named fields, quaternion rotations.

Quaternions are (x, y, z, w), as geometry_msgs has them (MuJoCo and Eigen's storage differ:
convert before a sample is made).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from unilab_ros.robot.samples import JointStateSample, Sample

JOINT_FIELDS = ("position", "velocity", "effort")
_AXES = {"x": 0, "y": 1, "z": 2, "w": 3}
GRAVITY_WORLD = np.array([0.0, 0.0, -1.0])
"""The direction of gravity in the world frame (z up, as REP 103 has it)."""


class MissingJoint(ValueError):
    """A joint the spec names is not in the robot's joint states."""


def joint_indices(names: Sequence[str], joints: Sequence[str]) -> np.ndarray:
    """Where each of ``joints`` sits in the wire order ``names``; extra names are ignored.

    Raises MissingJoint naming every joint the wire lacks (and what it has).
    """
    where = {name: i for i, name in enumerate(names)}
    missing = [joint for joint in joints if joint not in where]
    if missing:
        raise MissingJoint(f"joint(s) {missing} not in joint_states (it has {list(names)})")
    return np.array([where[joint] for joint in joints], dtype=np.intp)


def joint_values(sample: JointStateSample, joints: Sequence[str], field: str) -> np.ndarray:
    """``field`` (position, velocity or effort) of ``joints``, in the order of ``joints``.

    A broadcaster may leave velocity or effort empty; asking for it is then an error.
    """
    values = np.asarray(getattr(sample, field), np.float64)
    if values.size != len(sample.names):
        raise ValueError(f"joint_states has {len(sample.names)} names but {values.size} "
                         f"{field} values")
    return values[_cached_indices(tuple(sample.names), tuple(joints))]


@functools.lru_cache(maxsize=256)
def _cached_indices(names: tuple[str, ...], joints: tuple[str, ...]) -> np.ndarray:
    # A broadcaster's order is fixed for its life: match names once per order, not per tick.
    return joint_indices(names, joints)


def sample_field(sample: Sample, name: str) -> float:
    """One number of a sample by name: ``<attribute>.<x|y|z|w|index>``, e.g. ``linear.x``,
    ``position.z``, ``orientation_xyzw.w``, ``data.3``."""
    attribute, _, part = name.partition(".")
    values = getattr(sample, attribute, None)
    if values is None or not part:
        raise ValueError(f"{type(sample).__name__} has no field {name!r}")
    index = _AXES[part] if part in _AXES else int(part)
    flat = np.asarray(values).reshape(-1)
    if index >= flat.size:
        raise ValueError(f"{type(sample).__name__}.{attribute} has {flat.size} values; "
                         f"{name!r} reads index {index}")
    return float(flat[index])


def check_field(sample_type: type, name: str) -> str:
    """Why ``name`` cannot be a field of ``sample_type`` (empty when it can); checked on
    the spec before any sample exists."""
    attribute, _, part = name.partition(".")
    vector_fields = {f for f in sample_type.__dataclass_fields__
                     if f not in ("names", "stamp", "child_frame_id")}
    if attribute not in vector_fields:
        return (f"{sample_type.__name__} has no field {attribute!r} "
                f"(it has {sorted(vector_fields)})")
    if part in _AXES or (part.isdigit() and attribute == "data"):
        if part == "w" and attribute != "orientation_xyzw":
            return f"{attribute!r} has no w"
        return ""
    return f"{name!r}: after the dot comes x, y, z (w for a quaternion), or an index for data"


def rotate_inverse(xyzw: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``vector`` (world frame) in the frame whose orientation is the unit quaternion
    ``xyzw`` = (x, y, z, w): R^T v."""
    q = np.asarray(xyzw, np.float64)
    norm = np.linalg.norm(q)
    if not np.isfinite(norm) or norm < 1e-9:
        raise ValueError(f"orientation {q.tolist()} is no quaternion (x, y, z, w)")
    x, y, z, w = (float(c) for c in q / norm)
    # The rotation matrix of (x, y, z, w), written out: np.cross on 3-vectors costs ~20 us.
    rotation = np.array([
        [1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - z * w), 2.0 * (x * z + y * w)],
        [2.0 * (x * y + z * w), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - x * w)],
        [2.0 * (x * z - y * w), 2.0 * (y * z + x * w), 1.0 - 2.0 * (x * x + y * y)],
    ])
    return rotation.T @ np.asarray(vector, np.float64)


def projected_gravity(xyzw: np.ndarray) -> np.ndarray:
    """The unit gravity direction in the body frame of orientation ``xyzw`` (x, y, z, w):
    (0, 0, -1) upright; its x, y grow with tilt."""
    return rotate_inverse(xyzw, GRAVITY_WORLD)
