"""TrainingLoop without ROS: the trainer's decisions from arrays and times, step by step.

Sizes are tiny (2 envs x obs 3 -> action 1, 4-step rollouts) so an update takes
milliseconds. The rclpy tests (test_trainer_node.py, test_trainer_controls.py) keep what
only the wiring shows: message checks, clocks and timers, the update's pause and drain,
services, parameters.
"""

from __future__ import annotations

import numpy as np
import pytest
from mlx.utils import tree_flatten

from unilab_ros.loop.action_safety import ActionSafetyConfig
from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.decisions import BeginUpdate, Finished, PublishAction, Save, StepDropped
from unilab_ros.loop.training_loop import Phase, TrainingLoop
from unilab_ros.loop.watchdog import WatchdogConfig
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

NUM_ENVS, OBS_DIM, ACTION_DIM, NUM_STEPS = 2, 3, 1, 4
SAFE = 0.25
"""The safe action: distinct from 0 so a test can tell it from a policy action."""
STEP_TIMEOUT, OBS_TIMEOUT = 1.0, 2.0
PARTS = ("reward", "done", "obs")


class Driver:
    """A loop and the environment's side of the protocol, with hand-kept clocks."""

    def __init__(
        self,
        safety: ActionSafetyConfig | None = None,
        action_scale: float = 1.0,
        **cfg,
    ) -> None:
        agent = PPOAgent(
            AgentConfig(NUM_ENVS, OBS_DIM, ACTION_DIM, NUM_STEPS),
            ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]),
            PPOConfig(num_learning_epochs=2, num_mini_batches=1),
            runtime_cfg=PPORuntimeConfig(enable_compile=False),
        )
        actions = ActionMapper(
            ActionConfig(action_scale=[action_scale], safe_action=[SAFE]), NUM_ENVS, ACTION_DIM
        )
        self.best = BestPolicy(min_episodes=1)
        self.loop = TrainingLoop(
            LoopConfig(step_timeout=STEP_TIMEOUT, **cfg),
            agent,
            actions,
            best=self.best,
            watchdog=WatchdogConfig(obs_timeout=OBS_TIMEOUT),
            safety=safety,
        )
        self.agent = agent
        self.rng = np.random.default_rng(0)
        self.stamp = 0
        self.now = 0.0

    def new_obs(self) -> np.ndarray:
        return self.rng.normal(size=(NUM_ENVS, OBS_DIM)).astype(np.float32)

    def deliver(self, part: str, value: np.ndarray):
        self.stamp += 1
        if part == "reward":
            return one(self.loop.on_reward(0, value, self.stamp, self.now))
        if part == "done":
            return one(self.loop.on_done(0, value, self.stamp, self.now))
        return one(self.loop.on_observation(0, value, self.stamp, self.now, self.now))

    def start(self, obs: np.ndarray | None = None) -> PublishAction:
        decision = self.deliver("obs", self.new_obs() if obs is None else obs)
        assert isinstance(decision, PublishAction)
        return decision

    def step(self, reward=None, done=None, next_obs=None, order=PARTS):
        """Deliver one step's parts in ``order``; the decision the last one brought."""
        values = {
            "reward": self.rng.normal(size=NUM_ENVS).astype(np.float32) if reward is None
            else np.asarray(reward, np.float32),
            "done": np.zeros(NUM_ENVS, np.uint8) if done is None else np.asarray(done, np.uint8),
            "obs": self.new_obs() if next_obs is None else next_obs,
        }
        for part in order[:-1]:
            assert self.deliver(part, values[part]) is None, f"{part} alone decided something"
        return self.deliver(order[-1], values[order[-1]])

    def update(self) -> Save | None:
        self.loop.update()
        return one(self.loop.after_update())


def one(decisions: list):
    """The one robot's decision: None for none, the decision for one, else all of them."""
    return decisions[0] if len(decisions) == 1 else decisions or None


def one_estop(driver: Driver, engaged: bool):
    return one(driver.loop.set_estop(engaged))


def is_safe(command: np.ndarray) -> bool:
    return bool(np.all(command == np.float32(SAFE)))


def test_every_order_of_the_parts_stores_the_step_the_action_answered():
    driver = Driver()
    first_obs = driver.new_obs()
    acted = [driver.start(first_obs)]
    observations, rewards = [first_obs], []
    for t, order in enumerate([PARTS, ("obs", "done", "reward"), ("done", "obs", "reward")]):
        reward, next_obs = driver.rng.normal(size=NUM_ENVS), driver.new_obs()
        decision = driver.step(reward=reward, next_obs=next_obs, order=order)
        assert isinstance(decision, PublishAction) and not is_safe(decision.command)
        assert driver.loop.stored_steps == t + 1
        acted.append(decision)
        observations.append(next_obs)
        rewards.append(reward)
    buffer = driver.agent.buffer
    for t in range(3):
        np.testing.assert_array_equal(buffer.observations[t], observations[t])
        np.testing.assert_allclose(np.clip(buffer.actions[t], -1, 1), acted[t].command, rtol=1e-6)
        np.testing.assert_allclose(buffer.rewards[t], rewards[t], rtol=1e-6)


def test_the_filling_step_begins_an_update_and_resume_acts_on_the_newest_observation():
    driver = Driver()
    driver.start()
    for _ in range(NUM_STEPS - 1):
        driver.step()
    last_obs = driver.new_obs()
    assert isinstance(driver.step(next_obs=last_obs), BeginUpdate)
    assert driver.loop.phase is Phase.UPDATING
    # What arrives during the update is counted and discarded, but remembered as newest.
    newest = driver.new_obs()
    assert driver.deliver("reward", np.zeros(NUM_ENVS, np.float32)) is None
    assert driver.deliver("obs", newest) is None
    assert driver.loop.counters["discarded_during_update"] == 2
    assert driver.update() is None, "no checkpoint due at iteration 1 of 50"
    assert driver.agent.iteration == 1 and driver.loop.stored_steps == 0
    decision = one(driver.loop.resume(driver.now, driver.now))
    assert isinstance(decision, PublishAction) and driver.loop.phase is Phase.COLLECTING
    driver.step()
    np.testing.assert_array_equal(driver.agent.buffer.observations[0], newest)


def test_the_update_bootstraps_from_the_filling_steps_next_observation(monkeypatch):
    driver = Driver()
    driver.start()
    for _ in range(NUM_STEPS - 1):
        driver.step()
    last_obs = driver.new_obs()
    driver.step(next_obs=last_obs)
    seen = []
    update = driver.agent.update
    monkeypatch.setattr(driver.agent, "update", lambda obs: seen.append(obs) or update(obs))
    driver.loop.update()
    np.testing.assert_array_equal(seen[0], last_obs)


def test_checkpoints_fall_due_at_the_interval_and_max_iterations_finishes():
    driver = Driver(checkpoint_interval=2, max_iterations=2)
    driver.start()
    saves = []
    for _ in range(2):
        for _ in range(NUM_STEPS - 1):
            driver.step()
        assert isinstance(driver.step(), BeginUpdate)
        saves.append(driver.update())
        decision = one(driver.loop.resume(driver.now, driver.now))
    assert saves == [None, Save("interval")]
    assert isinstance(decision, Finished) and driver.loop.phase is Phase.FINISHED
    assert driver.deliver("obs", driver.new_obs()) is None, "a finished loop no longer acts"


def test_the_best_policy_is_offered_after_each_update():
    driver = Driver()
    driver.start()
    for _ in range(NUM_STEPS - 1):
        driver.step(reward=np.ones(NUM_ENVS), done=np.ones(NUM_ENVS))
    driver.step()
    driver.update()
    assert driver.best.iteration == 1 and driver.best.mean_return == pytest.approx(1.0)


def test_a_late_step_is_dropped_the_segment_cut_and_the_newest_observation_acted_on():
    driver = Driver()
    driver.start()
    driver.step()
    acted_at = driver.now
    driver.deliver("done", np.zeros(NUM_ENVS, np.uint8))
    newest = driver.new_obs()
    driver.deliver("obs", newest)
    driver.now = acted_at + STEP_TIMEOUT
    assert driver.loop.check_step_deadlines(driver.now) == [], "the deadline is in time"
    driver.now += 0.01
    dropped, then = driver.loop.check_step_deadlines(driver.now)
    assert dropped == StepDropped(0) and isinstance(then, PublishAction)
    assert driver.loop.step_counters["steps_dropped"] == 1
    assert driver.loop.stored_steps == 1, "the incomplete step is not stored"
    assert driver.agent.buffer.dones[0].tolist() == [2, 2], "cut: bootstrapped as a time-out"
    driver.step()
    np.testing.assert_array_equal(driver.agent.buffer.observations[1], newest)


def test_a_late_step_with_no_newer_observation_acts_on_nothing():
    driver = Driver()
    driver.start()
    driver.now += STEP_TIMEOUT + 0.01
    assert driver.loop.check_step_deadlines(driver.now) == [StepDropped(0)]


def test_the_watchdog_trips_once_per_silence_drops_the_step_and_cuts_the_segment():
    driver = Driver()
    assert one(driver.loop.check_watchdogs(100.0)) is None, "no observation yet: nothing to miss"
    driver.start()
    driver.step()
    assert one(driver.loop.check_watchdogs(driver.now + OBS_TIMEOUT)) is None
    first = one(driver.loop.check_watchdogs(driver.now + OBS_TIMEOUT + 0.01))
    again = one(driver.loop.check_watchdogs(driver.now + OBS_TIMEOUT + 0.2))
    assert first.first and first.publish_safe and not again.first and again.publish_safe
    assert driver.loop.counters["watchdog_trips"] == 1
    assert driver.loop.step_counters["steps_dropped"] == 1
    assert driver.agent.buffer.dones[0].tolist() == [2, 2]
    # The next observation starts a new segment; a later silence is a new trip.
    assert isinstance(driver.deliver("obs", driver.new_obs()), PublishAction)
    assert one(driver.loop.check_watchdogs(driver.now + OBS_TIMEOUT + 0.01)).first


def test_the_watchdog_without_the_safe_action_only_reports():
    driver = Driver()
    driver.loop.robots[0].watchdog.cfg.watchdog_safe_action = False
    driver.start()
    silence = one(driver.loop.check_watchdogs(OBS_TIMEOUT + 1.0))
    assert silence.first and not silence.publish_safe


def test_a_non_finite_model_sends_the_safe_action_and_restores_the_last_good_one():
    driver = Driver()
    driver.start()
    driver.step()
    good = {k: np.array(v) for k, v in tree_flatten(driver.agent.model.parameters())}
    layer = driver.agent.model.actor.layers[0]
    layer.weight = layer.weight * float("nan")
    decision = driver.step()
    assert decision.nonfinite and decision.restored and is_safe(decision.command)
    assert driver.loop.counters["nonfinite_actions"] == 1
    restored = dict(tree_flatten(driver.agent.model.parameters()))
    assert all(np.array_equal(np.array(restored[k]), good[k]) for k in good)
    # The step the safe action answered is not learned from; the next ones are.
    stored = driver.loop.stored_steps
    decision = driver.step()
    assert not decision.nonfinite and np.isfinite(decision.command).all()
    assert driver.loop.stored_steps == stored
    driver.step()
    assert driver.loop.stored_steps == stored + 1


def test_training_off_acts_without_storing():
    driver = Driver()
    driver.start()
    driver.step()
    driver.loop.set_training(False)
    assert driver.agent.buffer.dones[0].tolist() == [2, 2], "switching off cuts the segment"
    for _ in range(NUM_STEPS + 1):
        assert isinstance(driver.step(), PublishAction)
    assert driver.loop.stored_steps == 1 and driver.agent.iteration == 0
    driver.loop.set_training(True)
    driver.step()
    assert driver.loop.stored_steps == 2


def test_deterministic_mode_gives_the_mean_action_and_stores_nothing():
    driver = Driver()
    driver.start()
    x, y = driver.new_obs(), driver.new_obs()
    sampled = [driver.step(next_obs=x), driver.step(next_obs=y), driver.step(next_obs=x)]
    assert not np.array_equal(sampled[0].command, sampled[2].command), "samples differ"
    stored = driver.loop.stored_steps
    driver.loop.set_deterministic(True)
    # The action outstanding was sampled: its step completes, then the mean actions begin.
    driver.step(next_obs=y)
    first, _, second = (driver.step(next_obs=obs) for obs in (x, y, x))
    np.testing.assert_array_equal(first.command, second.command)
    expected = driver.loop.actions(driver.agent.act(x, deterministic=True))
    np.testing.assert_allclose(first.command, expected, rtol=1e-6)
    assert driver.loop.stored_steps == stored


def test_a_new_learning_rate_reaches_the_optimizer():
    driver = Driver()
    driver.agent.set_learning_rate(1e-4)
    assert driver.agent.trainer.learning_rate == pytest.approx(1e-4)


def test_episode_end_waits_for_every_env_to_end_then_updates():
    driver = Driver(update_trigger="episode_end")
    driver.start()
    for _ in range(NUM_STEPS):
        assert isinstance(driver.step(), PublishAction)
    assert driver.loop.phase is Phase.EPISODE_END
    assert driver.loop.stored_steps == NUM_STEPS
    # Acting goes on without storing; env 1 ending alone is not enough.
    assert isinstance(driver.step(done=[0, 1]), PublishAction)
    assert isinstance(driver.step(done=[0, 0]), PublishAction)
    assert isinstance(driver.step(done=[2, 0]), BeginUpdate)
    driver.update()
    assert driver.agent.iteration == 1


def test_episode_end_counts_an_episode_that_ends_on_the_filling_step():
    driver = Driver(update_trigger="episode_end")
    driver.start()
    for _ in range(NUM_STEPS - 1):
        driver.step()
    assert isinstance(driver.step(done=[1, 0]), PublishAction)
    assert isinstance(driver.step(done=[0, 2]), BeginUpdate)


def test_episode_end_updates_at_its_timeout_even_if_an_episode_runs_on():
    driver = Driver(update_trigger="episode_end", episode_end_timeout=5.0)
    driver.start()
    for _ in range(NUM_STEPS):
        driver.step()
    driver.now += 5.0
    assert isinstance(driver.step(), PublishAction), "the deadline itself is still in time"
    driver.now += 0.01
    assert isinstance(driver.step(), BeginUpdate)


@pytest.mark.parametrize(
    ("field", "value"),
    [("update_trigger", "never"), ("step_timeout", 0.0), ("max_iterations", -1)],
)
def test_bad_loop_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        LoopConfig(**{field: value}).validate()


# Hardware safety: the ActionGuard after the mapping, and the e-stop.


def gaussian_log_prob(actions: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    z = (actions.astype(np.float64) - mean) / std
    return np.sum(-0.5 * z * z - np.log(std) - 0.5 * np.log(2.0 * np.pi), axis=-1)


def test_guarded_actions_are_stored_as_sent_with_the_acting_policys_log_prob():
    # Blend-in from the safe action, then a tight rate limit: every command differs from
    # the policy's mapped action, and PPO must learn from what the robot received.
    safety = ActionSafetyConfig(max_action_change=[0.05], blend_in_steps=2)
    driver = Driver(safety=safety, action_scale=2.0)
    sent = [driver.start().command]
    for _ in range(NUM_STEPS - 1):
        sent.append(driver.step().command)
    buffer = driver.agent.buffer
    assert driver.loop.stored_steps == NUM_STEPS - 1
    assert driver.loop.counters["guarded_actions"] == NUM_STEPS
    # The first command is within 0.05 of the safe action, each next one within 0.05.
    assert np.all(np.abs(np.diff(np.stack([np.full_like(sent[0], SAFE), *sent]), axis=0))
                  <= 0.05 + 1e-6)
    for t in range(NUM_STEPS - 1):
        np.testing.assert_allclose(buffer.actions[t] * 2.0, sent[t], rtol=1e-6)
        np.testing.assert_allclose(
            buffer.log_probs[t],
            gaussian_log_prob(buffer.actions[t], buffer.mean[t], buffer.std[t]),
            rtol=1e-5,
        )
        # The policy's mean, not the sent action, is what the acting policy computed.
        assert not np.allclose(buffer.mean[t], buffer.actions[t])


def test_with_the_guard_off_the_policys_own_actions_are_stored():
    driver = Driver(action_scale=2.0)
    first = driver.start()
    driver.step()
    assert driver.loop.counters["guarded_actions"] == 0
    np.testing.assert_allclose(
        np.clip(driver.agent.buffer.actions[0] * 2.0, -1.0, 1.0), first.command, rtol=1e-6
    )


def test_the_estop_sends_the_safe_action_cuts_the_rollout_and_learns_nothing_until_released():
    driver = Driver(safety=ActionSafetyConfig(blend_in_steps=4))
    driver.start()
    for _ in range(4):
        driver.step()  # blended in and free after 4 steps; the 4-step rollout updates
    assert driver.loop.phase is Phase.UPDATING
    driver.update()
    one(driver.loop.resume(driver.now, driver.now))
    driver.step(reward=[1.0, 1.0])
    assert driver.loop.stored_steps == 1
    episodes = driver.loop.stats.episodes
    engaged = one_estop(driver, True)
    assert isinstance(engaged, PublishAction) and engaged.estop and is_safe(engaged.command)
    # The stored step became a time-out: no return runs across the stop.
    assert driver.agent.buffer.dones[0].tolist() == [2, 2]
    assert driver.loop.counters["estops"] == 1
    # Engaged, every observation gets the safe action, and nothing is stored or logged.
    decision = driver.deliver("obs", driver.new_obs())
    assert decision.estop and is_safe(decision.command)
    for _ in range(3):
        decision = driver.step(done=[1, 1])
        assert decision.estop and is_safe(decision.command)
    assert driver.loop.stored_steps == 1
    assert driver.loop.stats.episodes == episodes
    assert one_estop(driver, False) is None
    # The step of the last safe action completes; the policy then blends back in.
    released = driver.step()
    assert not released.estop and not is_safe(released.command)
    assert driver.loop.robots[0].guard.blending  # 1 of the 4 blend-in steps taken
    assert driver.loop.stored_steps == 1  # the safe action's step is not learned from
    driver.step()
    assert driver.loop.stored_steps == 2
    np.testing.assert_allclose(driver.agent.buffer.actions[1], released.command, rtol=1e-6)


def test_an_estop_during_the_update_holds_the_safe_action_after_it():
    driver = Driver()
    driver.start()
    for _ in range(NUM_STEPS - 1):
        driver.step()
    assert isinstance(driver.step(), BeginUpdate)
    assert is_safe(one_estop(driver, True).command)
    driver.update()
    assert driver.loop.stored_steps == 0 and driver.agent.iteration == 1
    decision = one(driver.loop.resume(driver.now, driver.now))
    assert decision.estop and is_safe(decision.command)


def test_a_clock_that_jumps_back_drops_a_lost_step_within_step_timeout():
    driver = Driver()
    driver.now = 50.0
    driver.start()  # its answer is lost; then sim time restarts 20 s earlier
    driver.now = 30.0
    assert driver.loop.check_step_deadlines(driver.now) == []
    driver.now += STEP_TIMEOUT + 0.01
    # Measured on the old time line the deadline would be 20 s away.
    assert driver.loop.check_step_deadlines(driver.now) == [StepDropped(0)]


def test_copies_of_the_latest_observation_do_not_keep_the_watchdog_quiet():
    driver = Driver()
    obs = driver.new_obs()
    driver.start(obs)
    loop, now = driver.loop, driver.now  # the action is lost and the sim clock stops
    copies = [one(loop.on_observation(0, obs, driver.stamp + k, now, 0.2 * k))
              for k in range(1, 6)]
    assert copies == [None] * 5, "a re-published copy is not the step's next observation"
    silence = one(loop.check_watchdogs(OBS_TIMEOUT + 0.01))
    assert silence is not None and silence.first and silence.publish_safe
    assert loop.step_counters["steps_dropped"] == 1
    # The next copy starts a new segment: acting on it ends the silence.
    acted = one(loop.on_observation(0, obs, driver.stamp + 6, now, OBS_TIMEOUT + 0.1))
    assert isinstance(acted, PublishAction)
    assert one(loop.check_watchdogs(OBS_TIMEOUT + 0.2)) is None
