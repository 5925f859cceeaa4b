"""The package's layers, read from its source: the MLX core imports nothing above it, the
loop's decisions and the robot spec import no ROS, and no two modules import each other
(even only for type checking), so each layer can be read, tested and reused on its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "unilab_ros"
ROS_PACKAGES = ("rclpy", "std_msgs", "std_srvs", "diagnostic_msgs", "rcl_interfaces",
                "sensor_msgs", "geometry_msgs", "nav_msgs", "launch", "rosidl")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Every module of the package and the modules it imports (absolute names):
    ``from a import b`` imports module ``a.b`` when there is one, else ``a``."""
    trees = {module_name(path): ast.parse(path.read_text(), str(path))
             for path in PACKAGE.rglob("*.py")}
    found: dict[str, set[str]] = {}
    for name, tree in trees.items():
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    names.add(sub if sub in trees else node.module)
        found[name] = names
    return found


def within(name: str, *packages: str) -> bool:
    """Whether module ``name`` is one of ``packages`` or inside one (not just named alike:
    ``unilab_ros.robot_io`` is not in ``unilab_ros.robot``)."""
    return any(name == package or name.startswith(package + ".") for package in packages)


def own(names: set[str], modules: dict[str, set[str]]) -> set[str]:
    """The package's modules among ``names``."""
    return {name for name in names if name in modules and name != "unilab_ros"}


def test_the_core_imports_nothing_above_it():
    modules = imports()
    for name, names in modules.items():
        if within(name, "unilab_ros.rl"):
            above = {m for m in own(names, modules) if not within(m, "unilab_ros.rl")}
            assert not above, f"{name} imports {sorted(above)} from above the core"


def test_the_loop_imports_no_ros_and_nothing_of_the_nodes():
    modules = imports()
    for name, names in modules.items():
        if not within(name, "unilab_ros.loop"):
            continue
        ros = {n for n in names if n.split(".")[0] in ROS_PACKAGES}
        assert not ros, f"{name} imports ROS: {sorted(ros)}"
        outside = {m for m in own(names, modules)
                   if not within(m, "unilab_ros.rl", "unilab_ros.loop")}
        assert not outside, f"{name} imports {sorted(outside)}"


def test_the_robot_spec_imports_no_ros_and_only_the_layers_below_it():
    # The trainer and the deploy node build the same observation from it, so it must stay
    # importable anywhere: the MLX core's done codes and the loop's step types, no ROS.
    modules = imports()
    found = [name for name in modules if within(name, "unilab_ros.robot")]
    assert "unilab_ros.robot.steps" in found
    for name in found:
        names = modules[name]
        ros = {n for n in names if n.split(".")[0] in ROS_PACKAGES}
        assert not ros, f"{name} imports ROS: {sorted(ros)}"
        outside = {m for m in own(names, modules)
                   if not within(m, "unilab_ros.rl", "unilab_ros.loop", "unilab_ros.robot")}
        assert not outside, f"{name} imports {sorted(outside)}"


def test_no_import_cycles():
    modules = imports()
    # A module's own packages run first whatever it imports: not an edge of its choosing.
    graph = {name: {m for m in own(names, modules) if not name.startswith(m + ".")} - {name}
             for name, names in modules.items()}
    # Depth-first search for a back edge; the cycle is named in the failure.
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycle = path[path.index(other):] + [other]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if other not in state:
                visit(other, path + [other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
