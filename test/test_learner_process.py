"""The off-policy learner in a process of its own (``learner_process: true``): it continues
the agent's learning exactly (same replay, random streams and networks), sends actors back
while the loop acts on, hands its state over for checkpoints, reports a failure, and ends
with a trainer that is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection

import numpy as np
import pytest
from loop_harness import run_paced
from mlx.utils import tree_flatten

from unilab_ros.config.paths import config_file
from unilab_ros.config.training_setup import load_setup
from unilab_ros.loop.config import LoopConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.algorithm import restore, save_training
from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.rl.learner_process import LearnerProcess
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_config import SACConfig
from unilab_ros.sims.gym_vector import GymVectorSim
from unilab_ros.trainer.session import SessionConfig, build_session

SMALL = SACConfig(actor_hidden_dims=[32], critic_hidden_dims=[32], batch_size=32,
                  learning_starts=64)
CFG = AgentConfig(num_envs=2, obs_dim=3, action_dim=1, seed=4)


def _fill(agent: SACAgent, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for t in range(steps):
        obs = rng.standard_normal((2, 3)).astype(np.float32) * 3.0 + 1.0
        dones = np.array([DoneCode.TERMINATED if t % 17 == 16 else DoneCode.RUNNING,
                          DoneCode.TRUNCATED if t % 23 == 22 else DoneCode.RUNNING], np.uint8)
        agent.record(obs, agent.act(obs), rng.standard_normal(2), dones)


def _wait(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not there in time"
        time.sleep(0.01)


def _wait_for_steps(learner: LearnerProcess, steps: int) -> None:
    """Until the actor the agent acts with is that of gradient step ``steps``."""

    def there() -> bool:
        learner.receive()
        assert learner.error is None
        return learner.agent.actor_steps >= steps

    _wait(there)


def _parameters(agent: SACAgent) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in tree_flatten(agent.model.parameters())}


def test_the_process_continues_the_agents_learning_exactly():
    cfg = replace(SMALL, utd_ratio=0.5)
    here, there = SACAgent(CFG, cfg), SACAgent(CFG, cfg)
    _fill(here, 150)
    _fill(there, 150)
    owed = int(here.updates_owed)
    assert owed > 10
    here.learn()
    learner = LearnerProcess(there).start()
    try:
        _wait_for_steps(learner, owed)
        learner.sync()
    finally:
        learner.stop()
    assert there.remote is None and not learner.running
    assert there.learner.steps == here.learner.steps == owed
    mine, theirs = _parameters(here), _parameters(there)
    assert mine.keys() == theirs.keys()
    for name, value in mine.items():
        np.testing.assert_array_equal(theirs[name], value, err_msg=name)
    obs = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(there.act(obs, deterministic=True),
                                  here.act(obs, deterministic=True))


def test_steps_recorded_while_it_learns_reach_its_replay_and_a_checkpoint_holds_its_state(
        tmp_path):
    agent = SACAgent(CFG, replace(SMALL, learning_starts=0))
    _fill(agent, 40)
    learner = LearnerProcess(agent).start()
    try:
        _fill(agent, 200, seed=1)
        agent.cut(np.array([0]))
        _wait_for_steps(learner, 480)
        metrics = learner.take()
        assert metrics["gradient_steps"] > 0 and metrics["utd_achieved"] > 0
        assert np.isfinite(metrics["critic_loss"]) and metrics["policy_lag"] >= 1
        path = save_training(tmp_path / "latest", agent)
    finally:
        learner.stop()
    # Every owed step was run by the process and handed over with its state.
    assert agent.learner.steps == 480 and agent.updates_owed < 1.0
    copy = SACAgent(CFG, replace(SMALL, learning_starts=0))
    restore(copy, Checkpoint(path))
    assert copy.learner.steps == 480 and copy.replay.size == agent.replay.size == 480
    np.testing.assert_array_equal(copy.replay.obs[:480], agent.replay.obs[:480])


def test_the_loop_learns_beside_acting_with_the_process_and_never_pauses(monkeypatch):
    # The control thread never reads the pipe (an actor is ~0.4 ms to read): a receiver
    # thread does, and acting takes what arrived.
    readers: set[str] = set()
    recv = Connection.recv

    def noting_the_reader(connection: Connection):
        readers.add(threading.current_thread().name)
        return recv(connection)

    monkeypatch.setattr(Connection, "recv", noting_the_reader)
    setup = load_setup(config_file("pendulum_sac.yaml"))
    cfg = SessionConfig(setup.agent, actions=setup.actions, algorithm="sac", sac=SMALL,
                        loop=LoopConfig(checkpoint_interval=0, learn_while_acting=True,
                                        learner_process=True, max_iterations=12))
    session = build_session(cfg)
    loop, agent = session.loop, session.loop.agent
    assert isinstance(loop.learner, LearnerProcess) and agent.remote is loop.learner
    sim = GymVectorSim(setup.env_id, setup.agent.num_envs, 0, 0)
    before = _parameters(agent)
    learner = loop.learner

    def first_step_taken() -> bool:
        # The robot waits (bounded) for the process's first, compiling step only; acting
        # takes its actors, so the gate looks for one itself.
        learner.receive()
        return agent.env_steps < 2 * SMALL.learning_starts or agent.actor_steps > 0

    try:
        reports, paused = run_paced(loop, sim, 120.0, 0.005, gate=first_step_taken)
    finally:
        loop.close()
        sim.close()
    assert paused == 0 and len(reports) == 12
    assert not learner.running and agent.remote is None
    assert readers == {"sac-learner-receiver"}
    learned = [m for m in reports if m["gradient_steps"] > 0]
    assert learned, reports
    assert all(m["utd_achieved"] > 0 and np.isfinite(m["critic_loss"]) for m in learned)
    # Closing handed the process's networks over: the agent's own changed.
    after = _parameters(agent)
    assert agent.learner.steps >= sum(m["gradient_steps"] for m in reports)
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_a_failing_learner_process_is_reported_not_silent():
    agent = SACAgent(CFG, replace(SMALL, learning_starts=0))
    learner = LearnerProcess(agent).start()
    try:
        learner.send_step(np.zeros((2, 5), np.float32), np.zeros((2, 1), np.float32),
                          np.zeros(2), np.zeros(2, np.uint8), None, None)
        deadline = time.monotonic() + 60.0
        with pytest.raises(RuntimeError, match="reshape"):
            while time.monotonic() < deadline:
                learner.take()
                time.sleep(0.02)
    finally:
        learner.stop()
    assert not learner.running


CHILD = """
import sys, time
import numpy as np
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.learner_process import LearnerProcess
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_config import SACConfig
agent = SACAgent(AgentConfig(num_envs=1, obs_dim=3, action_dim=1),
                 SACConfig(actor_hidden_dims=[8], critic_hidden_dims=[8], batch_size=8))
learner = LearnerProcess(agent).start()
print(learner._process.pid, flush=True)
time.sleep(120)
"""


def test_a_killed_trainer_takes_its_learner_process_with_it():
    trainer = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                               text=True)
    try:
        pid = int(trainer.stdout.readline())
        os.kill(pid, 0)  # running
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            # Exited but not yet reaped by init shows as a zombie.
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().split(")")[-1].split()[0] == "Z"

        _wait(gone, 20.0)
    finally:
        trainer.kill()
        trainer.wait(10)


def test_every_thread_of_the_learner_process_runs_at_the_lowest_priority():
    agent = SACAgent(CFG, replace(SMALL, learning_starts=0))
    learner = LearnerProcess(agent).start()
    try:
        _fill(agent, 40)
        _wait_for_steps(learner, 40)
        pid = learner._process.pid
        threads = os.listdir(f"/proc/{pid}/task")
        assert threads and all(os.getpriority(os.PRIO_PROCESS, int(t)) == 19 for t in threads)
        assert all(os.sched_getscheduler(int(t)) == os.SCHED_IDLE for t in threads)
        # A terminal's Ctrl-C reaches the process group: the trainer ends it, with its state.
        os.kill(pid, signal.SIGINT)
        _fill(agent, 20)
        _wait_for_steps(learner, 80)
        assert learner.running
    finally:
        learner.stop()
    assert learner.error is None and agent.learner.steps >= 80


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin apart")
def test_with_learner_cpu_the_learner_and_the_trainer_run_on_cpus_apart():
    cpus = os.sched_getaffinity(0)
    cpu = max(cpus)
    agent = SACAgent(CFG, replace(SMALL, learning_starts=0))
    learner = LearnerProcess(agent, cpu=cpu).start()
    try:
        _fill(agent, 40)
        _wait_for_steps(learner, 40)
        learners = os.listdir(f"/proc/{learner._process.pid}/task")
        assert learners and all(os.sched_getaffinity(int(t)) == {cpu} for t in learners)
        trainers = os.listdir("/proc/self/task")
        assert all(os.sched_getaffinity(int(t)) == cpus - {cpu} for t in trainers)
    finally:
        learner.stop()
    # Stopped, the trainer has every CPU back (it learns in phases again).
    assert all(os.sched_getaffinity(int(t)) == cpus for t in os.listdir("/proc/self/task"))
    assert learner.error is None


def test_learner_process_needs_the_off_policy_learner_beside_acting():
    with pytest.raises(ValueError, match="needs learn_while_acting"):
        LoopConfig(learner_process=True).validate()
    with pytest.raises(ValueError, match="learner_cpu pins the learner process"):
        LoopConfig(learn_while_acting=True, learner_cpu=0).validate()
    with pytest.raises(ValueError, match="learner_cpu 4096 is not one of"):
        LoopConfig(learn_while_acting=True, learner_process=True, learner_cpu=4096).validate()
    setup = load_setup(config_file("pendulum.yaml"))
    cfg = SessionConfig(setup.agent, actions=setup.actions, algorithm="ppo",
                        loop=LoopConfig(learn_while_acting=True, learner_process=True))
    with pytest.raises(ValueError, match="PPO's update beside acting runs on a thread"):
        build_session(cfg)


def test_the_process_writes_checkpoints_itself_and_a_refused_write_is_reported(tmp_path):
    agent = SACAgent(CFG, replace(SMALL, learning_starts=0))
    _fill(agent, 40)
    learner = LearnerProcess(agent).start()
    refused = []
    try:
        _wait_for_steps(learner, 20)
        agent.iteration = 7
        good = save_training(tmp_path / "best", agent, {"reason": "best"},
                             failed=lambda path, error: refused.append((path, error)))
        (tmp_path / "a_file").write_text("not a folder")
        bad = save_training(tmp_path / "a_file" / "latest", agent,
                            failed=lambda path, error: refused.append((path, error)))
        # Asked, not written: the call returns before the process has the message.
        _wait(lambda: (learner.receive(), refused)[1] != [])
        assert good.is_file()
    finally:
        learner.stop()
    assert [path for path, _ in refused] == [bad] and "Error" in refused[0][1]
    written = Checkpoint(good)
    assert written.iteration == 7 and written.env_steps == 80
    assert written.extra == {"reason": "best"}
    copy = SACAgent(CFG, replace(SMALL, learning_starts=0))
    restore(copy, written)
    assert copy.learner.steps >= 20 and copy.replay.size == 80
