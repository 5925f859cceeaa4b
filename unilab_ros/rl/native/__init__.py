"""The optional compiled activations for MLX's CPU backend: build and load.

``activations.cpp`` defines MLX primitives whose CPU kernels are vectorized (AVX2 + FMA
where the CPU has them), for the forward and backward of ELU, tanh and SiLU. ``make
setup`` builds them with ``python -m unilab_ros.rl.native`` (CMake, g++, nanobind and
the CMake config in the MLX wheel) into this folder. Everything here is optional: where
the build or the load fails (macOS, no compiler, another MLX), ``load`` says why and the
activations run on plain MLX ops, as before."""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import mlx.core as mx

SOURCE_DIR = Path(__file__).resolve().parent
MODULE = "unilab_ros.rl.native._unilab_native"
DISABLE_ENV = "UNILAB_NATIVE"
"""Set to 0 to run the activations on plain MLX ops even where the extension is built."""


def build_skip_reason() -> str | None:
    """Why this machine gets no extension build, or None to build it."""
    if sys.platform != "linux":
        # macOS runs the update on Metal, where the extension has no kernel to offer.
        return f"only built on Linux (this is {sys.platform})"
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if importlib.util.find_spec("nanobind") is None:
        missing.append("nanobind")
    if missing:
        return f"{' and '.join(missing)} not found"
    return None


def build(output_dir: Path = SOURCE_DIR, verbose: bool = False) -> Path:
    """Configure and build the extension with CMake; return the built module's path.

    Raises RuntimeError with the tail of the build log when a step fails.
    """
    with tempfile.TemporaryDirectory(prefix="unilab-native-") as build_dir:
        configure = [
            "cmake",
            "-S",
            str(SOURCE_DIR),
            "-B",
            build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DUNILAB_OUTPUT_DIR={output_dir}",
        ]
        jobs = str(max(1, os.cpu_count() or 1))
        for command in (configure, ["cmake", "--build", build_dir, "-j", jobs]):
            result = subprocess.run(
                command, capture_output=not verbose, text=True, check=False
            )
            if result.returncode != 0:
                log = (result.stdout or "") + (result.stderr or "")
                tail = "\n".join(log.strip().splitlines()[-15:])
                raise RuntimeError(f"{command[0]} {command[1]} failed:\n{tail}")
    built = sorted(output_dir.glob("_unilab_native*.so"))
    if not built:
        raise RuntimeError(f"the build produced no _unilab_native module in {output_dir}")
    return built[-1]


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# Each native function's value and derivative in float64, for the self-test.
_REFERENCES: dict[str, tuple[Callable[[float], float], Callable[[float], float]]] = {
    "elu": (lambda v: v if v > 0 else math.expm1(v), lambda v: 1.0 if v > 0 else math.exp(v)),
    "tanh": (math.tanh, lambda v: 1.0 - math.tanh(v) ** 2),
    "silu": (
        lambda v: v * _sigmoid(v),
        lambda v: _sigmoid(v) * (1.0 + v * (1.0 - _sigmoid(v))),
    ),
}


def _self_test(module: ModuleType) -> None:
    """One forward and one backward of each activation against known values: a module
    built against another nanobind domain or MLX fails here (TypeError), one built from
    older sources (AttributeError), rather than later inside an update."""
    points = [-2.0, -0.5, 0.0, 1.5]
    x = mx.array(points)
    for name, (value, slope) in _REFERENCES.items():
        function = getattr(module, name)
        y, grad = function(x), mx.grad(lambda v, f=function: f(v).sum())(x)
        expected = [value(v) for v in points] + [slope(v) for v in points]
        got = y.tolist() + grad.tolist()
        if any(abs(a - b) > 1e-6 for a, b in zip(got, expected, strict=True)):
            raise RuntimeError(f"self-test of {name} gave {y.tolist()}, gradient {grad.tolist()}")


def load() -> tuple[ModuleType | None, str]:
    """The extension module, or None; and what was loaded or why not, for the log."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None, f"disabled by {DISABLE_ENV}=0"
    try:
        module = importlib.import_module(MODULE)
    except ImportError as error:
        reason = build_skip_reason()
        if reason is None:
            reason = f"not built ({error}); build it with `{sys.executable} -m {__name__}`"
        return None, reason
    if module.mlx_version != mx.__version__:
        return None, (
            f"built for MLX {module.mlx_version}, this is MLX {mx.__version__}: "
            f"rebuild with `{sys.executable} -m {__name__}`"
        )
    try:
        _self_test(module)
    except Exception as error:  # noqa: BLE001 - any failure means: plain MLX ops
        return None, f"failed its self-test: {type(error).__name__}: {error}"
    return module, f"fused native kernels ({module.instruction_set}, {platform.machine()})"
