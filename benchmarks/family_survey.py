"""Every model file mlx-lm ships, as a tiny random checkpoint on the paged engine (issue 29).

Why: a family the engine cannot run must be refused when it loads, in one
line naming it (models/loader.py rule 10, engine/kv/specs.py rule 3), never
found out as a failure on the first request. This script finds out which is
which for every `mlx_lm/models/*.py` that defines `Model` and `ModelArgs`:

1. A config is made from the module's own `ModelArgs`: every field without a
   default (or defaulting to None) gets a small value from `GENERIC` (dimension fields get it even
   where they have a default, so nothing is 4096 wide); `OVERRIDES` adds what
   a family needs beyond that; the families of tests/engine/hybrid_support.py
   use its configs (one source). `SKIPPED` names files that are no model
   (helpers) or cannot be made here, each with its reason; a file that needs a
   `text_config` of another model file (a VLM wrapper) is skipped saying so.
2. The model gets small random weights (norms one), is saved as an mlx-lm
   checkpoint (config.json + model.safetensors) and loaded back with
   `mlx_lm.utils.load_model` (sanitize included); where that round trip fails
   the row says so and the in-memory model is used.
3. Load check, as the loader does it: a warm-up forward (one that raises is
   refused, loader rule 10), then `model_cache_spec` (UnsupportedModel):
   "refused at load".
4. Engine: one 13-token prompt alone, then 4 rows of 9/4/17/23 tokens
   batched with prefill chunks of 5 tokens; greedy ids of every row against
   `mlx_lm.generate.generate_step` run alone on that prompt.

Each family runs in its own subprocess (a crash or a hang is one row, not the
run) with `--timeout` seconds. Output: a markdown table on stdout.

    python benchmarks/family_survey.py [--only gemma3_text,llama] [--timeout 240]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import random
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "engine")]

VOCAB = 300
# Small values for fields most ModelArgs share (rule 1). "dims" are set even
# where the field has a default.
DIMS: dict[str, Any] = {
    "hidden_size": 64, "dim": 64, "d_model": 64, "n_embd": 64, "n_embed": 64, "embed_dim": 64,
    "num_hidden_layers": 2, "n_layers": 2, "n_layer": 2, "num_layers": 2,
    "intermediate_size": 96, "ffn_dim": 96, "hidden_dim": 96, "n_inner": 96, "ffn_hidden_size": 96,
    "num_attention_heads": 4, "n_heads": 4, "n_head": 4, "num_heads": 4,
    "num_key_value_heads": 2, "n_kv_heads": 2, "num_kv_heads": 2, "multi_query_group_num": 2,
    "head_dim": 16, "vocab_size": VOCAB, "max_position_embeddings": 512,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_k": 2, "moe_topk": 2, "top_k": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_shared_expert_intermediate_size": 32,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "sliding_window": 6, "sliding_window_size": 6, "attention_window_size": 6, "rotary_dim": 8,
    "state_size": 16, "ssm_state_size": 16, "mamba_d_state": 16, "time_step_rank": 4,
    "conv_kernel": 4, "mamba_d_conv": 4, "n_groups": 1, "mamba_expand": 2,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    "a_low_rank_dim": 8, "v_low_rank_dim": 8, "gate_low_rank_dim": 8, "decay_low_rank_dim": 8,
}
GENERIC: dict[str, Any] = {
    **DIMS, "rms_norm_eps": 1e-5, "norm_eps": 1e-5, "layer_norm_eps": 1e-5,
    "layer_norm_epsilon": 1e-5, "rope_theta": 10000.0, "rope_traditional": False,
    "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False,
    "mlp_bias": False, "bias": False, "partial_rotary_factor": 1.0, "rotary_dim": 16,
    "max_seq_len": 512, "context_length": 512, "n_positions": 512, "seq_length": 512,
    "norm_topk_prob": True, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "topk_method": "greedy", "moe_layer_freq": 1, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "n_ctx": 512, "rotary_emb_base": 10000.0, "rotary_pct": 0.5,
    "logits_scaling": 1.0, "attention_multiplier": 0.25, "embedding_multiplier": 1.0,
    "residual_multiplier": 1.0, "block_size": 512, "logits_soft_cap": 30.0,
    "time_step_limit": [0.001, 100.0], "num_shared_expert": 1, "cla_share_factor": 1,
    "conv_L_cache": 3, "num_dense_layers": 1, "intermediate_size_mlp": 96,
    "no_rope_layers": [], "conv_window": 2, "layer_group_size": 2, "group_norm_size": 1,
    "num_kv_reuse_layers": 1, "model_max_length": 512,
}
# A required bool field not named above gets False (a feature switch, off).
BOOL_DEFAULT = False
# Family-specific fields beyond GENERIC (rule 1).
SW, FULL = "sliding_attention", "full_attention"
OVERRIDES: dict[str, dict[str, Any]] = {
    "afmoe": {"layer_types": [SW, FULL], "num_dense_layers": 1},
    "gear": {"layer_types": [SW, FULL]},
    "exaone_moe": {"layer_types": [SW, FULL], "is_moe_layer": [False, True]},
    "baichuan_m1": {"sliding_window_layers": [0]},
    "apertus": {"qk_norm": True},
    "dbrx": {"ffn_config": {"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 2},
             "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0}},
    "jamba": {"attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1,
              "expert_layer_period": 2, "mamba_conv_bias": True},
    "kimi_linear": {"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2],
                                           "num_heads": 4, "head_dim": 16,
                                           "short_conv_kernel_size": 4}},
    "lfm2_moe": {"layer_types": ["conv", FULL]},
    "mamba2": {"num_heads": 4, "head_dim": 32, "intermediate_size": 128},
    "minicpm": {"dim_model_base": 64, "scale_depth": 1.0, "scale_emb": 1.0},
    "minicpm3": {"dim_model_base": 64, "scale_depth": 1.0, "scale_emb": 1.0,
                 "rope_scaling": {"original_max_position_embeddings": 512, "short_factor": 1.0,
                                  "long_factor": 1.0}},
    "phixtral": {"model_dim": 64, "num_vocab": VOCAB},  # its own names: 2560 wide otherwise
    "deepseek_v2": {"rope_scaling": {"factor": 1.0, "original_max_position_embeddings": 512,
                                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                     "mscale_all_dim": 0}},
    "hunyuan": {"rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"}},
    "ministral3": {"rope_parameters": {"llama_4_scaling_beta": 0.1, "rope_theta": 10000.0,
                                       "original_max_position_embeddings": 512,
                                       "rope_type": "default"}},
    "spark2_5": {"layer_types": [SW, FULL], "rope_parameters": {SW: {"rope_theta": 10000.0},
                                                                FULL: {"rope_theta": 10000.0}}},
    "glm_moe_dsa": {"index_head_dim": 16, "index_n_heads": 2, "index_topk": 4,
                    "topk_method": "noaux_tc",
                    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}},
    "mistral4": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                     "llama_4_scaling_beta": 0.1, "factor": 1.0,
                                     "original_max_position_embeddings": 512}},
    # mla_scale_*_lora False leave their attributes unset in 0.32.2's file: True
    "longcat_flash": {"attention_method": "MLA", "zero_expert_type": "identity",
                      "expert_ffn_hidden_size": 32, "zero_expert_num": 1, "mla_scale_q_lora": True,
                      "mla_scale_kv_lora": True},
    "longcat_flash_ngram": {"expert_ffn_hidden_size": 32, "zero_expert_num": 1,
                            "mla_scale_q_lora": True, "mla_scale_kv_lora": True},
    "nemotron": {"hidden_act": "relu2"},
    "mimo_v2_flash": {"hybrid_layer_pattern": [1, 0], "moe_layer_freq": [0, 1],
                      "layernorm_epsilon": 1e-5, "swa_rope_theta": 10000.0,
                      "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
                      "swa_head_dim": 16, "swa_v_head_dim": 16, "partial_rotary_factor": 1,
                      "topk_method": "noaux_tc"},
    "qwen": {"kv_channels": 16},
    "plamo": {"n_shared_head": 2},
    "minimax": {"shared_intermediate_size": 32},
    "recurrent_gemma": {"conv1d_width": 4, "block_types": ["recurrent", "attention"]},
    "mellum": {"layer_types": [SW, FULL], "rope_parameters": {SW: {"rope_theta": 10000.0},
                                                              FULL: {"rope_theta": 10000.0}}},
    "step3p5": {"num_attention_groups": 2, "moe_top_k": 2},
    "llama4_text": {"no_rope_layers": [1, 1]},
    "smollm3": {"no_rope_layers": [1, 1]},
    "gemma4": {"text_config": {}},  # filled from hybrid_support's gemma4_text below
    "gemma3": {"text_config": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 3,
                               "intermediate_size": 96, "num_attention_heads": 4, "head_dim": 16,
                               "num_key_value_heads": 2, "vocab_size": VOCAB,
                               "sliding_window": 6, "sliding_window_pattern": 3,
                               "query_pre_attn_scalar": 16.0}, "vocab_size": VOCAB},
    "gemma2": {"query_pre_attn_scalar": 16.0},
    "gemma3n": {},
    "cohere2": {"sliding_window_pattern": 2, "layer_norm_eps": 1e-5},
    "olmo3": {"layer_types": ["sliding_attention", "full_attention"]},
    "exaone4": {"sliding_window_pattern": "LG"},
    "openelm": {"num_transformer_layers": 2, "model_dim": 64, "head_dim": 16,
                "num_query_heads": [4, 4], "num_kv_heads": [2, 2], "ffn_multipliers": [1.0, 1.0],
                "ffn_dim_divisor": 16},
    "phi3small": {"dense_attention_every_n_layers": 2, "gegelu_limit": 20.0,
                  "blocksparse_block_size": 32, "blocksparse_num_local_blocks": 2,
                  "blocksparse_vert_stride": 2, "ff_intermediate_size": 96,
                  "layer_norm_epsilon": 1e-5, "mup_attn_multiplier": 1.0,
                  "mup_embedding_multiplier": 1.0, "mup_use_scaling": True,
                  "mup_width_multiplier": 1.0, "rope_embedding_base": 10000.0,
                  "rope_position_scale": 1.0},
}
SKIPPED: dict[str, str] = {
    name: "a helper module, not a model file" for name in (
        "activations", "base", "bitlinear_layers", "cache", "gated_delta", "mla", "pipeline",
        "rope_utils", "ssm", "switch_layers")
}


WRAPPER = ("a wrapper around a text_config of another model file (vision-language or "
           "multimodal); that language model is surveyed under its own file")


def model_files() -> list[str]:
    import mlx_lm.models as pkg

    return sorted(p.stem for p in Path(pkg.__path__[0]).glob("*.py") if p.stem != "__init__")


def make_config(family: str) -> dict[str, Any]:
    """Rule 1: the family's config from its ModelArgs."""
    from hybrid_support import CONFIGS, REFUSED, config

    if family in CONFIGS or family in REFUSED:
        return config(family)
    module = importlib.import_module(f"mlx_lm.models.{family}")
    args_cls = module.ModelArgs
    cfg: dict[str, Any] = {"model_type": family}
    for f in dataclasses.fields(args_cls):
        has_default = (f.default is not dataclasses.MISSING
                       or f.default_factory is not dataclasses.MISSING)
        if f.name in DIMS or ((not has_default or f.default is None) and f.name in GENERIC):
            cfg[f.name] = GENERIC[f.name]
    for key, value in OVERRIDES.get(family, {}).items():
        cfg[key] = value
    if family == "gemma4":
        cfg["text_config"] = config("gemma4_text")
    for f in dataclasses.fields(args_cls):
        if f.name not in cfg and f.type in (bool, "bool") and f.default is dataclasses.MISSING:
            cfg[f.name] = BOOL_DEFAULT
    if "text_config" not in cfg and any(f.name == "text_config" and f.default is
                                        dataclasses.MISSING for f in dataclasses.fields(args_cls)):
        raise NotImplementedError(WRAPPER)
    missing = [f.name for f in dataclasses.fields(args_cls) if f.name not in cfg
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise LookupError(f"ModelArgs fields with no small value here: {', '.join(missing)}")
    return cfg


def build(family: str, cfg: dict[str, Any]) -> Any:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    module = importlib.import_module(f"mlx_lm.models.{family}")
    model = module.Model(module.ModelArgs.from_dict(cfg))
    mx.random.seed(3)
    params = [(k, mx.ones(v.shape) if k.endswith("norm.weight") else
               mx.random.normal(v.shape) * 0.2) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def round_trip(model: Any, cfg: dict[str, Any], path: Path) -> tuple[Any, str]:
    """Rule 2: saved and loaded back by mlx-lm, or the in-memory model and why."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    try:
        loaded, _ = load_model(path)
        return loaded, ""
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return model, f"checkpoint round trip failed ({type(exc).__name__}: {_short(exc)}); " \
                      "in-memory model used"


def survey_one(family: str) -> dict[str, str]:
    """Rules 1-4 for one family: {'status', 'detail'}."""
    import mlx.core as mx

    if family in SKIPPED:
        return {"status": "skipped", "detail": SKIPPED[family]}
    module = importlib.import_module(f"mlx_lm.models.{family}")
    if not (inspect.isclass(getattr(module, "Model", None))
            and dataclasses.is_dataclass(getattr(module, "ModelArgs", None))):
        return {"status": "skipped", "detail": "no Model / ModelArgs dataclass in the file"}
    try:
        cfg = make_config(family)
        model = build(family, cfg)
    except NotImplementedError as exc:
        return {"status": "skipped", "detail": str(exc)}
    except Exception as exc:  # noqa: BLE001
        return {"status": "not made", "detail": f"{type(exc).__name__}: {_short(exc)}"}
    with tempfile.TemporaryDirectory() as tmp:
        model, note = round_trip(model, cfg, Path(tmp) / family)
    try:
        mx.eval(model(mx.array([[1, 2]])))  # the loader's warm-up
    except Exception as exc:  # noqa: BLE001
        # A device limit is the loader's refusal (rule 10); a shape error is this script's
        # small config not fitting the file (a "not made" row, named as such).
        device = "Metal" in str(exc)
        return {"status": "refused at load" if device else "not made",
                "detail": note + f"mlx-lm's own forward of model file {family} fails here "
                f"({type(exc).__name__}: {_short(exc)})" + (" (loader rule 10)" if device else
                                                             " with this config")}
    from frink_mlx.engine.kv.specs import UnsupportedModel, model_cache_spec

    try:
        spec = model_cache_spec(model)
    except UnsupportedModel as exc:
        return {"status": "refused at load", "detail": (note + " " + str(exc)).strip()}
    kinds = _kinds(spec)
    try:
        mismatches = _engine_checks(model)
    except Exception as exc:  # noqa: BLE001
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        return {"status": "FAILS", "detail": f"{kinds}; {type(exc).__name__}: {_short(exc)} "
                f"({Path(tb.filename).name}:{tb.lineno}) {note}".strip()}
    if mismatches:
        return {"status": "DIFFERENT IDS", "detail": f"{kinds}; {', '.join(mismatches)} {note}"}
    return {"status": "served, mlx-lm's ids", "detail": f"{kinds} {note}".strip()}


def _kinds(spec: Any) -> str:
    windows = sorted({a.window for a in spec.attention if a.window})
    parts = [f"{len(spec.attention)} attention"]
    if windows:
        parts.append(f"window {'/'.join(map(str, windows))}")
    if spec.states:
        parts.append(f"{len(spec.states)} recurrent")
    return " + ".join(parts)


def _engine_checks(model: Any) -> list[str]:
    """Rule 4: which rows differ from generate_step alone (empty: none)."""
    import mlx.core as mx
    from engine_support import engine_factory
    from mlx_lm.generate import generate_step

    from frink_mlx.core.request import SamplingParams
    from frink_mlx.engine.types import SeqRequest

    greedy = SamplingParams(temperature=0)
    rng = random.Random(1)
    lengths = (13, 9, 4, 17, 23)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(n)] for n in lengths]
    want = [[int(t) for t, _ in generate_step(mx.array(p), model, max_tokens=6)] for p in prompts]
    loaded = types.SimpleNamespace(model=model, dtype=mx.float32, context_length=512)
    factory = engine_factory(num_blocks=128, prefill_chunk_tokens=5, context_ceiling=256,
                             queue_timeout_s=600.0)
    make = next(factory)
    try:
        engine = make(loaded)
        bad = []
        if ids(engine.submit(SeqRequest("alone", prompts[0], greedy, 6))) != want[0]:
            bad.append("alone")
        streams = [engine.submit(SeqRequest(f"r{i}", p, greedy, 6))
                   for i, p in enumerate(prompts[1:])]
        for i, stream in enumerate(streams):
            if ids(stream) != want[i + 1]:
                bad.append(f"batched row {i} ({lengths[i + 1]} tokens)")
        return bad
    finally:
        next(factory, None)


def ids(stream: Any) -> list[int]:
    """Row 0's token ids; an engine error on the row raises (a FAILS row, not an id diff)."""
    got = []
    for out in stream:
        if out.error is not None or out.finish == "error":
            raise RuntimeError(f"the engine ended the row: {out.error}")
        if out.token_id is not None and out.index == 0:
            got.append(out.token_id)
    return got


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ").replace("|", "/")
    return text if len(text) <= 160 else text[:157] + "..."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated model files")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # the subprocess's side
    opts = parser.parse_args()
    if opts.one:
        print("RESULT " + json.dumps(survey_one(opts.one)), flush=True)
        return
    families = [f for f in opts.only.split(",") if f] or model_files()
    import mlx_lm

    print(f"# Family survey: mlx-lm {mlx_lm.__version__}, {len(families)} model files\n")
    print("| family (model file) | through the engine | detail |")
    print("|---|---|---|")
    counts: dict[str, int] = {}
    for family in families:
        started = time.perf_counter()
        row = _run_one(family, opts.timeout)
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        print(f"| {family} | {row['status']} | {row['detail']} "
              f"({time.perf_counter() - started:.0f} s) |", flush=True)
    print("\n" + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))


def _run_one(family: str, timeout_s: float) -> dict[str, str]:
    try:
        done = subprocess.run([sys.executable, __file__, "--one", family], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "FAILS", "detail": f"no answer within {timeout_s:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, str] = json.loads(line[len("RESULT "):])
            return result
    lines = (done.stdout + "\n" + done.stderr).strip().splitlines()
    wants = [line for line in lines if "install" in line.lower()]
    if wants:  # the model file itself exits asking for a package (olmo: ai2-olmo)
        return {"status": "skipped", "detail": f"the model file needs a package: {wants[0]}"}
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"status": "FAILS", "detail": f"the process ended ({done.returncode}): {_short(Exception(tail))}"}


if __name__ == "__main__":
    main()
