"""The package's layout is its architecture: who runs the code decides where it lives, and imports go one way.

Layers, lowest first: the rank package (what mpirun, torchrun or srun starts: every module outside the three
folders below), commands/ (rank programs launched like training), analysis/ (readers of finished runs and
bench JSON), lab/ (what starts mpirun around jobs), and the one command (cli.py, __main__.py), which names each
subcommand's module. A module may import its own layer and those below it, never one above; the imports,
function-level ones included, form no cycle; and a deferred import of the package says why. The package's root
holds at most 25 files, none of them a module that only runs another.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mpi_train"
LAYERS = ("rank", "commands", "analysis", "lab", "entry")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


ENTRY = ("mpi_train.__main__", "mpi_train.cli")  # the one command: imports a subcommand's module when it runs


def layer(name: str) -> str:
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in ("commands", "analysis", "lab"):
        return parts[1]
    return "entry" if name in ENTRY else "rank"


def imports(name: str, path: Path, tree: ast.Module, known: set[str]) -> list[tuple[str, ast.stmt, bool]]:
    """(imported module, the statement, whether it is deferred: inside a function) for each import of the package."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    deferred = {id(node) for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
                for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            while target and target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                found.append((target, node, id(node) in deferred))
    return found


def graph() -> tuple[dict[str, str], dict[str, list[tuple[str, ast.stmt, bool]]], dict[str, list[str]]]:
    paths = modules()
    known = set(paths)
    layers, edges, sources = {}, {}, {}
    for name, path in paths.items():
        text = path.read_text()
        tree = ast.parse(text)
        layers[name] = layer(name)
        edges[name] = imports(name, path, tree, known)
        sources[name] = text.splitlines()
    return layers, edges, sources


def test_imports_only_go_down_the_layers():
    layers, edges, _ = graph()
    wrong = [f"{name} ({layers[name]}) imports {target} ({layers[target]}), line {node.lineno}"
             for name, found in edges.items() for target, node, _ in found
             if LAYERS.index(layers[target]) > LAYERS.index(layers[name])]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)
    assert {layers[name] for name in layers} == set(LAYERS)  # every layer exists, so the rule bites


def test_the_root_is_short_and_holds_no_entry_module():
    """The root reads as the architecture: the rank's own modules beside the subpackages, no `python -m` shims."""
    files = sorted(path.name for path in PACKAGE.iterdir() if path.is_file())
    assert len(files) <= 25, f"{len(files)} files at mpi_train/'s root: {files}"
    only_run_another = []
    for name in files:
        body = ast.parse((PACKAGE / name).read_text()).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        if name != "__main__.py" and body and not any(isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign,
                                                                           ast.AnnAssign)) for node in body):
            only_run_another.append(name)
    assert not only_run_another, f"modules that only run another (a subcommand of mpi_train/cli.py instead): " \
                                 f"{only_run_another}"


def cycles_in(graph_of: dict[str, list[str]]) -> list[str]:
    """Every cycle a depth-first walk meets, as `a -> b -> a`."""
    state: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in graph_of.get(name, []):
            if state.get(target) == 1:
                found.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in graph_of:
        if name not in state:
            visit(name)
    return found


def test_the_imports_form_no_cycle():
    _, edges, _ = graph()
    cycles = cycles_in({name: sorted({target for target, _, _ in found}) for name, found in edges.items()})
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
    assert cycles_in({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a -> b -> c -> a"]  # the walk does see one


def test_a_deferred_import_of_the_package_says_why():
    _, edges, sources = graph()
    silent = []
    for name, found in edges.items():
        for target, node, deferred in found:
            lines = sources[name][node.lineno - 2: node.end_lineno]
            if deferred and not any("#" in line for line in lines):
                silent.append(f"{name}, line {node.lineno}: imports {target} inside a function without saying why")
    assert not silent, "\n".join(silent)


@pytest.mark.parametrize("rule_breaker", ["from ..lab import mpirun", "from mpi_train.analysis import compare"])
def test_the_check_sees_an_import_against_the_layers(tmp_path, rule_breaker):
    """The checks above read real files: an import against the rule, written into a rank module, is found."""
    tree = ast.parse(f"def late():\n    {rule_breaker}\n")
    found = imports("mpi_train.sync.bucketed", PACKAGE / "sync" / "bucketed.py", tree, set(modules()))
    assert found and found[0][2] and found[0][0] in ("mpi_train.lab.mpirun", "mpi_train.analysis.compare")


MODULE_LINES, FUNCTION_LINES, COMMAND_LINES = 500, 80, 200


def functions_over(tree: ast.Module, limit: int) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def test_modules_and_functions_stay_short_enough_to_read_whole():
    """A module a newcomer reads in one sitting, a function on one screen or two; a command only parses, calls and
    prints."""
    long_modules, long_functions = [], []
    for name, path in modules().items():
        text = path.read_text()
        lines = len(text.splitlines())
        limit = COMMAND_LINES if layer(name) == "commands" else MODULE_LINES
        if lines > limit:
            long_modules.append(f"{name}: {lines} lines (at most {limit})")
        long_functions += [f"{name}.{function}: {length} lines" for function, length in
                           functions_over(ast.parse(text), FUNCTION_LINES)]
    assert not long_modules, "\n".join(long_modules)
    assert not long_functions, f"functions over {FUNCTION_LINES} lines:\n" + "\n".join(long_functions)
    assert functions_over(ast.parse("def f():\n" + "    pass\n" * FUNCTION_LINES), FUNCTION_LINES)  # the count bites


def test_a_command_imports_no_other_command():
    """What two commands share is a library beneath them (benchmark/, analysis/), not one command inside another."""
    layers, edges, _ = graph()
    crossed = [f"{name} imports {target}, line {node.lineno}" for name, found in edges.items()
               if layers[name] == "commands" for target, node, _ in found
               if layers[target] == "commands" and target != "mpi_train.commands"]
    assert not crossed, "\n".join(crossed)
