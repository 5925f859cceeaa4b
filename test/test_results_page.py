"""bench/results_page.py writes each bench's own section of docs/results.md, and the bench
scripts import one another in one direction only (read from their source: no bench runs)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import results_page  # noqa: E402  (bench is not a package)

PAGE = """# Measured results

Intro.

## ppo_update

What the bench measures.

<!-- results:ppo_update -->
old figures
<!-- /results:ppo_update -->

## learning

<!-- results:learning -->
learning figures
<!-- /results:learning -->
"""


def test_a_section_is_replaced_and_nothing_else_moves():
    new = "<!-- results:ppo_update -->\nnew figures\n<!-- /results:ppo_update -->"
    page = results_page.replace_section(PAGE, "ppo_update", new)
    assert page == PAGE.replace("old figures", "new figures")


def test_a_bench_without_a_section_gets_one_at_the_end():
    new = "<!-- results:soak -->\nsoak figures\n<!-- /results:soak -->"
    page = results_page.replace_section(PAGE, "soak", new)
    assert page.startswith(PAGE.rstrip())
    assert page.endswith(f"\n\n## soak\n\n{new}\n")


def test_write_section_states_date_commit_cpu_and_command(tmp_path):
    page = tmp_path / "results.md"
    page.write_text(PAGE)
    argv = [str(BENCH / "ppo_update.py"), "--repeats", "3", "--results-page"]
    results_page.write_section("ppo_update", "ratio  1.10\n", argv, page)
    text = page.read_text()
    block = text[text.index("<!-- results:ppo_update -->"):]
    assert "`python bench/ppo_update.py --repeats 3 --results-page`" in block
    assert f"on {results_page.cpu_model()} (" in block
    assert "at commit `" in block and "at commit `unknown`" not in block
    assert "```text\nratio  1.10\n```" in block
    assert "old figures" not in text and "learning figures" in text


def test_recording_prints_through_and_writes_only_a_finished_run(tmp_path, capsys):
    page = tmp_path / "results.md"
    page.write_text(PAGE)
    argv = ["bench/act_latency.py"]
    with results_page.recording("act_latency", True, argv, page) as record:
        print("p99 1.0 ms")
        record.keep = False
    assert page.read_text() == PAGE
    with pytest.raises(RuntimeError), results_page.recording("act_latency", True, argv, page):
        print("half a run")
        raise RuntimeError("bench failed")
    assert page.read_text() == PAGE
    with results_page.recording("act_latency", True, argv, page):
        print("p99 0.9 ms")
    assert "p99 1.0 ms" in capsys.readouterr().out
    assert "```text\np99 0.9 ms\n```" in page.read_text()
    with results_page.recording("act_latency", False, argv, page):
        print("p99 5.0 ms")
    assert "p99 5.0 ms" not in page.read_text()


def _bench_imports() -> dict[str, set[str]]:
    """Which bench modules each bench module imports, anywhere in it (lazy imports too)."""
    names = {path.stem for path in BENCH.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in BENCH.glob("*.py"):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        graph[path.stem] = imported & names - {path.stem}
    return graph


def test_the_bench_modules_import_each_other_in_no_circle():
    """learning, general_config and learning_report imported each other in a circle."""
    graph = _bench_imports()
    assert {"learning_tasks", "general_config", "learning_report"} <= graph["learning"]
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())
