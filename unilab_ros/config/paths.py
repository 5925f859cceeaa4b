"""Where the package's installed data (config, launch) lives."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = "unilab_ros"


def package_share() -> Path:
    """share/unilab_ros of a colcon or pip install, else the source tree (editable)."""
    try:
        from ament_index_python.packages import (
            PackageNotFoundError,
            get_package_share_directory,
        )

        return Path(get_package_share_directory(PACKAGE))
    except (ImportError, PackageNotFoundError, LookupError, OSError):
        pass
    installed = Path(sys.prefix) / "share" / PACKAGE
    if (installed / "config").is_dir():
        return installed
    return Path(__file__).resolve().parents[2]


def config_file(name: str) -> Path:
    path = package_share() / "config" / name
    if not path.is_file():
        raise FileNotFoundError(f"no config file {name} in {path.parent}")
    return path


def robot_spec_file(name: str) -> Path:
    """The robot spec ``name``: a YAML file, or a shipped spec's name (``cartpole`` is
    config/robot_specs/cartpole.yaml)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    shipped = package_share() / "config" / "robot_specs"
    if path.suffix == "" and len(path.parts) == 1 and (shipped / f"{name}.yaml").is_file():
        return shipped / f"{name}.yaml"
    names = sorted(p.stem for p in shipped.glob("*.yaml"))
    raise FileNotFoundError(f"robot_spec {name!r} is neither a file nor a shipped spec "
                            f"({', '.join(names)})")
