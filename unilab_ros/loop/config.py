"""When the trainer stores, updates and stops (ROS-free; declared as node parameters)."""

from __future__ import annotations

import os
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
    learner_cpu: int = -1
    """With learner_process: the learner runs on this CPU only, the trainer's threads on
    the others (pin the robot's driver there too, e.g. with taskset); -1: anywhere. On 2
    cores this took the learner's cost to the command period's p99 jitter from 1.8-2.5 ms
    to 0.2-0.7 ms (bench/robot_off_policy.py)."""

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
        if self.learner_cpu >= 0:
            if not self.learner_process:
                raise ValueError("learner_cpu pins the learner process: it needs "
                                 "learner_process: true")
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
            if self.learner_cpu not in cpus or len(cpus) < 2:
                raise ValueError(f"learner_cpu {self.learner_cpu} is not one of this "
                                 f"process's CPUs {sorted(cpus)} that leaves the trainer "
                                 "another (Linux only)")
        if self.checkpoint_interval < 0 or self.max_iterations < 0:
            raise ValueError("checkpoint_interval and max_iterations must be >= 0")
