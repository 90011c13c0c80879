"""The package's shape: no import cycle among its modules, and no oversized module or function.

Both are read from the source (``ast``), so imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.paths import ROOT

SRC = ROOT / "src" / "tandem_rlvr"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of the package it imports`` (anywhere in its body, relative imports resolved)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                if t.startswith("tandem_rlvr"):
                    r = _resolve(t, mods)
                    if r is not None and r != mod:
                        graph[mod].add(r)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_sees_imports_inside_functions_and_finds_cycles():
    graph = import_graph()
    assert "tandem_rlvr.evaluation.eval_cli" in graph["tandem_rlvr.cli"], "cli imports eval_cli inside a function"
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_config_imports_no_torch():
    """The configuration (and what it asks: names, engine serving, errors) stays torch-free."""
    graph, seen, todo = import_graph(), set(), ["tandem_rlvr.config"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    for m in seen:
        tree = ast.parse(_modules()[m].read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(x == "torch" or x.startswith("torch.") for x in names), f"{m} (reached from config) imports torch"


def test_no_oversized_module_or_function():
    big = []
    for mod, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            big.append(f"{mod}: {len(text.splitlines())} lines (max {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    big.append(f"{mod}.{node.name} (line {node.lineno}): {n} lines (max {MAX_FUNCTION_LINES})")
    assert not big, "\n".join(big)


# Folders import one way: basics <- (preflight,) engines, rewards <- training, evaluation <- demo, cli.
BASICS = ("config", "names", "errors", "io", "integrity", "data", "models", "trackers", "runlock")
FORBIDDEN = {
    "engines": ("training", "evaluation", "demo", "cli", "world"),
    "rewards": ("engines", "training", "evaluation", "demo", "cli", "world"),
    "training": ("demo", "cli"),
    "evaluation": ("training", "demo", "cli"),
    "world": ("engines", "training", "evaluation", "demo", "cli", "rewards"),
    **{b: ("training", "evaluation", "demo", "cli", "rewards") for b in BASICS},
    "preflight": ("engines", "training", "evaluation", "demo", "cli"),  # checks inputs: basics and the reward import only
}


def _group(mod: str) -> str:
    return mod.split(".")[1] if mod.count(".") else ""


def test_folders_import_one_way():
    bad = [f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
           if _group(b) in FORBIDDEN.get(_group(a), ())]
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def private_imports(source: str, module: str) -> list[str]:
    """Private names that ``module`` takes from another module of the package: ``from tandem_rlvr.x import
    _name`` and ``alias._name`` where ``alias`` was bound to a package module by an import."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tandem_rlvr"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tandem_rlvr"):
            for a in node.names:
                if node.module != module and a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"from {node.module} import {a.name}")
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")
                and aliases[node.value.id] != module):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_the_private_import_check_finds_both_forms():
    src = ("import tandem_rlvr.engines.handoff as h\nfrom tandem_rlvr.training import checkpoint as ck\n"
           "from tandem_rlvr.models import _why, load\nimport torch\n"
           "h._table(); ck._prune(); torch._C; load._x; h.public()\n")
    assert sorted(private_imports(src, "tandem_rlvr.other")) == sorted([
        "from tandem_rlvr.models import _why", "tandem_rlvr.engines.handoff._table",
        "tandem_rlvr.training.checkpoint._prune", "tandem_rlvr.models.load._x"])
    assert private_imports("from tandem_rlvr.x import _y\n", "tandem_rlvr.x") == []


def test_no_module_uses_another_modules_private_names():
    found = {}
    for mod, path in _modules().items():
        hits = private_imports(path.read_text(encoding="utf-8"), mod)
        if hits:
            found[mod] = hits
    assert not found, f"private names used across modules (make them public or move the code): {found}"


def test_engines_do_not_import_the_training_config():
    """An engine is described by :class:`tandem_rlvr.engines.spec.EngineSpec`, built from either configuration
    outside ``engines/``; no engine module reads ``tandem_rlvr.config`` (import, from-import, inside a function),
    nor takes a config by duck typing (a parameter named ``cfg``)."""
    bad = sorted(m for m, targets in import_graph().items()
                 if _group(m) == "engines" and "tandem_rlvr.config" in targets)
    assert not bad, f"engine modules that import tandem_rlvr.config: {bad}"
    for mod, path in _modules().items():
        if _group(mod) == "engines":
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                    assert "cfg" not in [a.arg for a in args], f"{mod}.{node.name} takes a config (cfg): pass an EngineSpec"
