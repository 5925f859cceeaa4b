"""The replay buffer keeps done codes' meaning, never samples a transition whose next state
has not arrived, stays bounded, and survives a save and load."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.rl.replay import ReplayBuffer

RUN, FAIL, CUT = DoneCode.RUNNING, DoneCode.TERMINATED, DoneCode.TRUNCATED


def step(buffer: ReplayBuffer, t: float, dones) -> None:
    """Two envs; env e's observation at step t is [t, e], its action t, its reward 10 t."""
    n = len(dones)
    obs = np.array([[t, e] for e in range(n)], np.float32)
    buffer.add(obs, np.full((n, 1), t), np.full(n, 10 * t), np.array(dones, np.uint8))


def rows(buffer: ReplayBuffer) -> dict[tuple[float, float], tuple]:
    """(obs) -> (next_obs, terminal, ready) of every stored row."""
    return {tuple(buffer.obs[i]): (tuple(buffer.next_obs[i]), buffer.terminal[i],
                                   bool(buffer.ready[i])) for i in range(buffer.size)}


def test_a_running_step_waits_for_its_next_state_and_done_codes_keep_their_meaning():
    buffer = ReplayBuffer(16, 2, 2, 1)
    step(buffer, 0, [RUN, RUN])
    assert buffer.sampleable == 0  # both wait for step 1's observations
    step(buffer, 1, [FAIL, CUT])
    stored = rows(buffer)
    assert stored[(0, 0)] == ((1, 0), 0.0, True) and stored[(0, 1)] == ((1, 1), 0.0, True)
    # A failure never bootstraps; a time-out bootstraps from the state its step began in.
    assert stored[(1, 0)] == ((1, 0), 1.0, True)
    assert stored[(1, 1)] == ((1, 1), 0.0, True)
    step(buffer, 2, [RUN, RUN])
    # The first observation of the next episode is nobody's next state.
    assert rows(buffer)[(2, 0)][2] is False and buffer.sampleable == 4


def test_sampling_never_returns_a_pending_transition():
    buffer = ReplayBuffer(8, 2, 2, 1)
    step(buffer, 0, [RUN, RUN])
    step(buffer, 1, [RUN, RUN])
    batch = buffer.sample(500, np.random.default_rng(0))
    assert set(batch.obs[:, 0].tolist()) == {0.0}
    np.testing.assert_array_equal(batch.next_obs[:, 0], 1.0)
    np.testing.assert_array_equal(batch.rewards, 0.0)


def test_a_cut_ends_the_pending_steps_as_time_outs():
    buffer = ReplayBuffer(8, 2, 2, 1)
    step(buffer, 0, [RUN, RUN])
    buffer.cut(np.array([1]))
    stored = rows(buffer)
    assert stored[(0, 1)] == ((0, 1), 0.0, True) and stored[(0, 0)][2] is False
    step(buffer, 5, [RUN, RUN])
    # env 1's next observation does not complete the transition the cut ended.
    assert rows(buffer)[(0, 1)][0] == (0, 1) and rows(buffer)[(0, 0)][0] == (5, 0)


def test_the_buffer_is_bounded_and_an_overwritten_pending_row_is_forgotten():
    buffer = ReplayBuffer(4, 2, 2, 1)
    for t in range(5):
        step(buffer, t, [RUN, RUN])
    assert buffer.size == 4 and buffer.added == 10
    assert sorted({o[0] for o in rows(buffer)}) == [3.0, 4.0]
    one = ReplayBuffer(2, 1, 2, 1)
    one.add(np.zeros((1, 2)), np.zeros((1, 1)), [0.0], [RUN])
    one.add(np.ones((1, 2)), np.zeros((1, 1)), [0.0], [RUN])
    one.add(np.full((1, 2), 2.0), np.zeros((1, 1)), [0.0], [RUN])  # overwrites row 0
    one.add(np.full((1, 2), 3.0), np.zeros((1, 1)), [0.0], [RUN])
    np.testing.assert_array_equal(one.next_obs[0], [3.0, 3.0])  # row 0 holds obs 2 now
    np.testing.assert_array_equal(one.obs[0], [2.0, 2.0])


def test_a_saved_buffer_loads_oldest_first_with_pending_rows_cut():
    buffer = ReplayBuffer(4, 2, 2, 1)
    for t in range(3):
        step(buffer, t, [RUN, RUN])
    state = buffer.state_dict()
    np.testing.assert_array_equal(state["obs"][:, 0], [1, 1, 2, 2])
    restored = ReplayBuffer(8, 2, 2, 1)
    restored.load_state_dict(state)
    assert restored.size == 4 and restored.sampleable == 4 and restored.added == 6
    # The pending step 2 rows were cut: they bootstrap from their own state.
    np.testing.assert_array_equal(restored.next_obs[2:4, 0], [2, 2])
    small = ReplayBuffer(2, 2, 2, 1)
    small.load_state_dict(state)
    np.testing.assert_array_equal(small.obs[:, 0], [2, 2])
    with pytest.raises(ValueError, match="obs_dim"):
        ReplayBuffer(4, 2, 3, 1).load_state_dict(state)


def test_a_caller_that_pairs_steps_completes_running_transitions_at_once():
    buffer = ReplayBuffer(8, 2, 2, 1)
    obs = np.array([[0, 0], [0, 1]], np.float32)
    after = np.array([[9, 0], [7, 7]], np.float32)
    buffer.add(obs, np.zeros((2, 1)), np.zeros(2), np.array([RUN, FAIL], np.uint8),
               next_obs=after)
    assert buffer.sampleable == 2 and (buffer.pending == -1).all()
    stored = rows(buffer)
    # The failed env's next observation (its new episode's first) is not its next state.
    assert stored[(0, 0)] == ((9, 0), 0.0, True) and stored[(0, 1)] == ((0, 1), 1.0, True)


def test_a_pickled_buffer_carries_its_written_rows_only_and_continues_identically():
    buffer = ReplayBuffer(10_000, 2, 3, 1)
    rng = np.random.default_rng(0)
    for t in range(30):
        buffer.add(rng.standard_normal((2, 3)), rng.uniform(-1, 1, (2, 1)), np.ones(2),
                   np.array([DoneCode.RUNNING, DoneCode.TERMINATED if t % 7 == 6 else 0]))
    data = pickle.dumps(buffer)
    assert len(data) < 10_000  # 60 rows, not the capacity's 10,000
    copy = pickle.loads(data)
    assert copy.obs.shape == buffer.obs.shape and copy.size == buffer.size == 60
    obs = np.ones((2, 3), np.float32)
    for b in (buffer, copy):
        b.add(obs, np.zeros((2, 1)), np.zeros(2), np.zeros(2, np.uint8))
    for name in ("obs", "actions", "rewards", "next_obs", "terminal", "ready", "pending"):
        np.testing.assert_array_equal(getattr(copy, name), getattr(buffer, name), err_msg=name)
    assert copy.sample(8, np.random.default_rng(1)).obs.tolist() == \
        buffer.sample(8, np.random.default_rng(1)).obs.tolist()
