"""A training run's files: its folder, checkpoints (interval, latest, best), bundles and
metrics (ROS-free).

Every checkpoint write is atomic (``rl.checkpoint``); a disk that refuses one is counted
(``save_failures``), its first error of each kind logged, and training goes on.

A start in a folder that holds a run (``restart``) resumes it or refuses (see
``run_folder.restart_plan``); a resumed run's metrics.csv loses the rows past the
iteration it resumes from, and its ``best.safetensors`` is replaced only by a better one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from unilab_ros.loop.counters import Counters
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.algorithm import Agent, bundle_of, save_training
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.bundle import save_bundle
from unilab_ros.rl.checkpoint import (
    Checkpoint,
    CheckpointError,
    remove_stale_temporaries,
)
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.trainer.metrics_log import MetricsLog
from unilab_ros.trainer.run_folder import (
    BEST_CHECKPOINT,
    new_run_folder,
    point_latest,
    restart_plan,
)
from unilab_ros.trainer.session import SessionConfig

Log = Callable[[str, str], None]
"""``log(level, text)``, level ``info`` or ``error``."""


def output_folder(checkpoint_dir: str, runs_root: str, namespace: str) -> tuple[Path, bool]:
    """``checkpoint_dir``, or else a new folder for this run (see ``run_folder``), and
    whether it is such a run folder; raises OSError when it cannot be made."""
    if checkpoint_dir:
        return Path(checkpoint_dir), False
    # ``latest`` moves to it once it holds something: a start that fails must not hide
    # the previous run's checkpoints behind an empty folder.
    return new_run_folder(Path(runs_root), namespace, link_latest=False), True


@dataclass
class Restart:
    """How a session starts in its folder: the best policy to beat, and what to say."""

    best: BestPolicy
    notes: list[str]


def restart(checkpoint_dir: str, cfg: SessionConfig) -> tuple[SessionConfig, Restart]:
    """``cfg`` for a start in ``checkpoint_dir`` (none: a new run folder, a fresh start):
    resuming the run the folder holds, or refused (RunFolderError, a ValueError, with the
    line to log). The best policy starts from the
    folder's ``best.safetensors`` score, so only a better one replaces that file."""
    best = BestPolicy(cfg.best_min_episodes)
    if not checkpoint_dir:
        return cfg, Restart(best, [])
    folder = Path(checkpoint_dir)
    plan = restart_plan(folder, cfg.resume_from, cfg.fine_tune.init_from,
                        cfg.loop.max_iterations)
    notes = [plan.note] if plan.note else []
    stored = folder / BEST_CHECKPOINT
    if stored.is_file():
        try:
            kept = Checkpoint(stored)
            best.keep_stored(float(kept.extra["best_mean_return"]), kept.iteration)
            notes.append(f"{stored} (mean return {best.mean_return:.2f} at iteration "
                         f"{best.iteration}) is replaced only by a better policy")
        except (CheckpointError, KeyError, TypeError, ValueError) as error:
            notes.append(f"{stored} cannot be read ({error}): the next best replaces it")
    return replace(cfg, resume_from=plan.resume_from), Restart(best, notes)


class RunArtifacts:
    """Writes the run's checkpoints, bundles and metrics into ``folder``."""

    def __init__(
        self, folder: Path, agent: Agent, actions: ActionConfig, counters: Counters,
        tensorboard: bool, log: Log, run_folder: bool = False,
        robot: dict[str, Any] | None = None,
    ) -> None:
        """``run_folder``: ``folder`` is a new run's (``output_folder``), which ``latest``
        points to once the run wrote a metrics row or a checkpoint there; ``robot``: the
        robot spec's payload (``robot.payload``) every checkpoint and bundle carries. The
        metrics rows past ``agent``'s iteration (a resumed run's) are removed."""
        self.folder = folder
        self._unlinked = run_folder
        self._agent = agent
        self._actions = actions
        self._robot = robot or {}
        self._counters = counters
        self._log = log
        self.last_save_error = ""
        self._errors_logged: set[tuple[str, int | None]] = set()
        try:
            stale = remove_stale_temporaries(folder)
        except OSError:
            stale = []
        if stale:
            log("info", f"removed {len(stale)} temporary file(s) of saves that never finished")
        self.metrics = MetricsLog(folder, tensorboard, resumed_at=agent.iteration)
        if self.metrics.rows_removed:
            log("info", f"{self.metrics.csv_path}: removed {self.metrics.rows_removed} row(s) "
                        f"past iteration {agent.iteration}, where this run resumes")

    def save(self, reason: str, status: dict[str, Any], stats: EpisodeStats) -> Path | None:
        """Write the training checkpoint (and ``latest``); returns the iteration's file,
        or None when the disk refused."""
        extra = {"reason": reason, "node": status, "episodes": stats.state(),
                 "robot": self._robot}
        path = self.folder / f"checkpoint_{self._agent.iteration:06d}.safetensors"
        if not self._write(path, extra, f"checkpoint ({reason})"):
            return None
        self._write(self.folder / "latest.safetensors", extra, "latest")
        self._link_latest()
        self._log("info", f"checkpoint saved ({reason}): {path}")
        return path

    def save_best(self, best: BestPolicy, status: dict[str, Any]) -> Path | None:
        """Keep the new best policy as ``best.safetensors`` (a training checkpoint)."""
        extra = {"reason": "best", "best_mean_return": best.mean_return,
                 "best_min_episodes": best.min_episodes, "node": status, "robot": self._robot}
        path = self.folder / "best.safetensors"
        if not self._write(path, extra, "best policy"):
            return None
        self._log(
            "info",
            f"new best: mean return {best.mean_return:.2f} over the last "
            f"{best.min_episodes} episodes at iteration {best.iteration}: {path}",
        )
        return path

    def write_metrics(self, iteration: int, values: dict[str, float]) -> None:
        """One iteration's row of ``metrics.csv`` (and TensorBoard scalars)."""
        self.metrics.write(iteration, values)
        self._link_latest()

    def _link_latest(self) -> None:
        if not self._unlinked:
            return
        try:
            point_latest(self.folder)
            self._unlinked = False
        except OSError as error:
            self._log("error", f"cannot point {self.folder.parent / 'latest'} at {self.folder}: "
                               f"{error}")
            self._unlinked = False

    def export_bundle(self, source: str) -> Path:
        """The current policy as ``bundle_<iteration>.safetensors``; raises BundleError,
        OSError or RuntimeError (MLX's full disk) when it cannot be written."""
        name = f"bundle_{self._agent.iteration:06d}.safetensors"
        bundle = bundle_of(self._agent, self._actions, source, self._robot)
        return save_bundle(self.folder / name, bundle)

    def _write(self, path: Path, extra: dict[str, Any], what: str) -> bool:
        """Write (or, with a learner process, have it write) one checkpoint; False when the
        disk refused at once (a learner process's refusal is counted when it arrives)."""

        def failed(where: Path, error: str) -> None:
            self._failed(what, where, error.split(":")[0], None, error)

        try:
            # The off-policy learner's replay goes beside latest only: the file a restart
            # resumes from (a copy per interval checkpoint would fill the disk).
            save_training(path, self._agent, extra, self._actions,
                          with_replay=path.name == "latest.safetensors", failed=failed)
        # MLX reports a full disk as RuntimeError, the filesystem the rest as OSError.
        except (OSError, RuntimeError) as error:
            self._failed(what, path, type(error).__name__, getattr(error, "errno", None),
                         f"{type(error).__name__}: {error}")
            return False
        return True

    def _failed(self, what: str, path: Path, kind_name: str, errno: int | None,
                error: str) -> None:
        self._counters.add("save_failures")
        # MLX's message names no file: the path says which write the disk refused.
        self.last_save_error = f"{what} ({path}): {error}"
        kind = (kind_name, errno)
        if kind not in self._errors_logged:
            self._errors_logged.add(kind)
            self._log(
                "error",
                f"could not save the {self.last_save_error}; training goes on (this kind "
                "of error is logged once; see save_failures in ~/status)",
            )

    def close(self) -> None:
        self.metrics.close()
