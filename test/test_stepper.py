"""StepSync without ROS: pairing obs / reward / done by arrival, with every ordering and fault."""

import itertools

import numpy as np
import pytest

from unilab_ros.loop.step_sync import StepSync
from unilab_ros.loop.steps import SegmentStart, Transition

TIMEOUT = 1.0
OBS = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], np.float32)
ACTION = np.array([[0.5], [-0.5]], np.float32)
REWARD = np.array([-1.0, -2.0], np.float32)
DONE = np.array([0, 2], np.uint8)
NEXT_OBS = OBS + 1.0


def started(stamp: int = 100, now: float = 10.0) -> StepSync:
    """A synchroniser with one action outstanding for OBS received at ``stamp``."""
    sync = StepSync(TIMEOUT)
    start = sync.on_observation(OBS, stamp)
    assert isinstance(start, SegmentStart), "a first observation starts a segment"
    assert start.obs is OBS and start.stamp == stamp
    sync.action_sent(OBS, ACTION, stamp, now)
    assert sync.awaiting_step
    return sync


def deliver(sync: StepSync, part: str, stamp: int):
    if part == "reward":
        return sync.on_reward(REWARD, stamp)
    if part == "done":
        return sync.on_done(DONE, stamp)
    return sync.on_observation(NEXT_OBS, stamp)


def counts(sync: StepSync) -> dict[str, int]:
    return {name: value for name, value in sync.counters.items() if value}


@pytest.mark.parametrize("order", list(itertools.permutations(["reward", "done", "obs"])))
def test_any_order_of_the_three_parts_completes_the_step(order):
    sync = started(stamp=100)
    results = [deliver(sync, part, stamp) for stamp, part in enumerate(order, start=101)]
    assert results[:2] == [None, None], "no transition before all three parts"
    transition = results[2]
    assert isinstance(transition, Transition)
    np.testing.assert_array_equal(transition.obs, OBS)
    np.testing.assert_array_equal(transition.action, ACTION)
    np.testing.assert_array_equal(transition.reward, REWARD)
    np.testing.assert_array_equal(transition.done, DONE)
    np.testing.assert_array_equal(transition.next_obs, NEXT_OBS)
    assert not sync.awaiting_step
    assert transition.next_obs_stamp == 101 + order.index("obs")
    assert counts(sync) == {"steps_completed": 1}


def test_steps_chain_the_next_observation_into_the_next_action():
    sync = started(stamp=100)
    sync.on_reward(REWARD, 101)
    sync.on_done(DONE, 102)
    first = sync.on_observation(NEXT_OBS, 103)
    sync.action_sent(first.next_obs, ACTION, first.next_obs_stamp, 11.0)
    sync.on_observation(NEXT_OBS + 1.0, 104)
    sync.on_done(DONE, 105)
    second = sync.on_reward(REWARD, 106)
    np.testing.assert_array_equal(second.obs, NEXT_OBS)
    np.testing.assert_array_equal(second.next_obs, NEXT_OBS + 1.0)
    assert sync.counters["steps_completed"] == 2


def test_a_missing_reward_expires_at_the_deadline_and_is_counted():
    sync = started(stamp=100, now=10.0)
    assert sync.on_done(DONE, 101) is None
    assert sync.on_observation(NEXT_OBS, 102) is None
    assert not sync.expired(10.0 + TIMEOUT), "the deadline itself is still in time"
    assert sync.awaiting_step
    assert sync.expired(10.0 + TIMEOUT + 1e-3)
    assert not sync.awaiting_step
    assert counts(sync) == {"steps_dropped": 1}
    assert not sync.expired(100.0), "nothing outstanding: nothing to drop"
    # The late reward now answers no action: stale, never paired with a later step.
    assert sync.on_reward(REWARD, 103) is None
    assert sync.counters["stale_messages"] == 1
    # The next observation starts a fresh segment.
    start = sync.on_observation(NEXT_OBS, 104)
    assert isinstance(start, SegmentStart) and start.obs is NEXT_OBS


@pytest.mark.parametrize("part", ["reward", "done"])
def test_reward_or_done_without_an_action_is_stale(part):
    sync = StepSync(TIMEOUT)
    assert deliver(sync, part, 5) is None
    assert counts(sync) == {"stale_messages": 1}
    assert not sync.awaiting_step


@pytest.mark.parametrize("part", ["reward", "done"])
def test_reward_or_done_received_before_the_acted_on_observation_is_stale(part):
    sync = started(stamp=100)
    assert deliver(sync, part, 99) is None
    assert counts(sync) == {"stale_messages": 1}
    # The stale part did not fill the slot: the real one completes the step.
    for other in ("reward", "done", "obs"):
        result = deliver(sync, other, 101)
    assert isinstance(result, Transition)


def test_an_observation_older_than_the_acted_on_one_is_stale():
    sync = started(stamp=100)
    assert sync.on_observation(NEXT_OBS, 50) is None
    assert counts(sync) == {"stale_messages": 1}
    assert sync.awaiting_step


@pytest.mark.parametrize("part", ["reward", "done", "obs"])
def test_a_second_part_of_one_kind_is_a_duplicate(part):
    sync = started(stamp=100)
    assert deliver(sync, part, 101) is None
    assert deliver(sync, part, 102) is None
    assert counts(sync) == {"duplicate_messages": 1}
    others = [p for p in ("reward", "done", "obs") if p != part]
    assert deliver(sync, others[0], 103) is None
    transition = deliver(sync, others[1], 104)
    np.testing.assert_array_equal(transition.reward, REWARD)
    np.testing.assert_array_equal(transition.next_obs, NEXT_OBS)


def test_a_republished_first_observation_is_a_duplicate_not_the_next_one():
    sync = started(stamp=100)
    # An environment that has not seen the action yet re-publishes its first state.
    assert sync.on_observation(OBS.copy(), 150) is None
    assert counts(sync) == {"duplicate_messages": 1}
    sync.on_reward(REWARD, 151)
    sync.on_done(DONE, 152)
    transition = sync.on_observation(NEXT_OBS, 153)
    np.testing.assert_array_equal(transition.next_obs, NEXT_OBS)


def test_drop_forgets_the_outstanding_step_and_counts_it():
    sync = started(stamp=100)
    assert sync.drop()
    assert not sync.awaiting_step
    assert not sync.drop(), "nothing outstanding: nothing to drop"
    assert counts(sync) == {"steps_dropped": 1}


def test_reset_forgets_the_outstanding_step():
    sync = started(stamp=100)
    sync.on_reward(REWARD, 101)
    sync.reset()
    assert not sync.awaiting_step
    assert sync.on_done(DONE, 102) is None
    assert sync.counters["stale_messages"] == 1
    assert not sync.expired(1e9), "a reset step is not also counted as dropped"


def test_both_step_sources_drop_a_late_step_by_one_rule():
    """The topic contract's StepSync and a robot spec's RobotSteps once each carried a copy of
    expired/drop; both now take them from the vocabulary below the loop and the spec."""
    from unilab_ros.loop.steps import OneStepOutstanding
    from unilab_ros.robot.steps import RobotSteps

    assert StepSync.drop is RobotSteps.drop is OneStepOutstanding.drop
    assert StepSync.expired is OneStepOutstanding.expired
