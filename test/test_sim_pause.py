"""The trainer against the real Gymnasium bridge, in one process: pausing around updates.

The bridge spins in a thread of its own, so it answers while the trainer updates, as the
two processes of sim_train do. With the bridge's ~/pause and ~/resume configured no env
step is taken during an update, so every episode the trainer logs has the env's full
length even though the rollout does not divide it. Without them the safe action published
at each update steps the env, as before.
"""

import threading

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_helpers import spin_until

from unilab_ros.sims.gym_env_node import GymEnvNode
from unilab_ros.trainer.node import TrainerNode

pytestmark = pytest.mark.ros

NUM_ENVS, NUM_STEPS, MAX_EPISODE_STEPS, UPDATES = 2, 7, 20, 4
"""4 rollouts of 7 steps: the first episode (20 steps) spans two updates."""
STORED = UPDATES * NUM_STEPS
WAIT_S = 20.0


TINY_TRAINER = {
    "num_envs": NUM_ENVS, "obs_dim": 3, "action_dim": 1, "num_steps": NUM_STEPS,
    "safe_action": [0.0], "tensorboard": False, "model.actor_hidden_dims": [8],
    "model.critic_hidden_dims": [8], "ppo.num_mini_batches": 1, "ppo.num_learning_epochs": 1,
}
"""A trainer small enough that an update takes milliseconds."""
PAUSING = {"pause_service": "gym_env/pause", "resume_service": "gym_env/resume",
           "pause_service_type": "empty"}
"""The bridge's own ~/pause and ~/resume, relative (a fleet's robot's own)."""


def overrides(params: dict) -> list[Parameter]:
    return [Parameter(name, value=value) for name, value in params.items()]


@pytest.fixture
def run_pair(context, tmp_path):
    """Run a bridge and a trainer until the trainer finished its updates."""
    executors: list[SingleThreadedExecutor] = []
    nodes: list = []
    threads: list[threading.Thread] = []

    def run(trainer_params: dict) -> tuple[GymEnvNode, TrainerNode]:
        bridge = GymEnvNode(context=context, parameter_overrides=overrides({
            "num_envs": NUM_ENVS, "max_episode_steps": MAX_EPISODE_STEPS,
            "republish_period": 0.1}))
        nodes.append(bridge)
        trainer = TrainerNode(context=context, parameter_overrides=overrides({
            **TINY_TRAINER, "max_iterations": UPDATES,
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            # Long timeouts: a step dropped on a busy machine would cut an episode.
            "step_timeout": 10.0, "obs_timeout": 10.0,
            **trainer_params}))
        nodes.append(trainer)
        bridge_executor, executor = (SingleThreadedExecutor(context=context) for _ in "ab")
        executors.extend((bridge_executor, executor))
        bridge_executor.add_node(bridge)
        executor.add_node(trainer)
        threads.append(threading.Thread(target=bridge_executor.spin, daemon=True))
        threads[-1].start()

        assert spin_until(executor, lambda: not bridge.waiting_for_first_action, WAIT_S)
        # The bridge's re-published first observation may reach the trainer once more
        # after it acted (a duplicate); no later observation may be taken for one.
        spin_until(executor, lambda: False, 0.2)
        duplicates = trainer.loop.step_counters["duplicate_messages"]
        assert spin_until(executor, lambda: trainer.finished, WAIT_S), "updates did not finish"
        # Time for the last update's safe action to reach the bridge.
        spin_until(executor, lambda: False, 0.2)
        assert trainer.loop.step_counters["duplicate_messages"] == duplicates
        assert trainer.agent.iteration == UPDATES
        assert trainer.loop.step_counters["steps_completed"] == STORED
        # A paused bridge gets no safe action; one without the services gets each one.
        published = 0 if "pause_service" in trainer_params else UPDATES
        assert trainer.counters["safe_actions_published"] == published
        assert trainer.status()["sim_service_failures"] == 0
        return bridge, trainer

    yield run
    for executor in executors:
        executor.shutdown()
    for thread in threads:
        thread.join(timeout=5.0)
    for node in nodes:
        node.destroy_node()


def test_with_the_pause_services_no_step_is_lost_to_updates(run_pair):
    bridge, trainer = run_pair(PAUSING)
    assert trainer.loop.step_counters["steps_dropped"] == 0
    assert bridge.status.steps == STORED, "an env step was taken during an update"
    assert bridge.status.actions_while_paused == 0
    assert not bridge.paused
    assert list(trainer.stats.finished_lengths) == [MAX_EPISODE_STEPS] * NUM_ENVS


def test_without_the_pause_services_the_safe_action_steps_the_env(run_pair):
    bridge, _ = run_pair({})
    assert bridge.status.steps == STORED + UPDATES
    assert bridge.status.actions_while_paused == 0


@pytest.fixture
def fleet_of_two(context, tmp_path):
    """Two bridges (robot1, robot2), each spinning in a thread; yields them by name with
    their executors and threads, and ``start(params)``, which makes a trainer pausing both
    and its executor."""
    def bridge_in(namespace: str) -> tuple[GymEnvNode, SingleThreadedExecutor,
                                           threading.Thread]:
        node = GymEnvNode(context=context, namespace=namespace, parameter_overrides=overrides(
            {"num_envs": NUM_ENVS, "republish_period": 0.1}))
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        thread = threading.Thread(target=executor.spin, daemon=True)
        thread.start()
        return node, executor, thread

    bridges = {name: bridge_in(name) for name in ("robot1", "robot2")}
    nodes = [node for node, _, _ in bridges.values()]
    executors = [executor for _, executor, _ in bridges.values()]

    def start(trainer_params: dict) -> tuple[TrainerNode, SingleThreadedExecutor]:
        trainer = TrainerNode(context=context, parameter_overrides=overrides({
            **TINY_TRAINER, **PAUSING, "robots": ["robot1", "robot2"], "max_iterations": 0,
            "checkpoint_dir": str(tmp_path / "checkpoints"), **trainer_params}))
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(trainer)
        nodes.append(trainer)
        executors.append(executor)
        return trainer, executor

    yield bridges, start
    for executor in executors:
        executor.shutdown()
    for node in nodes:
        node.destroy_node()


def both_joined_then_stop_robot2(trainer, executor, bridges) -> GymEnvNode:
    """Once the trainer has heard both robots (one not heard yet is not stalled when it
    goes: it never joined, and robot1 alone can fill the first rollouts while discovery
    finds robot2), stop robot2's executor; its node is returned, still there."""
    assert spin_until(executor, lambda: trainer.agent.iteration >= 1 and all(
        robot.source.counters["steps_completed"] for robot in trainer.loop.robots), WAIT_S)
    node, robot2_executor, thread = bridges["robot2"]
    # rclpy's shutdown() returns without waiting for the spinning thread: joined, so no
    # callback of robot2's runs after this.
    robot2_executor.shutdown()
    thread.join(5.0)
    assert not thread.is_alive()
    return node


def test_a_stalled_robots_simulator_is_left_out_of_the_pauses(fleet_of_two):
    """Once robot2 is gone and counted stalled, updates pause and resume robot1 only.
    Calling a dead robot's services fails (here at once: the bridge's node is destroyed in
    this process; across processes a dead service can look ready for a while, and each
    call then waits service_timeout)."""
    bridges, start = fleet_of_two
    trainer, executor = start({"step_timeout": 0.5})
    both_joined_then_stop_robot2(trainer, executor, bridges).destroy_node()
    assert spin_until(executor, lambda: trainer.loop.stalled_robots == ["robot2"], WAIT_S)
    failures, iteration = trainer.status()["sim_service_failures"], trainer.agent.iteration
    paused_at_updates: list[list[bool]] = []
    run_update = trainer._run_update

    def noting_who_is_paused() -> None:
        paused_at_updates.append([sim.paused for sim in trainer._simulators.sims])
        run_update()

    trainer._run_update = noting_who_is_paused
    assert spin_until(executor, lambda: trainer.agent.iteration >= iteration + 2, WAIT_S)
    assert trainer.status()["sim_service_failures"] == failures
    # robot1 is still paused around every update, robot2 left out.
    assert len(paused_at_updates) >= 2
    assert all(paused == [True, False] for paused in paused_at_updates)


def test_a_robot_whose_pause_goes_unanswered_stalls_at_once(fleet_of_two):
    """robot2's bridge stops answering (its executor stops; its node, so its services,
    stay, as a dead process's can for a while). Its step would time out only after 30 s,
    but its lanes fill from robot1 and the update's pause to it goes unanswered: robot2
    is counted stalled then, and later updates do not wait on it."""
    bridges, start = fleet_of_two
    trainer, executor = start({"step_timeout": 30.0, "obs_timeout": 0.5,
                               "service_timeout": 0.3})
    both_joined_then_stop_robot2(trainer, executor, bridges)
    assert spin_until(executor, lambda: trainer.loop.stalled_robots == ["robot2"], 10.0)
    assert trainer.loop.counters["robot_stalls"] == 1
    # That update still resumes robot2 (the pause may have arrived late), unanswered too.
    iteration = trainer.agent.iteration
    assert spin_until(executor, lambda: trainer.agent.iteration >= iteration + 1, WAIT_S)
    failures, iteration = trainer.status()["sim_service_failures"], trainer.agent.iteration
    assert spin_until(executor, lambda: trainer.agent.iteration >= iteration + 2, WAIT_S)
    assert trainer.status()["sim_service_failures"] == failures


def test_a_trainer_resumes_a_simulator_left_paused_at_its_start(context, tmp_path):
    """A trainer killed during an update leaves its bridge paused; the next one resumes
    it at start rather than leave every env to wait out max_pause (30 s)."""
    from std_srvs.srv import Empty

    bridge = GymEnvNode(context=context, parameter_overrides=overrides({
        "num_envs": NUM_ENVS, "republish_period": 0.1}))
    bridge._srv_pause(Empty.Request(), Empty.Response())
    assert bridge.paused
    bridge_executor, executor = (SingleThreadedExecutor(context=context) for _ in "ab")
    bridge_executor.add_node(bridge)
    thread = threading.Thread(target=bridge_executor.spin, daemon=True)
    thread.start()
    trainer = TrainerNode(context=context, parameter_overrides=overrides({
        **TINY_TRAINER, **PAUSING, "checkpoint_dir": str(tmp_path / "checkpoints")}))
    executor.add_node(trainer)
    try:
        assert spin_until(executor, lambda: trainer.loop.step_counters["steps_completed"] > 0,
                          10.0), "the paused bridge was not resumed"
        assert not bridge.paused
    finally:
        bridge_executor.shutdown()
        executor.shutdown()
        thread.join(timeout=5.0)
        trainer.destroy_node()
        bridge.destroy_node()


def test_a_configured_pause_service_not_found_is_an_error_naming_it(
        context, tmp_path, monkeypatch):
    """Issue 41 (9): under a namespace the trainer trained without pausing, without a word
    (an absolute /pause_physics where the robot offered /ns/pause_physics). A relative name
    resolves under the node's namespace; one not found after start is named and counted."""
    import unilab_ros.trainer.simulators as simulators
    monkeypatch.setattr(simulators, "SERVICE_CHECK_S", 0.3)
    trainer = TrainerNode(context=context, namespace="ns", parameter_overrides=overrides({
        **TINY_TRAINER, "checkpoint_dir": str(tmp_path / "checkpoints"),
        "pause_service": "pause_physics", "resume_service": "/unpause_physics"}))
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(trainer)
    try:
        sims = trainer._simulators
        assert spin_until(executor, lambda: sims.missing_services, 5.0)
        assert sims.missing_services == ["/ns/pause_physics", "/unpause_physics"]
        assert trainer.status()["sim_service_failures"] == 2
    finally:
        executor.shutdown()
        trainer.destroy_node()
