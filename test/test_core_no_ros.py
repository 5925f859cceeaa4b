"""The MLX core imports without ROS, and loads OpenBLAS ahead of MLX when it can.

Each check runs in a fresh interpreter: this test process may already hold rclpy (other
tests import it) and mlx, which would hide what importing the core pulls in.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
ROS_PREFIXES = ("rclpy", "std_msgs", "rosidl", "launch")

IMPORT_ALL_OF_THE_CORE = """
import json, pkgutil, sys, importlib
import unilab_ros.rl
from unilab_ros.rl.blas import blas_description
for info in pkgutil.walk_packages(unilab_ros.rl.__path__, "unilab_ros.rl."):
    importlib.import_module(info.name)
with open("/proc/self/maps") as maps:
    mapped = maps.read()
print(json.dumps({
    "modules": sorted(sys.modules),
    "blas": blas_description(),
    "openblas_mapped": "libopenblas" in mapped,
}))
"""


def run_python(code: str, **env_overrides: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "UNILAB_BLAS"}
    env.update(env_overrides)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_core_imports_no_ros_module():
    report = run_python(IMPORT_ALL_OF_THE_CORE)
    assert "unilab_ros.rl.ppo" in report["modules"]
    ros_modules = [name for name in report["modules"] if name.startswith(ROS_PREFIXES)]
    assert ros_modules == []


@pytest.mark.skipif(not OPENBLAS.exists(), reason="libopenblas0-pthread not installed")
def test_openblas_is_loaded_and_named():
    report = run_python(IMPORT_ALL_OF_THE_CORE)
    assert "OpenBLAS" in report["blas"]
    assert report["openblas_mapped"]


def test_unilab_blas_none_keeps_the_bundled_blas():
    report = run_python(IMPORT_ALL_OF_THE_CORE, UNILAB_BLAS="none")
    if sys.platform == "darwin":
        assert "Accelerate" in report["blas"]
    else:
        assert "bundled" in report["blas"]
        assert not report["openblas_mapped"]


@pytest.mark.skipif(sys.platform == "darwin", reason="Linux-only BLAS loading")
def test_mlx_imported_first_is_reported_as_the_bundled_blas():
    # Too late to load OpenBLAS: the message must not claim it.
    code = "import mlx.core\n" + IMPORT_ALL_OF_THE_CORE
    assert "bundled" in run_python(code)["blas"]
