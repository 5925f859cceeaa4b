"""One robot's observation vector from its newest samples, built the same way in training
and deployment.

The pipeline, per term: compute -> clip -> scale -> history. Each term's history holds its
last ``history`` steps oldest first (the newest values last); an episode's first build
fills it with its first value repeated. Terms are concatenated in spec order, each as
``history x values`` (row-major: oldest step's values, ..., newest step's values).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from unilab_ros.robot.commands import read_commands
from unilab_ros.robot.observation_terms import OBSERVATIONS
from unilab_ros.robot.samples import Sample
from unilab_ros.robot.spec import RobotSpec
from unilab_ros.robot.terms import Sizes, TermContext

PIPELINE = "compute, clip, scale, history"
"""Each term's steps, in order."""
HISTORY_ORDER = "oldest_first"
"""A term's slice holds its steps oldest first, each step's values together."""


@dataclass(frozen=True)
class ObservationSlice:
    """Where one term sits in the vector (the bundle's and the ONNX model's metadata)."""

    term: str
    """The term's kind."""
    start: int
    """First index in the vector."""
    stop: int
    """One past its last index: stop - start = history x values."""
    values: int
    """Values per step."""
    history: int
    """Steps, oldest first."""
    source: str
    """The source it reads (empty for none)."""
    joints: tuple[str, ...]
    """The joints, in the order of their values (empty for a term without joints)."""
    clip: tuple[float, float] | None
    """Applied before the scale; None: none."""
    scale: tuple[float, ...]
    """Once or per value."""

    def to_dict(self) -> dict:
        data = asdict(self)
        data["joints"], data["scale"] = list(self.joints), list(self.scale)
        data["clip"] = list(self.clip) if self.clip is not None else None
        return data


class ObservationBuilder:
    """Builds the observation of one robot; ``reset()`` at each episode start."""

    def __init__(self, spec: RobotSpec) -> None:
        self.spec = spec
        sizes = Sizes({c.name: c.dim for c in spec.commands}, len(spec.actions.joints))
        self._values = [OBSERVATIONS[t.kind].dim(t.params, sizes) for t in spec.observation]
        self._scales = [np.asarray(t.scale, np.float64) for t in spec.observation]
        self._history: list[deque[np.ndarray]] = [deque(maxlen=t.history)
                                                  for t in spec.observation]
        self.dim = sum(n * t.history for n, t in zip(self._values, spec.observation,
                                                     strict=True))
        """The vector's size."""

    def reset(self) -> None:
        """Forget every term's history (the next build starts an episode)."""
        for history in self._history:
            history.clear()

    def build(self, samples: Mapping[str, Sample], last_action: np.ndarray,
              commands: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """The observation (float32, ``dim``) from the newest sample of every source, the
        latest action sent (policy units) and the sampled commands' values (the commands
        read from a source are read here)."""
        commands = {**(commands or {}), **read_commands(self.spec, samples)}
        ctx = TermContext(samples=samples, previous={}, commands=commands,
                          default_pose=self.spec.default_pose, action=last_action,
                          previous_action=last_action, dt=self.spec.dt)
        return self.build_from(ctx)

    def build_from(self, ctx: TermContext) -> np.ndarray:
        """The observation from a tick's context (the step source's way in)."""
        parts = []
        for i, term in enumerate(self.spec.observation):
            value = np.asarray(OBSERVATIONS[term.kind].fn(ctx, term.source, term.params),
                               np.float64).reshape(-1)
            if value.size != self._values[i]:
                raise ValueError(f"observation[{i}] ({term.kind}) gave {value.size} values, "
                                 f"expected {self._values[i]}")
            if term.clip is not None:
                value = np.clip(value, *term.clip)
            value = value * self._scales[i]
            history = self._history[i]
            if not history:
                history.extend([value] * term.history)
            else:
                history.append(value)
            parts.extend(history)
        return np.concatenate(parts).astype(np.float32)

    def metadata(self) -> dict:
        """The layout with its conventions, JSON-ready (the bundle's and ONNX metadata): a
        runtime in another language can build the same vector from it."""
        return {"dim": self.dim, "pipeline": PIPELINE, "history_order": HISTORY_ORDER,
                "slices": [s.to_dict() for s in self.layout()]}

    def layout(self) -> list[ObservationSlice]:
        """Each term's slice, in order."""
        slices, start = [], 0
        for n, term in zip(self._values, self.spec.observation, strict=True):
            stop = start + n * term.history
            slices.append(ObservationSlice(term.kind, start, stop, n, term.history,
                                           term.source, tuple(term.params.get("joints", ())),
                                           term.clip, term.scale))
            start = stop
        return slices
