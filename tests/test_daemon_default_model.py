"""The packaged default model through the daemon equals mlx_lm on the same weights,
with speculative decoding on (the default; an editor's request drafts) and off.

Slow: imports the SmolLM2 GGUF into a temp cache and loads it.
"""

from __future__ import annotations

import openai
import pytest
from daemon_support import generation_factory, start_server

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

pytestmark = pytest.mark.slow

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name three colours."}],
    # an editor's request: most of the answer is in the prompt, so prompt lookup drafts
    [{"role": "user", "content": "Rewrite this function with `total` renamed to `acc`:\n\n"
      "def add_all(values):\n    total = 0\n    for value in values:\n"
      "        total = total + value\n    return total\n"}],
]


def test_greedy_daemon_equals_mlx_lm_on_smollm2(smollm2_dir, tmp_path):
    from mlx_lm import stream_generate

    toml = tmp_path / "models.toml"
    toml.write_text(f'default = "smol"\n[models.smol]\nsource = "{smollm2_dir}"\n')
    settings = Settings.load(models_path=str(toml), access_log=False,
                             cache_dir=str(tmp_path / "cache"))
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    live = start_server(app)
    try:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=300)
        loaded = live.state.hub.current.loaded  # the very weights the daemon serves
        tok = loaded.tokenizer
        drafted = 0
        for messages in PROMPTS:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True)
            ref = [r.token for r in stream_generate(loaded.model, tok, ids, max_tokens=24)]
            ref = [t for t in ref if t not in tok.eos_token_ids]
            expected = tok.decode(ref, skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)
            got = client.chat.completions.create(model="smol", messages=messages, max_tokens=24,
                                                 temperature=0, logprobs=True)
            choice = got.choices[0]
            assert choice.message.content == expected
            assert got.usage.completion_tokens == len(ref) + (choice.finish_reason == "stop")
            drafted += (got.usage.model_extra or {}).get("draft_tokens") or 0
            off = client.chat.completions.create(  # speculation off: the same tokens
                model="smol", messages=messages, max_tokens=24, temperature=0,
                extra_body={"speculative": False})
            assert off.choices[0].message.content == expected
        assert drafted > 0  # the editor's request was answered with drafts verified
    finally:
        live.stop()
