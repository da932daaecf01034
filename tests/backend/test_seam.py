"""The backend seam (frink_mlx/backend): one object answers device questions.

- With the Metal backend selected (simulated: the object built explicitly,
  as select_backend builds it on a Mac), a model loaded and served through
  the engine leaves every `mlx_lm.models.*` module, and the model instance
  itself, exactly as mlx-lm made them; greedy outputs equal mlx-lm's own.
- The CPU backend changes the one model it prepared (its layers' classes),
  never an mlx-lm module: another model of the same family stays stock.
- Layering: `frink_mlx.backend.cpu` is imported only inside frink_mlx/backend;
  the backend imports nothing above it; the engine nothing from serving/ or
  adapters/; importing the seam loads no MLX (the OpenBLAS re-exec must come first).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.generate import generate_step

import frink_mlx
from frink_mlx.backend import Backend, backend_name, select_backend
from frink_mlx.backend.metal import MetalBackend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.types import SeqRequest
from frink_mlx.errors import ConfigError
from frink_mlx.models.loader import load_model
from frink_mlx.registry import ModelSpec
from frink_mlx.settings import Settings

PACKAGE = Path(frink_mlx.__file__).parent
PROMPTS = [[5, 17, 33, 9, 60, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
NUM_TOKENS = 8


def mlx_lm_models_snapshot() -> dict[tuple[str, str], Any]:
    """Every attribute of every loaded `mlx_lm.models.*` module, and of every class
    defined there, by (owner, name) -> the object itself (compared by identity)."""
    snap: dict[tuple[str, str], Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "mlx_lm.models" or name.startswith("mlx_lm.models.")):
            continue
        for attr, value in list(vars(module).items()):
            snap[(name, attr)] = value
            if isinstance(value, type) and value.__module__ == name:
                for cattr, cvalue in list(vars(value).items()):
                    snap[(f"{name}.{attr}", cattr)] = cvalue
    return snap


_ABSENT = object()


def changed(before: dict[tuple[str, str], Any], after: dict[tuple[str, str], Any]) -> list[str]:
    """Attributes replaced, added or removed on the owners of `before`."""
    owners = {owner for owner, _ in before}
    keys = set(before) | {k for k in after if k[0] in owners}
    return sorted(f"{o}.{a}" for o, a in keys
                  if before.get((o, a), _ABSENT) is not after.get((o, a), _ABSENT))


def serve(loaded: Any, backend: Backend) -> list[list[int]]:
    """Greedy tokens of PROMPTS through a real engine on `backend`."""
    config = EngineConfig(block_size=4, num_blocks=64, max_batch=4, prefill_chunk_tokens=5,
                          batching=True, context_ceiling=256, max_queue=8, queue_timeout_s=60.0)
    engine = Engine(loaded, resolve_engine_config(config, loaded, backend), DecodeGate(), backend)
    engine.start()
    try:
        streams = [engine.submit(SeqRequest(f"r{i}", p, SamplingParams(temperature=0), NUM_TOKENS))
                   for i, p in enumerate(PROMPTS)]
        return [[out.token_id for out in stream if out.token_id is not None] for stream in streams]
    finally:
        engine.shutdown(10.0)


def reference(model: Any) -> list[list[int]]:
    return [[int(t) for t, _ in generate_step(mx.array(p), model, max_tokens=NUM_TOKENS)]
            for p in PROMPTS]


def stock_layers(model: nn.Module) -> list[str]:
    """Modules of `model` that are not mlx / mlx-lm's own classes."""
    return [f"{path}: {type(m).__module__}.{type(m).__qualname__}"
            for path, m in model.named_modules()
            if not type(m).__module__.startswith(("mlx_lm.", "mlx.nn"))
            or any(k.startswith("_frink") for k in vars(m))]


def load(tiny_llama_dir: Path, tmp_path: Path, backend: Backend) -> Any:
    settings = Settings(config_dir=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    return load_model(ModelSpec(name="tiny", source=str(tiny_llama_dir)), settings, backend)


def test_metal_backend_replaces_nothing_in_mlx_lm_nor_in_the_model(tiny_llama_dir, tmp_path):
    import mlx_lm.models.llama  # noqa: F401 - the family the tiny model uses, loaded before the snapshot

    backend = MetalBackend()
    before = mlx_lm_models_snapshot()
    loaded = load(tiny_llama_dir, tmp_path, backend)
    assert stock_layers(loaded.model) == []
    want = reference(loaded.model)
    got = serve(loaded, backend)
    assert changed(before, mlx_lm_models_snapshot()) == []
    assert stock_layers(loaded.model) == []
    assert got == want


def test_cpu_backend_changes_only_the_model_it_prepared(tiny_llama_dir, tmp_path):
    from mlx_lm import load as mlx_lm_load
    from mlx_lm.models import llama

    backend = select_backend(Settings(cpu_matmul_parts=2).backend_config(), name="cpu")
    before = mlx_lm_models_snapshot()
    loaded = load(tiny_llama_dir, tmp_path, backend)
    bystander, _ = mlx_lm_load(str(tiny_llama_dir))
    want = reference(loaded.model)
    got = serve(loaded, backend)
    assert changed(before, mlx_lm_models_snapshot()) == []
    assert stock_layers(bystander) == []
    assert type(loaded.model.layers[0].self_attn) is not llama.Attention  # routed (kernels.py)
    assert got == want


def test_the_choice_and_the_questions():
    assert backend_name("metal") == "metal" and backend_name("cpu") == "cpu"
    with pytest.raises(ConfigError, match="unknown backend"):
        backend_name("cuda")
    if sys.platform != "darwin":
        assert backend_name() == "cpu"
    metal = MetalBackend()
    cpu = select_backend(Settings().backend_config(), name="cpu")
    assert (metal.name, cpu.name) == ("metal", "cpu")
    assert metal.pipelines_steps() and not cpu.pipelines_steps()
    assert metal.device_token_masks() and not cpu.device_token_masks()
    assert not metal.dequantize_by_default(1) and cpu.dequantize_by_default(1)
    assert cpu.memory_budget().source == "ram" and cpu.memory_budget().nbytes > 0
    assert metal.memory_budget().nbytes > 0


def test_importing_the_seam_loads_no_mlx():
    code = ("import sys, frink_mlx.backend, frink_mlx.backend.cpu.blas, "
            "frink_mlx.cli.serve, frink_mlx.cli.chat.command\n"
            "print(sorted(m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _imports(path: Path) -> set[str]:
    """Absolute names of the frink_mlx modules `path` imports (relative ones resolved)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return {name for name in found if name.startswith("frink_mlx")}


def _offenders(inside: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((PACKAGE / inside).rglob("*.py")):
        for name in _imports(path):
            if name.startswith(forbidden):
                bad.append(f"{path.relative_to(PACKAGE)} imports {name}")
    return bad


def test_layering_of_the_seam():
    outside = [p for p in PACKAGE.rglob("*.py") if "backend" not in p.relative_to(PACKAGE).parts[:1]]
    via_cpu = [f"{p.relative_to(PACKAGE)} imports {n}" for p in outside for n in _imports(p)
               if n == "frink_mlx.backend.cpu" or n.startswith("frink_mlx.backend.cpu.")]
    assert via_cpu == []
    up = tuple(f"frink_mlx.{layer}" for layer in ("engine", "serving", "adapters", "models",
                                                   "app", "http", "cli"))
    assert _offenders("backend", up) == []
    assert _offenders("engine", ("frink_mlx.serving", "frink_mlx.adapters", "frink_mlx.app")) == []
