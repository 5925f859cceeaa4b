"""Samples/s of one PPO update phase: unilab_ros (MLX) against rsl_rl (PyTorch CPU).

One update phase is what runs between two rollouts: the values of the last
observations, GAE returns, then 5 epochs x 4 mini-batches of the clipped-surrogate
step. Both trainers get the same synthetic rollout, the same network sizes and
initial weights, and the same loss terms (clipped value loss, entropy bonus, gradient
clip 1.0, KL-adaptive learning rate with desired_kl 0.01 decided on every
mini-batch). Each is timed after one warm-up phase (ours may JIT-compile then); the
timed phases of the two alternate, so load from other processes hits both alike, and
the median of the repeats is reported.

rsl_rl runs in a child process that never imports unilab_ros or mlx: the OpenBLAS
that unilab_ros loads globally for MLX would otherwise also take over PyTorch's sgemm
and fight its OpenMP threads (10x slower here), which no rsl_rl user would see.

Each size also prints where the time goes: ours from compiled parts, rsl_rl's matmuls
(its linear layers forward and backward, timed like ours), and the ratio the two would
have where both BLAS libraries multiply at the same speed.

``--sizes`` picks the problems (``isaac``: 4096 x 24, Isaac Lab's legged rollout, for a
GPU), ``--device`` MLX's device; rsl_rl runs on CUDA where MLX runs on a CUDA GPU, on the
CPU otherwise, so both sides always share a device.

The last line reads ``ppo_update ratio_robot=<x> ratio_small=<y> device=<backend>`` where
a ratio is rsl_rl's seconds over ours (above 1: ours is faster). Without torch / rsl-rl-lib
(``make bench`` installs them) the rsl_rl side is skipped and the ratios are nan.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from results_page import FLAG_HELP, recording

EPOCHS = 5
MINI_BATCHES = 4
# rsl_rl's PPO defaults, applied to both trainers.
CLIP = 0.2
GAMMA = 0.99
LAM = 0.95
VALUE_LOSS_COEF = 1.0
ENTROPY_COEF = 0.01
LEARNING_RATE = 1e-3
MAX_GRAD_NORM = 1.0
DESIRED_KL = 0.01
INIT_STD = 1.0
TERMINATION_RATE = 0.02
# Hidden activations both trainers offer: ours by name, and rsl_rl's name for it.
ACTIVATIONS = {"elu": "elu", "tanh": "tanh", "silu": "swish"}
# Before each timed phase: the other trainer's idle BLAS / OpenMP threads spin for up to
# ~0.1 s after it finishes, which would bill its wait to whichever phase runs next. In
# training a rollout separates updates, so both start with their threads asleep.
QUIET_SECONDS = 0.3


@dataclass(frozen=True)
class Size:
    """One benchmark problem."""

    name: str
    num_envs: int
    num_steps: int
    obs_dim: int
    action_dim: int
    hidden: tuple[int, ...]

    @property
    def samples(self) -> int:
        return self.num_envs * self.num_steps


SIZES = {
    "robot": Size("robot", 256, 24, 48, 12, (512, 256, 128)),
    "small": Size("small", 16, 64, 3, 1, (64, 64)),
    # Isaac Lab's usual legged-robot rollout: a GPU's size (a minute a phase on 2 cores).
    "isaac": Size("isaac", 4096, 24, 48, 12, (512, 256, 128)),
}
DEFAULT_SIZES = ("robot", "small")


def time_call(phase: Callable[[], Any]) -> float:
    time.sleep(QUIET_SECONDS)
    start = time.perf_counter()
    phase()
    return time.perf_counter() - start


def machine() -> str:
    """CPU model, architecture and core count, so the figures say what they ran on."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                # "model name" on x86_64; arm64 kernels name no model, only "CPU part".
                if line.startswith(("model name", "Model name")):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {platform.machine()}, {os.cpu_count()} CPUs"


# ---- ours (MLX), in this process ------------------------------------------------------


@dataclass
class Ours:
    """Our trainer on a synthetic rollout, and its update phase."""

    model: Any
    trainer: Any
    buffer: Any
    phase: Callable[[], Any]


def build_ours(size: Size, data_path: Path, activation: str) -> Ours:
    """Our trainer on a synthetic rollout; writes the rollout and weights to ``data_path``."""
    # unilab_ros.rl loads the optimized BLAS, so it must come before mlx.
    import unilab_ros.rl  # noqa: F401, I001
    import mlx.core as mx

    from unilab_ros.rl.buffer import TERMINATED, RolloutBuffer
    from unilab_ros.rl.distributions import diag_gaussian_log_prob
    from unilab_ros.rl.model import MLPActorCritic, ModelConfig
    from unilab_ros.rl.ppo import PPOTrainer
    from unilab_ros.rl.ppo_config import PPOConfig

    mx.random.seed(0)
    model_cfg = ModelConfig(
        actor_hidden_dims=list(size.hidden),
        critic_hidden_dims=list(size.hidden),
        activation=activation,
        init_noise_std=INIT_STD,
        normalize_observations=False,
    )
    model = MLPActorCritic(size.obs_dim, size.action_dim, model_cfg)
    ppo_cfg = PPOConfig(
        num_learning_epochs=EPOCHS,
        num_mini_batches=MINI_BATCHES,
        clip_param=CLIP,
        gamma=GAMMA,
        lam=LAM,
        value_loss_coef=VALUE_LOSS_COEF,
        entropy_coef=ENTROPY_COEF,
        learning_rate=LEARNING_RATE,
        use_clipped_value_loss=True,
        max_grad_norm=MAX_GRAD_NORM,
        schedule="adaptive",
        desired_kl=DESIRED_KL,
        # rsl_rl's rule (the default): each mini-batch's KL, a factor 1.5 either way.
    )
    trainer = PPOTrainer(model, ppo_cfg)

    # Random observations and rewards, a few terminations, the model's own policy outputs.
    rng = np.random.default_rng(0)
    shape = (size.num_steps, size.num_envs)
    obs = rng.standard_normal((*shape, size.obs_dim), dtype=np.float32)
    flat_obs = mx.array(obs.reshape(size.samples, size.obs_dim))
    mean, std, log_std = model.distribution_params(flat_obs)
    noise = rng.standard_normal((size.samples, size.action_dim), dtype=np.float32)
    actions = mean + std * mx.array(noise)
    data = {
        "obs": obs,
        "actions": np.array(actions).reshape(*shape, size.action_dim),
        "rewards": rng.standard_normal(shape, dtype=np.float32),
        "dones": np.where(rng.random(shape) < TERMINATION_RATE, TERMINATED, 0).astype(np.uint8),
        "values": np.array(model.value(flat_obs)).reshape(shape),
        "log_probs": np.array(diag_gaussian_log_prob(actions, mean, log_std)).reshape(shape),
        "mean": np.array(mean).reshape(*shape, size.action_dim),
        "std": np.array(std).reshape(*shape, size.action_dim),
        "last_obs": rng.standard_normal((size.num_envs, size.obs_dim), dtype=np.float32),
        "std_param": np.array(model.std),
        "activation": np.array(ACTIVATIONS[activation]),
    }
    for net_name, net in (("actor", model.actor), ("critic", model.critic)):
        for index, layer in enumerate(net.layers):
            data[f"{net_name}.{index}.weight"] = np.array(layer.weight)
            data[f"{net_name}.{index}.bias"] = np.array(layer.bias)
    np.savez(data_path, **data)

    buffer = RolloutBuffer(
        size.num_steps, size.num_envs, size.obs_dim, size.action_dim, GAMMA, LAM
    )
    for _ in range(size.num_steps):
        t = buffer.step
        buffer.add(obs=data["obs"][t], actions=data["actions"][t],
                   rewards=data["rewards"][t], dones=data["dones"][t])
    buffer.set_policy_outputs(data["log_probs"], data["mean"], data["std"], data["values"])
    last_obs = mx.array(data["last_obs"])

    def phase() -> dict[str, float]:
        buffer.compute_returns_and_advantages(np.array(model.value(last_obs)))
        return trainer.update(buffer)

    return Ours(model, trainer, buffer, phase)


def breakdown(size: Size, ours: Ours, repeats: int) -> dict[str, float]:
    """Seconds per update phase: the whole ``phase`` and where it goes, from compiled parts
    timed on one mini-batch and scaled to the phase's 20 steps: the linear layers of both
    networks forward and backward; the activations (the PPO loss's gradient with them
    minus the same with identity); the rest of the loss's forward and backward; and the
    rest of the phase (gradient clipping, Adam, the KL schedule, finite checks,
    mini-batch gathering, GAE). All are timed in turn in one loop, so load from other
    processes hits each alike.
    """
    import mlx.core as mx
    import mlx.nn as nn

    from unilab_ros.rl.model import MLP, MLPActorCritic
    from unilab_ros.rl.ppo import PPOTrainer

    steps = EPOCHS * MINI_BATCHES
    batch = next(ours.buffer.mini_batch_generator(MINI_BATCHES, 1, key=mx.random.key(0)))
    floor, weight = mx.array(0.0), mx.array(1.0)

    def identity(x: mx.array) -> mx.array:
        return x

    linear = nn.Module()
    linear.actor = MLP(size.obs_dim, list(size.hidden), size.action_dim, identity, 0.01)
    linear.critic = MLP(size.obs_dim, list(size.hidden), 1, identity, 1.0)
    linear_grad = nn.value_and_grad(
        linear, lambda model, x: mx.sum(model.actor(x)) + mx.sum(model.critic(x))
    )
    # nn.value_and_grad puts its tracers into the module: the state is in and out.
    linear_step = mx.compile(
        lambda: linear_grad(linear, batch.obs), inputs=linear.state, outputs=linear.state
    )
    no_activation = MLPActorCritic(size.obs_dim, size.action_dim, ours.model.cfg)
    no_activation.actor._activation = no_activation.critic._activation = identity

    def loss_grad(model: MLPActorCritic) -> Callable[[], Any]:
        grad = PPOTrainer(model, ours.trainer.cfg)._loss_and_grad
        return mx.compile(
            lambda: grad(model, batch, floor, weight), inputs=model.state, outputs=model.state
        )

    parts = {
        "whole": ours.phase,
        "linear": linear_step,
        "loss_grad": loss_grad(ours.model),
        "loss_grad_identity": loss_grad(no_activation),
    }
    times: dict[str, list[float]] = {name: [] for name in parts}
    for index in range(repeats + 1):
        for name, run in parts.items():
            start = time.perf_counter()
            mx.eval(run())
            if index > 0:  # the first round is the warm-up (and compiles)
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "whole": median["whole"],
        "matmul": steps * median["linear"],
        "activation": steps * (median["loss_grad"] - median["loss_grad_identity"]),
        "loss": steps * (median["loss_grad_identity"] - median["linear"]),
        "optimizer and rest": median["whole"] - steps * median["loss_grad"],
    }


# ---- rsl_rl (PyTorch), in a child process ---------------------------------------------


def rsl_rl_worker(data_path: str, device: str) -> None:
    """Build rsl_rl's PPO on the saved rollout on ``device`` (cpu or cuda); time one phase
    per 'run' line on stdin."""
    import torch
    from rsl_rl.algorithms import PPO
    from rsl_rl.models import MLPModel
    from rsl_rl.storage import RolloutStorage
    from tensordict import TensorDict

    torch.set_num_threads(os.cpu_count() or 1)
    arrays = dict(np.load(data_path))
    activation = str(arrays.pop("activation"))
    data = {key: torch.from_numpy(value).to(device) for key, value in arrays.items()}
    num_steps, num_envs, action_dim = data["actions"].shape
    num_layers = sum(1 for key in data if key.startswith("actor.") and key.endswith(".bias"))
    hidden = [len(data[f"actor.{index}.bias"]) for index in range(num_layers - 1)]
    # Built as rsl_rl's OnPolicyRunner / PPO.construct_algorithm builds them.
    obs = TensorDict({"policy": data["last_obs"]}, batch_size=[num_envs])
    groups = {"actor": ["policy"], "critic": ["policy"]}
    distribution = {"class_name": "GaussianDistribution", "init_std": INIT_STD}
    actor = MLPModel(obs, groups, "actor", action_dim, hidden, activation,
                     obs_normalization=False, distribution_cfg=distribution)
    critic = MLPModel(obs, groups, "critic", 1, hidden, activation, obs_normalization=False)
    with torch.no_grad():
        for name, net in (("actor", actor), ("critic", critic)):
            linears = [m for m in net.mlp if isinstance(m, torch.nn.Linear)]
            for index, linear in enumerate(linears):
                linear.weight.copy_(data[f"{name}.{index}.weight"])
                linear.bias.copy_(data[f"{name}.{index}.bias"])
        actor.distribution.std_param.copy_(data["std_param"])
    actor.to(device)
    critic.to(device)
    storage = RolloutStorage("rl", num_envs, num_steps, obs, [action_dim], device=device)
    algorithm = PPO(
        actor,
        critic,
        storage,
        num_learning_epochs=EPOCHS,
        num_mini_batches=MINI_BATCHES,
        clip_param=CLIP,
        gamma=GAMMA,
        lam=LAM,
        value_loss_coef=VALUE_LOSS_COEF,
        entropy_coef=ENTROPY_COEF,
        learning_rate=LEARNING_RATE,
        max_grad_norm=MAX_GRAD_NORM,
        use_clipped_value_loss=True,
        schedule="adaptive",
        desired_kl=DESIRED_KL,
        device=device,
    )
    algorithm.train_mode()
    storage.observations["policy"].copy_(data["obs"])
    storage.actions.copy_(data["actions"])
    storage.rewards.copy_(data["rewards"][..., None])
    storage.dones.copy_(data["dones"][..., None])
    storage.values.copy_(data["values"][..., None])
    storage.actions_log_prob.copy_(data["log_probs"][..., None])
    storage.distribution_params = (data["mean"], data["std"])

    def synchronized(run: Callable[[], Any]) -> Callable[[], Any]:
        # CUDA runs asynchronously: a phase ends when the device has finished it.
        if device == "cpu":
            return run
        return lambda: (run(), torch.cuda.synchronize())

    @synchronized
    def phase() -> dict[str, float]:
        # update() ends with storage.clear(), which only rewinds the cursor.
        storage.step = num_steps
        algorithm.compute_returns(obs)
        return algorithm.update()

    # The matmul part, as ours is measured: the same linear layers of both networks (no
    # activations), forward and backward on one mini-batch, once per step of the phase.
    obs_dim = data["obs"].shape[-1]
    mini_batch = data["obs"].reshape(-1, obs_dim)[: num_steps * num_envs // MINI_BATCHES]
    linear_nets = [
        torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in pairwise(dims)]).to(device)
        for dims in ([obs_dim, *hidden, action_dim], [obs_dim, *hidden, 1])
    ]

    @synchronized
    def matmul_phase() -> None:
        for _ in range(EPOCHS * MINI_BATCHES):
            for net in linear_nets:
                net.zero_grad(set_to_none=True)
            sum(net(mini_batch).sum() for net in linear_nets).backward()

    matmul_phase()
    commands = {"run": phase, "matmul": matmul_phase}
    print("ready", flush=True)
    for line in sys.stdin:
        command = commands.get(line.strip())
        if command is None:
            break
        print(f"{time_call(command):.9f}", flush=True)


class RslRlProcess:
    """The rsl_rl worker as a callable phase that returns its own measured seconds."""

    def __init__(self, data_path: Path, device: str) -> None:
        self._errors = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--rsl-rl-worker", str(data_path),
             "--torch-device", device],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )
        self._expect("ready")

    def _expect(self, word: str | None = None) -> str:
        line = self._process.stdout.readline().strip() if self._process.stdout else ""
        if not line or (word is not None and line != word):
            self.close()
            self._errors.seek(0)
            lines = [entry for entry in self._errors.read().splitlines() if entry.strip()]
            raise RuntimeError(lines[-1] if lines else f"worker said {line!r}")
        return line

    def run(self, command: str = "run") -> float:
        """Seconds of one update phase, or with "matmul" of its linear layers alone."""
        assert self._process.stdin is not None
        self._process.stdin.write(f"{command}\n")
        self._process.stdin.flush()
        return float(self._expect())

    def close(self) -> None:
        if self._process.stdin and not self._process.stdin.closed:
            self._process.stdin.close()
        self._process.wait(timeout=60)


def rsl_rl_missing() -> str | None:
    """Why rsl_rl cannot run here (without importing it in this process), or None."""
    import importlib.util

    for module in ("torch", "tensordict", "rsl_rl"):
        if importlib.util.find_spec(module) is None:
            return f"No module named '{module}'"
    return None


# ---- the comparison -------------------------------------------------------------------


def bench_size(
    size: Size, activation: str, repeats: int, skip_reason: str | None, workdir: Path,
    torch_device: str = "cpu",
) -> float:
    """Print one size's figures; return rsl_rl seconds / ours (nan when rsl_rl is skipped)."""
    print(
        f"{size.name}: {size.num_envs} envs x {size.num_steps} steps, obs {size.obs_dim}, "
        f"act {size.action_dim}, hidden {list(size.hidden)} {activation}, "
        f"{size.samples} samples, "
        f"{EPOCHS} epochs x {MINI_BATCHES} mini-batches"
    )
    data_path = workdir / f"{size.name}.npz"
    trainer = build_ours(size, data_path, activation)
    ours_phase = trainer.phase
    from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

    rsl_rl = None
    if skip_reason is None:
        try:
            rsl_rl = RslRlProcess(data_path, torch_device)
            their_first = rsl_rl.run()
        except (OSError, RuntimeError, ValueError) as error:
            skip_reason, rsl_rl = f"{type(error).__name__}: {error}", None
    our_first = time_call(ours_phase)
    theirs, their_matmul, ours = [], [], []
    for _ in range(repeats):
        if rsl_rl is not None:
            try:
                theirs.append(rsl_rl.run())
                their_matmul.append(rsl_rl.run("matmul"))
            except (OSError, RuntimeError, ValueError) as error:
                skip_reason, rsl_rl = f"{type(error).__name__}: {error}", None
        ours.append(time_call(ours_phase))
    if rsl_rl is not None:
        rsl_rl.close()
        their_median = statistics.median(theirs)
        print(f"  rsl_rl {their_median:8.3f} s  {size.samples / their_median:9.0f} samples/s"
              f"  (first call {their_first:.3f} s, torch on {torch_device}, "
              f"threads {os.cpu_count()})")
        their_matmul_median = statistics.median(their_matmul)
        print(f"  rsl_rl breakdown (s per update of {their_median:.3f} s): matmul "
              f"{their_matmul_median:.3f}, rest {their_median - their_matmul_median:.3f}")
    else:
        their_median = their_matmul_median = math.nan
        print(f"  rsl_rl skipped: {skip_reason}")
    our_median = statistics.median(ours)
    print(f"  ours   {our_median:8.3f} s  {size.samples / our_median:9.0f} samples/s"
          f"  (first call {our_first:.3f} s, enable_compile={PPORuntimeConfig().enable_compile})")
    parts = breakdown(size, trainer, repeats)
    whole = parts.pop("whole")
    print(f"  ours breakdown (s per update of {whole:.3f} s): "
          + ", ".join(f"{name} {seconds:.3f}" for name, seconds in parts.items()))
    ratio = their_median / our_median
    print(f"  ratio  {ratio:.2f}  (rsl_rl s / ours s)")
    # What the ratio becomes where both BLAS libraries multiply at the same speed (as
    # measured on an Intel Xeon, see docs/results.md): rsl_rl's whole phase against its own matmul
    # time plus everything else of ours.
    equal = their_median / (their_matmul_median + whole - parts["matmul"])
    print(f"  ratio at equal matmul speed  {equal:.2f}  "
          "(rsl_rl s / (rsl_rl matmul s + ours without matmul s))")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed phases per trainer")
    parser.add_argument("--activation", choices=sorted(ACTIVATIONS), default="elu",
                        help="hidden activation of both trainers (rsl_rl's default: elu)")
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                        help=f"comma-separated, of {', '.join(SIZES)} (default: %(default)s)")
    parser.add_argument("--device", choices=("default", "cpu", "gpu"), default="default",
                        help="MLX's device (default: MLX's own, the GPU where there is one); "
                             "rsl_rl runs on CUDA when MLX runs on a CUDA GPU")
    parser.add_argument("--results-page", action="store_true", help=FLAG_HELP)
    parser.add_argument("--rsl-rl-worker", metavar="NPZ", help=argparse.SUPPRESS)
    parser.add_argument("--torch-device", default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rsl_rl_worker:
        rsl_rl_worker(args.rsl_rl_worker, args.torch_device)
        return
    unknown = set(args.sizes.split(",")) - set(SIZES)
    if unknown:
        parser.error(f"unknown sizes {sorted(unknown)}; choose from {list(SIZES)}")
    with recording("ppo_update", args.results_page):
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    """Print the machine, then each size's figures, then the last line."""
    import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
    from unilab_ros.rl import heap
    from unilab_ros.rl.activations import NATIVE_STATUS
    from unilab_ros.rl.compute import backend, compute_description

    if args.device != "default":
        import mlx.core as mx

        mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    torch_device = "cuda" if backend() == "cuda" else "cpu"
    print(f"machine: {machine()}; {compute_description()}; "
          f"native activations: {NATIVE_STATUS}; heap: {heap.status}")
    skip_reason = rsl_rl_missing()
    if skip_reason is not None:
        print(f"rsl_rl not available ({skip_reason}): it is skipped; `make bench` installs it")
    with tempfile.TemporaryDirectory() as workdir:
        ratios = {
            name: bench_size(SIZES[name], args.activation, args.repeats, skip_reason,
                             Path(workdir), torch_device)
            for name in args.sizes.split(",")
        }
    other = "" if args.activation == "elu" else f" activation={args.activation}"
    print("ppo_update " + " ".join(f"ratio_{name}={ratio:.2f}" for name, ratio in ratios.items())
          + f" device={backend()}" + other)


if __name__ == "__main__":
    main()
