"""The values of a spec's commands and targets: drawn per episode from their ranges, or read
from their source at every tick."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from unilab_ros.robot.extract import sample_field
from unilab_ros.robot.samples import Sample
from unilab_ros.robot.spec import RobotSpec


def draw_commands(spec: RobotSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A new episode's value of every sampled command, uniform within its ranges."""
    return {c.name: rng.uniform(*np.array(c.ranges).T) for c in spec.commands if not c.source}


def read_commands(spec: RobotSpec, samples: Mapping[str, Sample]) -> dict[str, np.ndarray]:
    """The value of every command read from a source, from that source's newest sample."""
    return {c.name: np.array([sample_field(samples[c.source], f) for f in c.fields])
            for c in spec.commands if c.source}
