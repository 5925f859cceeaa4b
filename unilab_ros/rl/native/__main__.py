"""``python -m unilab_ros.rl.native``: build the fused activations (run by ``make setup``).

Exits 0 when the extension is built and loads, or when this machine is not one it is
built for; 1 when a build was attempted and failed (set-up goes on: the activations
then run on plain MLX ops).
"""

from __future__ import annotations

import argparse
import sys

from unilab_ros.rl import native


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="show the compiler output")
    args = parser.parse_args()
    skip = native.build_skip_reason()
    if skip is not None:
        print(f"unilab native activations: skipped, {skip}; plain MLX ops are used")
        return 0
    print("unilab native activations: building (CMake, ~30 s)...", flush=True)
    try:
        path = native.build(verbose=args.verbose)
    except (OSError, RuntimeError) as error:
        print(f"unilab native activations: build failed, plain MLX ops are used:\n{error}")
        return 1
    module, status = native.load()
    print(f"unilab native activations: {path.name}: {status}")
    return 0 if module is not None else 1


if __name__ == "__main__":
    sys.exit(main())
