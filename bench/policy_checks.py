"""What a trained policy does when it is no longer trained (``learning.py``'s extra checks).

``evaluate``: the deterministic policy (the action mean, as a deployment acts) over fresh
episodes, as rl-zoo reports its results.

``frozen_spread``: how far a rolling mean of 100 episode returns moves when the policy does
not change at all. The final policy keeps acting as in training (sampled actions), with no
update, over a stream of episodes; the rolling mean over that stream still wanders,
because episodes start from random states (Pendulum's swing-up from hanging costs more
than a start near the top) and actions are sampled. That range is the noise floor of the
late-drop figure (best - final) / |best|: a run whose best and final rolling means lie
within it lost nothing a fixed policy would not.
"""

from __future__ import annotations

import numpy as np

EVAL_EPISODES = 10
"""Episodes (one per fresh env) in each evaluation of the deterministic policy."""
EVAL_SEED = 10_000
"""Evaluation envs are seeded from here (+1000 per training seed), apart from training's."""
FROZEN_EPISODES = 400
"""Episodes in a frozen-policy stream: 301 rolling means of 100."""
FROZEN_MAX_STEPS = 200_000
"""...or fewer episodes, when long ones would take more env steps than this."""
WINDOW = 100
"""The trainer's rolling mean covers this many episodes."""


def evaluate(agent, setup, seed: int, episodes: int = EVAL_EPISODES) -> float:
    """Mean return of the deterministic policy over one episode in each of ``episodes``
    fresh envs, seeded apart from training's."""
    returns = _episode_returns(agent, setup, EVAL_SEED + 1000 * seed, episodes, episodes,
                               deterministic=True, max_steps=None)
    return float(np.mean(returns))


def frozen_spread(agent, setup, seed: int) -> dict[str, float]:
    """Rolling means of 100 returns over a stream of the final policy's episodes, acting as
    in training (``num_envs`` envs, sampled actions, no update): their min, max and mean,
    and the largest drop from a best window to a later one, relative to that best (the
    late-drop figure of a policy that did not change)."""
    returns = _episode_returns(agent, setup, EVAL_SEED + 1000 * seed + 500,
                               setup.agent.num_envs, FROZEN_EPISODES, deterministic=False,
                               max_steps=FROZEN_MAX_STEPS)
    if len(returns) < WINDOW:
        return {"episodes": float(len(returns)), "min": np.nan, "max": np.nan,
                "mean": np.nan, "drop": np.nan}
    rolling = np.convolve(returns, np.ones(WINDOW) / WINDOW, mode="valid")
    best_so_far = np.maximum.accumulate(rolling)
    drops = (best_so_far - rolling) / np.maximum(np.abs(best_so_far), 1e-9)
    return {"episodes": float(len(returns)), "min": float(rolling.min()),
            "max": float(rolling.max()), "mean": float(np.mean(returns)),
            "drop": float(drops.max())}


def _episode_returns(agent, setup, env_seed: int, num_envs: int, episodes: int,
                     deterministic: bool, max_steps: int | None) -> np.ndarray:
    """Returns of the first ``episodes`` episodes to end, in the order they ended (each env
    starts a new one after a done); fewer when ``max_steps`` env steps come first. Each
    env counts its first episode only when ``deterministic`` (one fresh episode each)."""
    from unilab_ros.rl.actions import ActionMapper
    from unilab_ros.rl.policy import PolicySampler
    from unilab_ros.sims.gym_vector import GymVectorSim

    sim = GymVectorSim(setup.env_id, num_envs, env_seed, setup.max_episode_steps)
    try:
        # Its own sampler: this must not touch the training's noise stream.
        policy = PolicySampler(agent.model, env_seed)
        to_env = ActionMapper(setup.actions, num_envs, setup.agent.action_dim)
        finished: list[float] = []
        counted = np.zeros(num_envs, bool)
        running = np.zeros(num_envs)
        obs, steps = sim.reset(), 0
        while len(finished) < episodes and (max_steps is None or steps < max_steps):
            step = sim.step(to_env(policy(obs, deterministic=deterministic)))
            steps += num_envs
            running += step.reward
            for env in np.flatnonzero(step.done != 0):
                if not (deterministic and counted[env]):
                    finished.append(float(running[env]))
                counted[env] = True
                running[env] = 0.0
            obs = step.observation
        return np.asarray(finished[:episodes])
    finally:
        sim.close()
