"""`frink-mlx pull`, `frink-mlx import ollama:...` and `frink-mlx models` statuses as a
user runs them: a real subprocess against a fake Hub / fake Ollama store; errors
are one line with a hint, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))
from fake_hub import FakeHub, checkpoint_files
from test_sources import write_hf_cache, write_ollama_model

ROOT = Path(__file__).resolve().parents[1]


def run(tmp_path: Path, *args: str, **env_kw: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FRINK_MLX_", "HF_", "OLLAMA_"))}
    env.update(PYTHONPATH=str(ROOT), FRINK_MLX_CONFIG_DIR=str(tmp_path / "config"),
               FRINK_MLX_CACHE_DIR=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hfhome"),
               OLLAMA_MODELS=str(tmp_path / "ollama"), **env_kw)
    return subprocess.run([sys.executable, "-m", "frink_mlx.cli", *args], cwd=ROOT, env=env, check=False,
                          capture_output=True, text=True, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("frink-mlx: error: ")
    return lines[0]


@pytest.fixture()
def hub():
    fake = FakeHub().start()
    yield fake
    fake.stop()


def test_pull_downloads_then_serves_offline(hub: FakeHub, tiny_llama_dir: Path, tmp_path: Path) -> None:
    commit = hub.add_repo("org/tiny", checkpoint_files(tiny_llama_dir))
    proc = run(tmp_path, "pull", "org/tiny", HF_ENDPOINT=hub.url)
    assert proc.returncode == 0, proc.stderr
    snapshot = Path(proc.stdout.strip())
    assert snapshot == tmp_path / "hfhome" / "hub" / "models--org--tiny" / "snapshots" / commit
    assert "Traceback" not in proc.stderr
    offline = run(tmp_path, "pull", "org/tiny", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0 and offline.stdout.strip() == str(snapshot)


def test_pull_errors_are_one_line(hub: FakeHub, tiny_llama_dir: Path, tmp_path: Path) -> None:
    hub.add_repo("org/private", checkpoint_files(tiny_llama_dir), token="hf_right")
    line = one_line_error(run(tmp_path, "pull", "org/tiny", HF_HUB_OFFLINE="1"))
    assert "org/tiny is not in" in line and "HF_HUB_OFFLINE is set" in line
    assert "frink-mlx pull org/tiny" in line
    line = one_line_error(run(tmp_path, "pull", "org/missing", HF_ENDPOINT=hub.url))
    assert "Hugging Face repo 'org/missing' not found" in line
    line = one_line_error(run(tmp_path, "pull", "org/private", HF_ENDPOINT=hub.url, HF_TOKEN="hf_no"))
    assert "refused access to org/private (401)" in line and "HF_TOKEN" in line
    line = one_line_error(run(tmp_path, "pull", "org/private@v9", HF_ENDPOINT=hub.url,
                              HF_TOKEN="hf_right"))
    assert line.endswith("revision 'v9' not found in org/private")
    line = one_line_error(run(tmp_path, "pull", "org/tiny", HF_ENDPOINT="http://127.0.0.1:9"))
    assert "cannot download org/tiny and it is not cached" in line


def test_import_ollama_prints_the_checkpoint(tmp_path: Path, tiny_llama_dir: Path) -> None:
    from gguf_helpers import write_float_gguf

    gguf = write_float_gguf(tiny_llama_dir, tmp_path / "tiny.gguf")
    write_ollama_model(tmp_path / "ollama", "tiny", "latest", gguf, {"temperature": 0.2})
    proc = run(tmp_path, "import", "ollama:tiny")
    assert proc.returncode == 0, proc.stderr
    ckpt = Path(proc.stdout.strip())
    assert ckpt.parent == tmp_path / "cache" / "checkpoints" and (ckpt / "config.json").is_file()
    line = one_line_error(run(tmp_path, "import", "ollama:absent:7b"))
    assert "ollama:absent:7b is not in the Ollama store" in line and "ollama pull absent:7b" in line


def test_models_marks_what_it_would_refuse(tmp_path: Path, tiny_llama_dir: Path) -> None:
    import shutil

    from gguf_helpers import patch_tensor_type, write_float_gguf

    odd = tmp_path / "odd"
    shutil.copytree(tiny_llama_dir, odd)
    (odd / "config.json").write_text('{"model_type": "not_a_model"}')
    fp8 = tmp_path / "fp8"
    shutil.copytree(tiny_llama_dir, fp8)
    (fp8 / "config.json").write_text('{"model_type": "llama", "quantization": {"mode": "fp9"}}')
    q6 = write_float_gguf(tiny_llama_dir, tmp_path / "q6.gguf")
    patch_tensor_type(q6, "blk.1.ffn_down.weight", 99)  # a ggml type id no importer knows
    write_hf_cache(tmp_path / "hfhome" / "hub", "org/tiny", checkpoint_files(tiny_llama_dir), "b" * 40)
    models = tmp_path / "models.toml"
    models.write_text(f'default = "ok"\n[models.ok]\nsource = "{tiny_llama_dir}"\n'
                      f'[models.odd]\nsource = "{odd}"\n[models.fp8]\nsource = "{fp8}"\n'
                      f'[models.q6]\nsource = "{q6}"\n[models.hf]\nsource = "org/tiny"\n'
                      '[models.gone]\nsource = "org/gone"\n[models.ol]\nsource = "ollama:nope"\n')
    proc = run(tmp_path, "models")  # the packaged registry: the default model and its encoder
    assert proc.returncode == 0, proc.stderr
    status = {line.split()[0]: line for line in proc.stdout.splitlines()[2:]}
    assert "refused" not in status["minilm"] and "refused" not in status["smollm2"]
    proc = run(tmp_path, "models", "--models", str(models), HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr
    status = {line.split()[0]: line for line in proc.stdout.splitlines()[2:]}
    assert status["ok"].endswith("  available")
    assert status["odd"].endswith("refused: model_type 'not_a_model' is not supported by mlx-lm")
    assert "refused: quantization mode 'fp9' is not one MLX has" in status["fp8"]
    assert "  refused: " in status["q6"]  # in the GGUF importer's own words (models/gguf.py)
    assert status["hf"].endswith("available (Hugging Face cache)")
    assert status["gone"].endswith("unavailable: org/gone is not in the Hugging Face cache and "
                                   "HF_HUB_OFFLINE is set (run `frink-mlx pull org/gone` with "
                                   "network access, or unset HF_HUB_OFFLINE)")
    assert "unavailable: ollama:nope is not in the Ollama store" in status["ol"]


def test_serve_with_an_uncached_repo_offline_is_one_line(tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text('default = "a"\n[models.a]\nsource = "org/tiny"\n')
    line = one_line_error(run(tmp_path, "serve", "--port", "0", "--models", str(models),
                              HF_HUB_OFFLINE="1"))
    assert line.startswith("frink-mlx: error: the daemon did not start: the default model 'a' is "
                           "unavailable: org/tiny is not in the Hugging Face cache and HF_HUB_OFFLINE "
                           "is set (run `frink-mlx pull org/tiny` with network access, or unset "
                           "HF_HUB_OFFLINE)")
