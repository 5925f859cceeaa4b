"""Per-iteration metrics to a CSV file and, when available, TensorBoard (ROS-free)."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path
from typing import Any

_LOG = logging.getLogger(__name__)


class MetricsLog:
    """Appends one CSV row per iteration; the columns are fixed by the first row.

    A folder or disk that refuses writes (read-only, full) does not stop training: the
    failure is logged once and counted in ``failures``, and later rows are tried again.
    """

    def __init__(self, folder: str | Path, tensorboard: bool = True) -> None:
        self.folder = Path(folder)
        self.csv_path = self.folder / "metrics.csv"
        self.failures = 0
        self._logged_failure = False
        self._columns: list[str] | None = None
        self._writer: Any = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
                with open(self.csv_path, newline="") as handle:
                    self._columns = next(csv.reader(handle), None)
        except OSError as error:
            self._failed(error)
        if tensorboard:
            self._writer = self._tensorboard_writer()

    def _tensorboard_writer(self) -> Any:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            _LOG.warning("tensorboardX is not installed: TensorBoard logging is off")
            return None
        try:
            return SummaryWriter(str(self.folder / "tensorboard"))
        except OSError as error:
            _LOG.error("TensorBoard logging is off: %s", error)
            return None

    def _failed(self, error: Exception) -> None:
        self.failures += 1
        if not self._logged_failure:
            self._logged_failure = True
            _LOG.error("cannot write %s (training goes on; logged once): %s", self.csv_path, error)

    def write(self, iteration: int, values: dict[str, float]) -> None:
        row = {"iteration": iteration, **values}
        new_file = self._columns is None
        columns = self._columns or list(row)
        try:
            with open(self.csv_path, "a", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
                if new_file:
                    writer.writeheader()
                writer.writerow(row)
            self._columns = columns
        except OSError as error:
            self._failed(error)
        if self._writer is not None:
            try:
                for key, value in values.items():
                    if isinstance(value, int | float) and math.isfinite(value):
                        self._writer.add_scalar(key, value, iteration)
                self._writer.flush()
            except OSError as error:
                self._failed(error)

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as error:
                self._failed(error)
            self._writer = None


def read_metrics(csv_path: str | Path) -> dict[str, list[float]]:
    """Columns of a metrics CSV as float lists (for plots and tests)."""
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns = rows[0].keys() if rows else []
    return {key: [float(row[key]) for row in rows] for key in columns}
