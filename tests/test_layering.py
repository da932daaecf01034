"""The layering docs/ARCHITECTURE.md promises, pinned (its "Layers" rules 1-5 and 8).

- core/ and the KV accounting / scheduler modules import neither MLX nor Starlette;
- every adapter module imports no MLX (it translates wire formats, nothing more).
Each group is imported in a fresh interpreter and its sys.modules inspected.
- The static import graph (every `import` in every module, in-function ones
  included, read with `ast`): engine/ imports nothing above it, backend/cpu is
  reached only through backend/, the registry imports no engine, model or
  backend code, and nothing below serving/ imports Settings.
- The command line is one room: only cli/ imports cli/ or app.py, only cli/
  parses argv (argparse, getopt, optparse, sys.argv), and the package root
  holds the library's modules alone.


- No import circles anywhere in the package: the module graph (below) has no
  cycle, so every module can be read after the modules it imports.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import frink_mlx.adapters
import frink_mlx.core


def _modules(package: object) -> list[str]:
    prefix = package.__name__ + "."  # type: ignore[attr-defined]
    found = [package.__name__]  # type: ignore[attr-defined]
    found += [m.name for m in pkgutil.walk_packages(package.__path__, prefix)]  # type: ignore[attr-defined]
    return found


ACCOUNTING = ["frink_mlx.engine.scheduler", "frink_mlx.engine.kv.block_pool",
              "frink_mlx.engine.kv.manager", "frink_mlx.engine.kv.hashing",
              "frink_mlx.engine.kv.slots", "frink_mlx.engine.kv.snapshots",
              "frink_mlx.engine.admission", "frink_mlx.engine.plan"]


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            "print('\\n'.join(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def _roots(loaded: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if m.split(".")[0] in roots)


@pytest.mark.parametrize("group", ["core", "accounting"])
def test_core_and_accounting_import_no_mlx_nor_starlette(group: str) -> None:
    modules = _modules(frink_mlx.core) if group == "core" else ACCOUNTING
    bad = _roots(_loaded_after_import(modules), ("mlx", "mlx_lm", "starlette"))
    assert bad == [], f"{group} pulled in {bad[:5]}"


def test_adapters_import_no_mlx() -> None:
    bad = _roots(_loaded_after_import(_modules(frink_mlx.adapters)), ("mlx", "mlx_lm"))
    assert bad == [], f"adapters pulled in {bad[:5]}"


# --- the static import graph -------------------------------------------------------

PACKAGE = Path(frink_mlx.core.__file__).parent.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every frink_mlx module `path` imports (absolute names, in-function imports too)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m == "frink_mlx" or m.startswith("frink_mlx.")}


GRAPH = {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _offenders(importers: str, forbidden: tuple[str, ...]) -> list[str]:
    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    return sorted(f"{mod} -> {dep}" for mod, deps in GRAPH.items() if under(mod, importers)
                  for dep in deps if any(under(dep, f) for f in forbidden))


def test_engine_imports_nothing_above_it() -> None:
    above = ("frink_mlx.serving", "frink_mlx.adapters", "frink_mlx.app", "frink_mlx.http",
             "frink_mlx.cli")
    assert _offenders("frink_mlx.engine", above) == []


def test_backend_cpu_only_through_the_seam() -> None:
    bad = [line for line in _offenders("frink_mlx", ("frink_mlx.backend.cpu",))
           if not line.startswith("frink_mlx.backend")]
    assert bad == []


def test_registry_imports_no_engine_models_or_backend() -> None:
    lower = ("frink_mlx.engine", "frink_mlx.models", "frink_mlx.backend", "frink_mlx.serving")
    assert _offenders("frink_mlx.registry", lower) == []


@pytest.mark.parametrize("layer", ["serving", "engine", "models", "backend", "core", "adapters"])
def test_nothing_below_the_root_imports_settings(layer: str) -> None:
    assert _offenders(f"frink_mlx.{layer}", ("frink_mlx.settings",)) == []


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_nothing_imports_the_entry_points_or_the_root() -> None:
    """Only the commands (cli/) import the commands or the composition root (app.py)."""
    roots = ("frink_mlx.app", "frink_mlx.cli")
    bad = [line for line in _offenders("frink_mlx", roots)
           if not _under(line.split(" -> ")[0], "frink_mlx.cli")]
    assert bad == []


ARGV_MODULES = ("argparse", "getopt", "optparse")


def _argv_uses(path: Path) -> list[str]:
    """`import argparse` (getopt, optparse) or a `sys.argv` read in `path`, as "line: what"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        found += [f"{node.lineno}: import {n}" for n in names if n.split(".")[0] in ARGV_MODULES]
        if (isinstance(node, ast.Attribute) and node.attr == "argv"
                and isinstance(node.value, ast.Name) and node.value.id == "sys") or (
                isinstance(node, ast.ImportFrom) and node.module == "sys"
                and any(a.name == "argv" for a in node.names)):
            found.append(f"{node.lineno}: sys.argv")
    return found


def test_only_the_command_line_parses_argv() -> None:
    """cli/ is the one home of argv; the layers below take values. The OpenBLAS re-exec
    (backend/cpu/blas.py) is handed sys.argv by the commands through `select_backend(argv=)`
    and replays it, parsing nothing (its `sys.orig_argv` read keeps `-m pkg`)."""
    cli = PACKAGE / "cli"
    bad = [f"{p.relative_to(PACKAGE)}:{use}" for p in sorted(PACKAGE.rglob("*.py"))
           if cli not in p.parents for use in _argv_uses(p)]
    assert bad == []
    assert _argv_uses(cli / "main.py"), "the check must see the parser where it is"


# The package root keeps the library: what the daemon and its tests build on. A command,
# or anything that prints for a person, goes into cli/.
ROOT_MODULES = {
    "__init__": "the version",
    "app": "the composition root: create_app(settings)",
    "config": "the config slices each layer takes",
    "errors": "the one error tree",
    "metrics": "the Prometheus metrics the daemon exports",
    "registry": "models.toml -> ModelSpec",
    "settings": "frozen Settings, the only reader of os.environ",
}


def test_the_root_holds_only_the_library() -> None:
    extra = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ROOT_MODULES)
    assert extra == [], "a new root module: a command goes into cli/, else name it here"


# --- no import circles --------------------------------------------------------------
# The module graph: a -> b when module a imports module b anywhere -- at module level, in
# a function (a lazy import is still a dependency; only its cost is deferred), or under
# TYPE_CHECKING (a type names the module it comes from: a reader walks that circle too).
# An import that runs also runs its target's packages first (their __init__), so it adds
# an edge to each of them that is not already a package of the importer; a type-only
# import runs nothing and names its module alone.

MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _packages_of(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _import_nodes(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs (False: under `if TYPE_CHECKING`)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, runs))
        for child in ast.iter_child_nodes(node):
            typing_only = isinstance(node, ast.If) and child in node.body and \
                "TYPE_CHECKING" in ast.unparse(node.test)
            visit(child, runs and not typing_only)

    visit(tree, True)
    return found


def _module_edges(path: Path) -> set[str]:
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: set[str] = set()
    for node, runs in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = {a.name for a in node.names}
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names}
        for target in targets & MODULES.keys():
            edges.add(target)
            if runs:
                edges |= _packages_of(target) - _packages_of(name)
    return edges & MODULES.keys() - {name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                connect(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_circle_finder_finds_circles() -> None:
    """The check below is only as good as this: a two-module and a three-module circle,
    a self-free chain and a diamond (no circle)."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"g", "h"},
             "g": {"i"}, "h": {"i"}, "i": set()}
    assert _circles(graph) == [["a", "b"], ["c", "d", "e"]]


def test_the_module_graph_reads_every_kind_of_import() -> None:
    """Function-level, TYPE_CHECKING and package-running edges are all in the graph."""
    edges = {name: _module_edges(path) for name, path in MODULES.items()}
    assert "frink_mlx.serving.hub" in edges["frink_mlx.serving.embeddings"]
    assert "frink_mlx.engine.speculative.lookup" in edges["frink_mlx.engine.plan"]  # typing
    assert "frink_mlx.engine.speculative" not in edges["frink_mlx.engine.plan"]  # runs nothing
    assert "frink_mlx.models.gguf.importer" in edges["frink_mlx.models.gguf"]  # in a function
    assert "frink_mlx.adapters.llamacpp" in edges["frink_mlx.adapters.openai.wire"]  # its __init__


def test_no_import_circles() -> None:
    graph = {name: _module_edges(path) for name, path in MODULES.items()}
    assert _circles(graph) == []


# --- the typed request boundary (serving/frontend.py, http/frontend.py) -------------

def _reads_app_state(path: Path) -> list[int]:
    """Lines where `path` reads `<x>.app.state` or `app.state` (Starlette's untyped bag)."""
    def is_app(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "app") or \
            (isinstance(node, ast.Attribute) and node.attr == "app")

    return sorted(node.lineno for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Attribute) and node.attr == "state"
                  and is_app(node.value))


@pytest.mark.parametrize("layer", ["adapters", "http"])
def test_routes_reach_serving_only_through_the_typed_accessor(layer: str) -> None:
    """adapters/ and http/ get the Frontend from `frontend(request)` (http/frontend.py
    rule 1), never from `app.state`; only the accessor's own module touches it."""
    own = PACKAGE / "http" / "frontend.py"
    bad = {str(p.relative_to(PACKAGE)): lines for p in sorted((PACKAGE / layer).rglob("*.py"))
           if p != own and (lines := _reads_app_state(p))}
    assert bad == {}


def test_adapters_import_serving_for_types_only() -> None:
    """At run time an adapter imports no serving module but the stored-responses store
    (plain data); the Frontend, Run and Generation are types under TYPE_CHECKING."""
    allowed = {"frink_mlx.serving.responses_store"}
    bad = []
    for path in sorted((PACKAGE / "adapters").rglob("*.py")):
        tree = ast.parse(path.read_text())
        guarded = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in guarded \
                    and "serving" in (node.module or "").split("."):
                module = "frink_mlx.serving." + (node.module or "").split("serving.")[-1]
                if module not in allowed:
                    bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {module}")
    assert bad == []


# --- one file shape per protocol (adapters/endpoint.py rule 7) ------------------------

PROTOCOLS = ("openai", "anthropic", "llamacpp", "ollama")
BUILDERS = {"openai": ["ChatBuilder", "ResponseBuilder"], "anthropic": ["MessageBuilder"],
            "llamacpp": ["CompletionBuilder"], "ollama": ["AnswerBuilder"]}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_protocol_has_wire_translate_and_frames(protocol: str) -> None:
    names = {p.name for p in (PACKAGE / "adapters" / protocol).glob("*.py")}
    assert {"wire.py", "translate.py", "frames.py"} <= names


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_builder_speaks_the_one_frame_interface(protocol: str) -> None:
    """start / feed / end / result (endpoint.FrameBuilder), whatever the protocol."""
    import importlib

    from frink_mlx.adapters.endpoint import FrameBuilder

    wanted = {n for n in vars(FrameBuilder) if not n.startswith("_")}
    for name in BUILDERS[protocol]:
        found = None
        for module in ("frames", "responses_events"):
            try:
                found = getattr(importlib.import_module(
                    f"frink_mlx.adapters.{protocol}.{module}"), name, None) or found
            except ModuleNotFoundError:
                continue
        assert found is not None, name
        assert wanted <= set(dir(found)), (name, wanted - set(dir(found)))


def test_adapters_write_json_with_one_encoder() -> None:
    """Frames and bodies go through endpoint.dumps / json_response; json.dumps is left only
    where a translation writes arguments into the prompt (translate.py, responses_tools.py)."""
    prompt_side = {"translate.py", "responses_tools.py"}
    bad = []
    for path in sorted((PACKAGE / "adapters").rglob("*.py")):
        if path.name == "endpoint.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not isinstance(node.value, (ast.Name, ast.Attribute)):
                continue
            owner = ast.unparse(node.value)
            if (owner == "msgspec.json" and node.attr in ("encode", "Encoder")) or \
                    (owner == "json" and node.attr == "dumps" and path.name not in prompt_side):
                bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert bad == []
