"""The house's floors: imports between the top-level modules go one way (no cycle, imports inside
functions and under TYPE_CHECKING counted), and no module re-exports another's names."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = {p.stem: p for p in sorted(ROOT.glob("*.py"))}


def imports(path: Path) -> set[str]:
    """The top-level modules of the kit that `path` imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return {name for name in found if name in MODULES and name != path.stem}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path a -> ... -> a, or [] if the graph has none (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return []
    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_imports_between_the_top_level_modules_have_no_cycle():
    graph = {name: imports(path) for name, path in MODULES.items()}
    assert len(graph) > 20 and graph["repro"] >= {"suite", "experiments"}  # the parse sees the real imports
    assert cycle(graph) == []


def test_no_module_re_exports_names_it_imports():
    """A `noqa: F401` on an import is how a re-export hides from the linter: there is none."""
    for name, path in MODULES.items():
        assert "noqa: F401" not in path.read_text(), name
