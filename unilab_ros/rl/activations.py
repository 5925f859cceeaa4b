"""Hidden-layer activations by name, and fast ELU, tanh and SiLU for MLX's CPU backend.

On mlx-cpu, ``exp`` and ``tanh`` run one scalar libm call per element (~15 ns) while
add, multiply, min/max and integer ops are vectorized (~0.25 ns), and ``where`` is slow
as well. ``nn.elu`` (``where(x > 0, x, exp(x) - 1)``) costs ~20 ms on a 1536x512
batch here and dominates a PPO update at robot sizes; ``mx.tanh`` and ``nn.silu`` cost
~12-17 ms forward and backward. ``elu`` below runs, in this order of preference:

- the fused native kernels of ``unilab_ros.rl.native`` (one vectorized pass forward,
  ~0.3 ms on 1536x512, and one backward), on the CPU where ``make setup`` built them;
- the same function from vectorized MLX ops (~4x faster than ``nn.elu``), which keeps
  its slope (exp(min(x, 0))) from the forward pass, so the backward pass is one
  multiply: on Metal, and wherever the extension is not built or does not load.

``tanh`` and ``silu`` run the native kernels in the same place (~0.45 and ~0.55 ms
forward and backward), and ``mx.tanh`` / ``nn.silu`` elsewhere: Metal has fast ones.
The native kernels take float32 only; other dtypes run the MLX ops everywhere."""

from __future__ import annotations

import logging
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from unilab_ros.rl import native

_LOG = logging.getLogger(__name__)

_native, NATIVE_STATUS = native.load()
"""The native extension module or None, and what was loaded or why not."""

_LOG2E = 1.4426950408889634
# ln 2 split in two (Cody-Waite): n * _LN2_HI is exact for the |n| < 2**8 used here.
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
# Adding 1.5 * 2**23 to a float32 of magnitude < 2**22 rounds it to an integer, which
# then sits in the low mantissa bits: bits(_ROUND + n) == _ROUND_BITS + n.
_ROUND = 12582912.0
_ROUND_BITS = 0x4B400000
_FLOAT_BIAS = 127
_MANTISSA_BITS = 23
# Cephes expf: exp(r) = 1 + r + r**2 * P(r) on |r| <= ln(2) / 2, within 1 ulp.
_EXP_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
# Below this, 2**n would be subnormal; exp(x) - 1 has long rounded to -1 in float32.
_EXP_MIN_INPUT = -87.0


def expm1_nonpositive(x: mx.array) -> mx.array:
    """``exp(x) - 1`` for float32 ``x <= 0``, from vectorized ops only.

    exp(x) = 2**n * exp(r) with n = round(x / ln 2) and |r| <= ln(2) / 2; exp(r) - 1
    is a polynomial, 2**n is built in the exponent bits. Writing the result as
    ``2**n * (exp(r) - 1) + (2**n - 1)`` keeps full relative precision near 0 (where
    ``exp(x) - 1`` cancels). Measured against float64 over all negative float32
    inputs: relative error below 1e-7 (within 1 ulp), absolute below 5e-8.
    Positive inputs are not supported (they are treated as 0).
    """
    x = mx.clip(x, _EXP_MIN_INPUT, 0.0)
    shifted = x * _LOG2E + _ROUND
    n = shifted - _ROUND
    r = (x - n * _LN2_HI) - n * _LN2_LO
    poly = mx.array(_EXP_POLY[0], x.dtype)
    for coef in _EXP_POLY[1:]:
        poly = poly * r + coef
    exp_r_minus_1 = poly * (r * r) + r
    exponent = shifted.view(mx.int32) - (_ROUND_BITS - _FLOAT_BIAS)
    scale = mx.left_shift(exponent, _MANTISSA_BITS).view(x.dtype)
    return scale * exp_r_minus_1 + (scale - 1.0)


def _elu_forward_ops(x: mx.array) -> tuple[mx.array, mx.array]:
    """ELU and its slope: exp(min(x, 0)) is 1 for x > 0 and exp(x) below, which is the
    derivative; it falls out of the forward pass, so the backward is one multiply."""
    expm1 = expm1_nonpositive(mx.minimum(x, 0.0))
    return mx.maximum(x, 0.0) + expm1, expm1 + 1.0


# Compiling fuses the ~25 ops into a few passes over memory (2 ms instead of 7 ms on
# 1536x512), where the calling graph is not itself being differentiated (inside
# value_and_grad only a whole compiled step fuses it). The kernels are C++ built by
# MLX on the first call (~5 s, cached on disk and reused for every shape).
_elu_forward = mx.compile(_elu_forward_ops)


def prepare_elu() -> str | None:
    """Log which ELU runs; without the native kernels, build the compiled MLX one now and
    fall back to plain ops if MLX cannot compile.

    MLX compiles lazily, so a missing C++ compiler would only show at some later
    evaluation. Returns the error that caused the fallback, or None.
    """
    global _elu_forward
    if _native is not None and _on_cpu():
        _LOG.info("ELU: %s", NATIVE_STATUS)
        return None
    _LOG.info("ELU: vectorized MLX ops (native kernels: %s)", NATIVE_STATUS)
    try:
        mx.eval(*_elu_forward(mx.array([-1.0, 1.0])))
    except Exception as error:  # noqa: BLE001 - any compile failure means: plain ops
        _elu_forward = _elu_forward_ops
        _LOG.warning("fused ELU unavailable, using plain MLX ops: %s", error)
        return f"{type(error).__name__}: {error}"
    return None


def prepare(name: str) -> str | None:
    """Log which kernels the activation ``name`` runs on; for ELU, also ``prepare_elu``.

    Returns the error that made the ELU fall back to plain ops, or None.
    """
    if name == "elu":
        return prepare_elu()
    if name in _NATIVE_NAMES:
        if _native is not None and _on_cpu():
            _LOG.info("%s: %s", name, NATIVE_STATUS)
        else:
            _LOG.info("%s: MLX ops (native kernels: %s)", name, NATIVE_STATUS)
    return None


@mx.custom_function
def _elu_and_slope(x: mx.array) -> tuple[mx.array, mx.array]:
    return _elu_forward(x)


@_elu_and_slope.vjp
def _elu_vjp(
    primals: list[mx.array], cotangents: list[mx.array], outputs: list[mx.array]
) -> mx.array:
    # Only the ELU output is ever used downstream, so its cotangent is the gradient.
    return cotangents[0] * outputs[1]


def elu(x: mx.array) -> mx.array:
    """ELU with alpha 1: ``x`` for x > 0, ``exp(x) - 1`` otherwise (as ``nn.elu``).

    Same values as ``nn.elu`` for finite inputs (within 6e-8); the gradient is 1 for
    x > 0 and exp(x) otherwise, from the forward's output or slope (within 6e-8).
    """
    if _runs_native(x):
        return _native.elu(x)
    return _elu_and_slope(x)[0]


def tanh(x: mx.array) -> mx.array:
    """``mx.tanh``, natively where it can. Native: within 2.5 ulp of tanh; the gradient
    is 1 - y**2 from the output y (as PyTorch's), within 3e-7 absolute."""
    return _native.tanh(x) if _runs_native(x) else mx.tanh(x)


def silu(x: mx.array) -> mx.array:
    """``nn.silu`` (x * sigmoid(x)), natively where it can. Native: within 3.5 ulp of
    SiLU, and exactly 0 below x = -87 (the true value is under 2e-36 in magnitude); the
    gradient within 2.2e-7 absolute."""
    return _native.silu(x) if _runs_native(x) else nn.silu(x)


def _runs_native(x: mx.array) -> bool:
    # The native primitives have CPU kernels only; Metal and CUDA run the MLX ops.
    return _native is not None and x.dtype == mx.float32 and _on_cpu()


def _on_cpu() -> bool:
    return mx.default_device() == mx.cpu


_NATIVE_NAMES = ("tanh", "silu")
"""The activations besides ELU with native kernels."""

ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "elu": elu,
    "relu": nn.relu,
    "tanh": tanh,
    "selu": nn.selu,
    "gelu": nn.gelu,
    "silu": silu,
    "leaky_relu": nn.leaky_relu,
    "softplus": nn.softplus,
}
