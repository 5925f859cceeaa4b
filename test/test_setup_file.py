"""load_setup: a params file (as the nodes read it) as an in-process training setup."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from unilab_ros.config.paths import config_file
from unilab_ros.config.training_setup import load_setup
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"


def node_parameters(path: Path, node: str) -> dict:
    """The ``ros__parameters`` of ``node`` in a params file, read with plain PyYAML."""
    document = yaml.safe_load(path.read_text())
    for key, entry in document.items():
        if key.rstrip("/").split("/")[-1] == node:
            return entry["ros__parameters"]
    return {}


def assert_section(config: object, values: dict) -> None:
    """Every value the file gives is the config's, and the file is not all defaults."""
    assert values
    for name, value in values.items():
        assert getattr(config, name) == value, name
    defaults = type(config)()
    assert any(getattr(defaults, name) != value for name, value in values.items())


def test_pendulum_yaml_is_read_field_by_field():
    path = config_file("pendulum.yaml")
    trainer = node_parameters(path, "unilab_trainer")
    bridge = node_parameters(path, "gym_env")
    setup = load_setup(path)
    assert setup.env_id == bridge["env_id"] == "Pendulum-v1"
    assert setup.max_episode_steps == bridge["max_episode_steps"]
    assert setup.max_iterations == trainer["max_iterations"]
    agent_fields = {f.name for f in dataclasses.fields(AgentConfig)} - {"seed"}
    assert {"num_steps", "reward_scale"} <= trainer.keys()
    assert_section(setup.agent, {k: v for k, v in trainer.items() if k in agent_fields})
    assert setup.agent.seed == trainer.get("seed", bridge["seed"])
    assert {"actor_hidden_dims", "critic_hidden_dims"} <= trainer["model"].keys()
    assert_section(setup.model, trainer["model"])
    assert_section(setup.ppo, trainer["ppo"])
    action_fields = {f.name for f in dataclasses.fields(ActionConfig)}
    assert "action_scale" in trainer
    assert_section(setup.actions, {k: v for k, v in trainer.items() if k in action_fields})


def test_namespaced_partial_file_with_node_only_keys(tmp_path: Path):
    path = tmp_path / "params.yaml"
    path.write_text(
        """
/robot/gym_env:
  ros__parameters:
    env_id: InvertedPendulum-v5
    seed: 7
    max_episode_steps: 300
/robot/unilab_trainer:
  ros__parameters:
    num_envs: 4
    obs_dim: 4
    action_dim: 1
    num_steps: 32
    reward_scale: 0.5
    action_scale: [3.0]
    step_timeout: 2.0          # the node's, not the core's: set aside
    model:
      actor_hidden_dims: [32]
      noise_std_type: log
    ppo:
      schedule: adaptive
      target_kl_stop: 0.03
      bounds_loss_coef: 2.0
      advantage_std_floor: 0.0
      enable_compile: false      # how the update runs: the same section, its own config
      finite_check_interval: 2
"""
    )
    setup = load_setup(path)
    assert setup.env_id == "InvertedPendulum-v5" and setup.max_episode_steps == 300
    assert setup.max_iterations == 0
    agent = setup.agent
    assert (agent.num_envs, agent.obs_dim, agent.num_steps, agent.seed) == (4, 4, 32, 7)
    assert agent.reward_scale == 0.5
    assert setup.actions.action_scale == [3.0]
    assert setup.actions.action_low == ActionConfig().action_low
    assert setup.model.actor_hidden_dims == [32] and setup.model.noise_std_type == "log"
    assert setup.model.critic_hidden_dims == ModelConfig().critic_hidden_dims
    ppo = setup.ppo
    assert (ppo.schedule, ppo.target_kl_stop, ppo.bounds_loss_coef) == ("adaptive", 0.03, 2.0)
    assert ppo.advantage_std_floor == 0.0 and ppo.gamma == PPOConfig().gamma
    assert setup.runtime == PPORuntimeConfig(enable_compile=False, finite_check_interval=2)

    # A seed of the trainer's own wins over the bridge's.
    text = path.read_text().replace("    num_envs: 4\n", "    num_envs: 4\n    seed: 3\n")
    path.write_text(text)
    assert load_setup(path).agent.seed == 3


def test_a_file_without_trainer_parameters_is_refused(tmp_path: Path):
    path = tmp_path / "bridge_only.yaml"
    path.write_text("gym_env:\n  ros__parameters:\n    env_id: Pendulum-v1\n")
    with pytest.raises(ValueError, match="unilab_trainer"):
        load_setup(path)


@pytest.mark.parametrize(
    "name",
    sorted(p.name for p in CONFIG_DIR.glob("*.yaml") if node_parameters(p, "unilab_trainer")),
)
def test_every_shipped_trainer_file_loads_into_valid_configs(name: str):
    setup = load_setup(CONFIG_DIR / name)
    setup.agent.validate()
    setup.model.validate()
    setup.ppo.validate()
    setup.runtime.validate()
    low, high = ActionMapper(setup.actions, 1, setup.agent.action_dim).policy_bounds()
    assert (low < high).all()


def test_a_misspelled_key_is_reported_by_the_in_process_path_too(tmp_path: Path, caplog):
    """load_setup once dropped unknown keys without a word while the nodes warned about
    them: a misspelled ppo key left its default in place in the demo and the benches."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"/**/unilab_trainer": {"ros__parameters": {
        "num_steps": 64, "model": {"actor_hidden_dim": [8]},
        "ppo": {"learning_rat": 0.1, "num_learning_epochs": 2}}}}))
    with caplog.at_level("WARNING", logger="unilab_ros.config.training_setup"):
        setup = load_setup(path)
    assert setup.ppo.num_learning_epochs == 2
    assert "unknown parameter(s) ignored: model.actor_hidden_dim, ppo.learning_rat" in caplog.text


def test_the_shipped_files_have_no_unknown_key(caplog):
    with caplog.at_level("WARNING", logger="unilab_ros.config.training_setup"):
        for path in sorted(CONFIG_DIR.glob("*.yaml")):
            try:
                load_setup(path)
            except ValueError:
                continue  # no trainer entry (deploy.yaml): not an in-process setup
    assert "unknown" not in caplog.text
