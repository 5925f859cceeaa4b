"""Per-iteration metrics to a CSV file and, when available, TensorBoard (ROS-free)."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path
from typing import Any

_LOG = logging.getLogger(__name__)


class MetricsLog:
    """Appends one CSV row per iteration; the columns are fixed by the first row."""

    def __init__(self, folder: str | Path, tensorboard: bool = True) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.folder / "metrics.csv"
        self._columns: list[str] | None = None
        if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
            with open(self.csv_path, newline="") as handle:
                self._columns = next(csv.reader(handle), None)
        self._writer: Any = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                _LOG.warning("tensorboardX is not installed: TensorBoard logging is off")
            else:
                self._writer = SummaryWriter(str(self.folder / "tensorboard"))

    def write(self, iteration: int, values: dict[str, float]) -> None:
        row = {"iteration": iteration, **values}
        new_file = self._columns is None
        if new_file:
            self._columns = list(row)
        with open(self.csv_path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self._columns, extrasaction="ignore")
            if new_file:
                writer.writeheader()
            writer.writerow(row)
        if self._writer is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and math.isfinite(value):
                    self._writer.add_scalar(key, value, iteration)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_metrics(csv_path: str | Path) -> dict[str, list[float]]:
    """Columns of a metrics CSV as float lists (for plots and tests)."""
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns = rows[0].keys() if rows else []
    return {key: [float(row[key]) for row in rows] for key in columns}
