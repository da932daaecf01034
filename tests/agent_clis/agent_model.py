"""A tiny checkpoint that answers every prompt with one fixed short sentence, then stops.

Why not plain random weights: the agents treat an answer cut by its token limit as
an error (Claude Code: "response exceeded the N output token maximum"), and a
random-weight model rarely emits its end-of-turn token. So the weights are random
where the cost is -- the attention projections run over every prompt token, the
KV cache and the prefix cache are the real ones -- and constructed where the answer
is decided: attention and MLP outputs are zero, so the last hidden state is the
current token's embedding, and the LM head maps it to the next token of ANSWER:

    any token outside ANSWER -> ANSWER[0] -> ANSWER[1] -> ... -> ANSWER[-1] -> <|im_end|>

Embedding of a non-answer token: K along dim 0; of ANSWER[k]: K along dim k + 1.
LM-head row of ANSWER[0] reads dim 0, of ANSWER[k + 1] dim k + 1, of <|im_end|> the
last answer token's dim; every other row is zero. The margin (~60 logits) makes
the chain hold at any temperature the agents send. One layer, hidden size 32, and
a 64k window: an agent's 10-40k-token first prompt prefills in seconds on two cores.
"""

from __future__ import annotations

import json
from pathlib import Path

from adapters.scripted import TOOLS_TEMPLATE
from conftest import make_tiny_llama

ANSWER = "Hello, 42."      # its tokens must be distinct (one chain step each)
CONTEXT = 65536
HIDDEN = 32
_K = 10.0        # embedding scale along the token's channel
_GAIN = 10.0     # LM-head weight: logit margin ~ _GAIN * sqrt(HIDDEN)


def make_agent_model(path: Path) -> Path:
    """Write the checkpoint (rules in the module docstring) into `path`."""
    import mlx.core as mx

    make_tiny_llama(path, chat_template=TOOLS_TEMPLATE, hidden_size=HIDDEN,
                    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                    intermediate_size=64, max_position_embeddings=CONTEXT,
                    tie_word_embeddings=False)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    chain = tok.encode(ANSWER, add_special_tokens=False).ids
    if len(set(chain)) != len(chain) or len(chain) >= HIDDEN:
        raise ValueError(f"ANSWER's tokens must be distinct and fewer than {HIDDEN}: {chain}")
    eos = json.loads((path / "config.json").read_text())["eos_token_id"]
    weights = mx.load(str(path / "model.safetensors"))
    vocab = weights["model.embed_tokens.weight"].shape[0]
    embed = [[0.0] * HIDDEN for _ in range(vocab)]
    head = [[0.0] * HIDDEN for _ in range(vocab)]
    for token in range(vocab):
        embed[token][0] = _K
    for k, token in enumerate(chain):
        embed[token][0], embed[token][k + 1] = 0.0, _K
        head[token][k] = _GAIN           # ANSWER[0] reads dim 0, ANSWER[k] reads dim k
    head[eos][len(chain)] = _GAIN
    weights["model.embed_tokens.weight"] = mx.array(embed, dtype=mx.float32)
    weights["lm_head.weight"] = mx.array(head, dtype=mx.float32)
    for name in list(weights):
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = mx.zeros(weights[name].shape, dtype=mx.float32)
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path
