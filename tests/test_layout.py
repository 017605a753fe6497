"""The house's floors (docs/design.md): the story's files at the root, the machinery in folders, imports
going down only. Every module of every folder is parsed (imports inside functions and under TYPE_CHECKING
counted): no import cycle between modules, no import from a higher floor, no re-export, and no file or
function too long to read in one sitting."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("plumbing", "interventions", "experiments", "tools")
# Floors, lowest first: a module imports from its own folder or from lower floors only. The root holds two:
# the story (model, data, kd, config, rundir, grow, diag, ...) and, at the top, repro.py, the command line.
FLOOR = {"plumbing": 0, "interventions": 1, "": 2, "experiments": 3, "tools": 4, "repro": 5}
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 60


def module_files() -> dict[str, Path]:
    """{dotted name: file} of every module of the kit: the root's and each folder's (no __init__)."""
    files = {p.stem: p for p in ROOT.glob("*.py")}
    for folder in FOLDERS:
        files |= {f"{folder}.{p.stem}": p for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"}
    return files


MODULES = module_files()


def imports(path: Path) -> set[str]:
    """The kit's modules that `path` imports anywhere in its body (`from plumbing import devices` and
    `from plumbing.devices import Dist` both name plumbing.devices)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name in MODULES} - {module_name(path)}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def floor(module: str) -> int:
    return FLOOR.get(module, FLOOR[module.rpartition(".")[0]])


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that go to a higher floor, or sideways into another folder of the same floor."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if floor(b) > floor(a) or (floor(b) == floor(a) and a.rpartition(".")[0] != b.rpartition(".")[0]))


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


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def test_the_checks_find_a_planted_cycle_and_a_planted_upward_import():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    planted = {**GRAPH, "plumbing.devices": GRAPH["plumbing.devices"] | {"grow"}}
    assert upward(planted) == [("plumbing.devices", "grow")]
    assert cycle(planted)  # grow imports plumbing.devices


def test_the_parse_sees_every_folder_and_the_real_imports():
    assert {name.partition(".")[0] for name in MODULES if "." in name} == {f for f in FOLDERS if (ROOT / f).is_dir()}
    assert GRAPH["repro"] >= {"experiments.suite", "experiments.registry", "tools.preflight"}
    assert "plumbing.devices" in GRAPH["grow"] and "experiments.presets" in GRAPH["tools.plan"]


def test_imports_have_no_cycle_and_go_down_the_floors_only():
    assert cycle(GRAPH) == []
    assert upward(GRAPH) == []


def test_no_module_re_exports_names_it_imports():
    """A `noqa: F401` on an import is how a re-export hides from the linter: there is none; a folder's
    __init__.py is empty."""
    for name, path in MODULES.items():
        assert "noqa: F401" not in path.read_text(), name
    for folder in FOLDERS:
        init = ROOT / folder / "__init__.py"
        assert not init.exists() or init.read_text() == "", init


def too_long(name: str, text: str) -> list[str]:
    """The file if it is over MAX_FILE_LINES lines, and each function in it (methods and nested ones too)
    over MAX_FUNCTION_LINES, counted from its def to its last line."""
    found = [f"{name}: {len(text.splitlines())} lines"] if len(text.splitlines()) > MAX_FILE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_file_or_function_is_too_long_to_read_in_one_sitting():
    """Issue 31: every module of the kit and every file of tests/ (its helpers too) is at most 600 lines,
    every function in them at most 60."""
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # a def line and 60 more: 61 lines
    planted = "class A:\n    def method(self):\n" + body + "\n" * (MAX_FILE_LINES - MAX_FUNCTION_LINES - 1)
    assert too_long("planted.py", planted) == ["planted.py: 601 lines", "planted.py:2 method: 61 lines"]
    assert too_long("planted.py", planted.replace("        x0 = 0\n", "", 1)) == []
    files = [*MODULES.values(), *sorted((ROOT / "tests").glob("*.py"))]
    assert ROOT / "tests" / "test_layout.py" in files and ROOT / "grow.py" in files
    assert [line for path in files for line in too_long(str(path.relative_to(ROOT)), path.read_text())] == []
