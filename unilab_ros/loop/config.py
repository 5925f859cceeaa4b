"""When the trainer stores, updates and stops (ROS-free; declared as node parameters)."""

from __future__ import annotations

from dataclasses import dataclass

UPDATE_TRIGGERS = ("rollout_full", "episode_end")


@dataclass
class LoopConfig:
    """When the trainer stores, updates and stops."""

    step_timeout: float = 1.0
    """Seconds (node clock: sim time under use_sim_time) for reward, done and next
    observation to follow an action; a late step is dropped and cuts the segment."""
    update_trigger: str = "rollout_full"
    """rollout_full: update as soon as the rollout is full; episode_end: then keep
    acting without storing until every env's episode ends, and update while it resets."""
    episode_end_timeout: float = 30.0
    """Seconds (node clock) episode_end waits for the episodes to end before updating."""
    checkpoint_interval: int = 50
    """Save a checkpoint every this many iterations (and always on shutdown); 0: only then."""
    max_iterations: int = 0
    """Stop (and save) after this many iterations in total; 0 trains until stopped."""
    training: bool = True
    """Learn from the steps (else only act); see the ~/set_training service."""
    deterministic: bool = False
    """Act with the mean action (no learning from those steps); see ~/set_deterministic."""
    learn_while_acting: bool = False
    """The learner runs on a thread of its own beside the control loop, which never waits
    for it (no pause, no safe action held). The off-policy learner (algorithm: sac) steps
    on its own and every num_steps env steps per env only close an iteration (metrics,
    checkpoints, the best policy); PPO updates on rollout k while rollout k+1 is
    collected, acting meanwhile with the policy the update started from."""
    learner_process: bool = False
    """With learn_while_acting and algorithm sac: the learner runs in a process of its own at
    the lowest CPU priority (``rl.learner_process``) instead of a thread of the trainer."""

    def validate(self) -> None:
        if self.step_timeout <= 0.0 or self.episode_end_timeout <= 0.0:
            raise ValueError("step_timeout and episode_end_timeout must be positive")
        if self.update_trigger not in UPDATE_TRIGGERS:
            raise ValueError(f"update_trigger must be one of {UPDATE_TRIGGERS}")
        if self.learn_while_acting and self.update_trigger != "rollout_full":
            raise ValueError("learn_while_acting never waits for an episode's end "
                             "(update_trigger: rollout_full)")
        if self.learner_process and not self.learn_while_acting:
            raise ValueError("learner_process is where the learner runs beside acting: it "
                             "needs learn_while_acting: true")
        if self.checkpoint_interval < 0 or self.max_iterations < 0:
            raise ValueError("checkpoint_interval and max_iterations must be >= 0")
