"""ActionGuard without ROS: hold (e-stop), rate limit, low-pass smoothing and blend-in."""

from __future__ import annotations

import numpy as np
import pytest

from unilab_ros.loop.action_safety import ActionGuard, ActionSafetyConfig, stricter

SAFE = np.array([[0.5, -0.5], [0.5, -0.5]], np.float32)
TARGET = np.array([[2.0, 1.5], [-1.0, -0.5]], np.float32)


def test_with_everything_off_the_target_passes_bit_for_bit():
    guard = ActionGuard(ActionSafetyConfig(), SAFE)
    rng = np.random.default_rng(0)
    for _ in range(5):
        target = rng.normal(size=SAFE.shape).astype(np.float32)
        np.testing.assert_array_equal(guard(target), target)
    guard.hold()
    np.testing.assert_array_equal(guard(TARGET), TARGET)  # no blend-in configured


def test_hold_gives_the_safe_action_at_once_whatever_the_rate_limit():
    guard = ActionGuard(ActionSafetyConfig(max_action_change=[0.1]), SAFE)
    for _ in range(40):
        guard(TARGET)
    np.testing.assert_allclose(guard.last, TARGET)
    np.testing.assert_array_equal(guard.hold(), SAFE)
    assert guard.hold() is not guard.safe, "callers may not alias the guard's safe action"


def test_the_rate_limit_bounds_every_step_per_dim():
    guard = ActionGuard(ActionSafetyConfig(max_action_change=[0.25, 0.0]), SAFE)
    previous = SAFE
    sent = []
    for _ in range(10):
        action = guard(TARGET)
        change = np.abs(action - previous)
        assert np.all(change[:, 0] <= 0.25 + 1e-6)
        previous = action
        sent.append(action)
    # Dim 1 is unlimited (0): it reaches its target on the first step.
    np.testing.assert_allclose(sent[0][:, 1], TARGET[:, 1])
    np.testing.assert_allclose(sent[0][:, 0], [0.75, 0.25])
    np.testing.assert_allclose(sent[-1], TARGET)


def test_smoothing_is_a_first_order_low_pass():
    guard = ActionGuard(ActionSafetyConfig(action_smoothing=0.75), SAFE)
    first = guard(TARGET)
    np.testing.assert_allclose(first, 0.75 * SAFE + 0.25 * TARGET)
    second = guard(TARGET)
    np.testing.assert_allclose(second, 0.75 * first + 0.25 * TARGET)


def test_blend_in_ramps_linearly_from_the_safe_action_after_a_hold():
    guard = ActionGuard(ActionSafetyConfig(blend_in_steps=4), SAFE)
    guard.hold()
    assert guard.blending
    sent = [guard(TARGET) for _ in range(5)]
    for step, action in enumerate(sent[:4], start=1):
        np.testing.assert_allclose(action, SAFE + step / 4 * (TARGET - SAFE), rtol=1e-6)
    np.testing.assert_array_equal(sent[4], TARGET)
    assert not guard.blending
    # A hold in the middle (an e-stop) starts the ramp again from the safe action.
    guard.hold()
    np.testing.assert_allclose(guard(TARGET), SAFE + 0.25 * (TARGET - SAFE), rtol=1e-6)


def test_all_three_together_stay_between_safe_and_target():
    guard = ActionGuard(
        ActionSafetyConfig(max_action_change=[0.3], action_smoothing=0.5, blend_in_steps=3), SAFE
    )
    guard.hold()
    low, high = np.minimum(SAFE, TARGET), np.maximum(SAFE, TARGET)
    previous = SAFE
    for _ in range(30):
        action = guard(TARGET)
        assert np.all(action >= low - 1e-6) and np.all(action <= high + 1e-6)
        assert np.all(np.abs(action - previous) <= 0.3 + 1e-6)
        previous = action
    np.testing.assert_allclose(previous, TARGET, atol=1e-3)


@pytest.mark.parametrize("cfg, reason", [
    (ActionSafetyConfig(max_action_change=[-1.0]), "max_action_change must be >= 0"),
    (ActionSafetyConfig(action_smoothing=1.0), "action_smoothing must be in"),
    (ActionSafetyConfig(blend_in_steps=-1), "blend_in_steps must be >= 0"),
    (ActionSafetyConfig(max_action_change=[0.1, 0.1, 0.1]), "max_action_change needs 1 or"),
])
def test_bad_settings_are_refused_with_a_reason(cfg, reason):
    with pytest.raises(ValueError, match=reason):
        ActionGuard(cfg, SAFE)


def test_the_rate_limit_holds_exactly_as_written_despite_float32_rounding():
    """Issue 41: float32(0.1) is above 0.1 and last + step rounds, so a limit of 0.1 let
    actions move 0.1000000015 (a command-unit limit an operator measures exactly)."""
    guard = ActionGuard(ActionSafetyConfig(max_action_change=[0.1]), SAFE)
    rng = np.random.default_rng(3)
    previous = SAFE.astype(np.float64)
    for _ in range(500):
        action = guard(rng.uniform(-30.0, 30.0, SAFE.shape).astype(np.float32))
        assert np.abs(action.astype(np.float64) - previous).max() <= 0.1
        previous = action.astype(np.float64)


def test_stricter_keeps_both_guards_per_dim():
    """Issue 41: a deploy node's guard parameter replaced the spec's guard whole."""
    spec = ActionSafetyConfig(max_action_change=[5.0, 0.0, 2.0], action_smoothing=0.5,
                              blend_in_steps=3)
    operator = ActionSafetyConfig(max_action_change=[1.0], blend_in_steps=25)
    both = stricter(spec, operator, 3)
    assert both.max_action_change == [1.0, 1.0, 1.0]
    assert (both.action_smoothing, both.blend_in_steps) == (0.5, 25)
    # 0 is no limit: it yields to the other's, and two 0s stay unlimited.
    loose = ActionSafetyConfig(max_action_change=[0.0, 0.0, 3.0])
    assert stricter(spec, loose, 3).max_action_change == [5.0, 0.0, 2.0]
