"""The package's layers, read from its source, bottom up: ``rl`` (the MLX core) imports
nothing above it; ``config`` (parameter files) only the core; ``loop`` (the trainer's
decisions) and ``robot`` (the robot spec) no ROS, and the spec from the loop only the
vocabulary they share (step types, counters, the action guard); ``ros`` (the helpers the
nodes share) no node; the nodes' packages (``trainer``, ``deploy``, ``sims``) never import
each other, and nothing imports the user's ``tools``. The package root holds subpackages
only, and no two modules import each other (even only for type checking), so each layer
can be read, tested and reused on its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "unilab_ros"
ROS_PACKAGES = ("rclpy", "std_msgs", "std_srvs", "diagnostic_msgs", "rcl_interfaces",
                "sensor_msgs", "geometry_msgs", "nav_msgs", "launch", "rosidl")


SHARED_WITH_THE_LOOP = ("unilab_ros.loop.steps", "unilab_ros.loop.counters",
                       "unilab_ros.loop.action_safety")
"""What the robot spec may import of the loop: the step sources' vocabulary."""
NODES = ("unilab_ros.trainer", "unilab_ros.deploy", "unilab_ros.sims")
TOOLS = "unilab_ros.tools"


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


def assert_no_ros_and_only(package: str, *allowed: str) -> list[str]:
    """Every module of ``package`` imports no ROS and, of the package's own, only modules
    within ``allowed``; returns the modules checked."""
    modules = imports()
    found = [name for name in modules if within(name, package)]
    for name in found:
        ros = {n for n in modules[name] if n.split(".")[0] in ROS_PACKAGES}
        assert not ros, f"{name} imports ROS: {sorted(ros)}"
        outside = {m for m in own(modules[name], modules) if not within(m, *allowed)}
        assert not outside, f"{name} imports {sorted(outside)}"
    return found


def test_the_loop_imports_no_ros_and_nothing_of_the_nodes():
    assert_no_ros_and_only("unilab_ros.loop", "unilab_ros.rl", "unilab_ros.loop")


def test_the_robot_spec_imports_no_ros_and_only_the_layers_below_it():
    # The trainer and the deploy node build the same observation from it, so it must stay
    # importable anywhere: the MLX core's done codes and the loop's step types, no ROS.
    found = assert_no_ros_and_only("unilab_ros.robot", "unilab_ros.rl", "unilab_ros.robot",
                                   *SHARED_WITH_THE_LOOP)
    assert "unilab_ros.robot.steps" in found


def test_the_package_root_holds_subpackages_only():
    # Each module sits in the folder that says what it is (ROS helper, node, tool...).
    loose = sorted(path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    assert not loose, f"modules at the package root: {loose}"


def test_parameter_files_import_only_the_core():
    assert_no_ros_and_only("unilab_ros.config", "unilab_ros.rl", "unilab_ros.config")


def test_the_ros_helpers_import_no_node_and_no_tool():
    modules = imports()
    found = [name for name in modules if within(name, "unilab_ros.ros")]
    assert "unilab_ros.ros.spec_link" in found
    for name in found:
        above = {m for m in own(modules[name], modules) if within(m, *NODES, TOOLS)}
        assert not above, f"{name} imports {sorted(above)}"


def test_the_nodes_packages_never_import_each_other_nor_the_tools():
    modules = imports()
    for package in NODES:
        for name, names in modules.items():
            if not within(name, package):
                continue
            others = {m for m in own(names, modules)
                      if within(m, *(p for p in NODES if p != package), TOOLS)}
            assert not others, f"{name} imports {sorted(others)}"


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
