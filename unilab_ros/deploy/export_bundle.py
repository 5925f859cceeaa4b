"""export_bundle: a policy bundle (and optionally ONNX) from a checkpoint or another bundle.

    export_bundle runs/pendulum/latest/best.safetensors pendulum_policy.safetensors
    export_bundle best.safetensors policy.safetensors --onnx policy.onnx \\
        --obs-labels cos sin omega --action-labels torque
    python -m unilab_ros.deploy.export_bundle old.safetensors policy.safetensors \\
        --action-scale 2.0 --action-low -2.0 --action-high 2.0 --safe-action 0.0

The action mapping comes from the source; an ``--action-*`` / ``--safe-action`` option
overrides its field (both values are printed), and is needed for checkpoints written
before checkpoints carried the mapping. Bad input exits 2 with one line. ROS-free.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace

from unilab_ros.rl.actions import ActionConfig, ActionMapper, override_actions
from unilab_ros.rl.bundle import read_policy, save_bundle

ACTION_OPTIONS = [item.name for item in fields(ActionConfig)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="export_bundle", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="training checkpoint, policy export or bundle")
    parser.add_argument("output", help="bundle file to write (.safetensors is appended)")
    parser.add_argument("--onnx", metavar="FILE", help="also write the actor as ONNX here")
    parser.add_argument("--obs-labels", nargs="+", metavar="NAME", default=None,
                        help="one name per observation element")
    parser.add_argument("--action-labels", nargs="+", metavar="NAME", default=None,
                        help="one name per action element")
    for name in ACTION_OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, nargs="+", type=float,
                            metavar="X", help=f"override {name} (one value or one per dim)")
    return parser


def export(args: argparse.Namespace) -> list[str]:
    """Write the bundle (and ONNX); returns the lines to print."""
    bundle = read_policy(args.source)
    given = {name: getattr(args, name) for name in ACTION_OPTIONS if getattr(args, name)}
    if bundle.actions is None and given.keys() != set(ACTION_OPTIONS):
        raise ValueError(
            f"{args.source} does not carry the action mapping (an older checkpoint): give "
            "--action-scale, --action-low, --action-high and --safe-action"
        )
    actions, notes = override_actions(bundle.actions, ActionConfig(**given), given.keys())
    # Limits that contradict each other or the sizes are refused before anything is written.
    ActionMapper(actions, 1, bundle.action_dim)
    bundle = replace(
        bundle,
        actions=actions,
        obs_labels=bundle.obs_labels if args.obs_labels is None else args.obs_labels,
        action_labels=bundle.action_labels if args.action_labels is None else args.action_labels,
    )
    lines = [*notes, f"bundle: {save_bundle(args.output, bundle)}"]
    if args.onnx:
        try:
            from unilab_ros.rl.onnx_export import save_onnx
        except ImportError as error:
            raise ValueError(
                f"ONNX export needs the onnx package ({error}): "
                "pip install -r requirements-deploy.txt"
            ) from None
        lines.append(f"onnx: {save_onnx(args.onnx, bundle)}")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        lines = export(args)
    except (ValueError, OSError) as error:
        print(f"export_bundle: {error}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
