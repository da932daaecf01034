"""Test-only: tiny random-weight vision-language checkpoints written with mlx-vlm's classes.

A Gemma 3 VLM (SigLIP tower, pooled projector, gemma3 text) small enough to run
on the CPU in milliseconds: 32x32 images in 8x8 patches, pooled to 4 image
tokens each, a 64-wide two-layer language model with a sliding layer. The
tokenizer is a byte-level BPE with Gemma's specials; the chat template writes
`<start_of_image>` where a content part is an image, as Gemma 3's does.

A Qwen2.5-VL (windowed ViT, 2x2 patch merger, qwen2 text with M-RoPE): images
resized to at most 768 pixels in 4x4 patches, so a 50x40 image is a 4x3 grid
of 12 image tokens whose 3-D positions (time, row, column) differ from their
indices; its template writes `<|vision_start|><|image_pad|><|vision_end|>` per
image part, as Qwen's does.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

SPECIALS = ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
            "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
LINES = ["hello world, what is in this picture?", "describe the image please",
         "user model turn", "a cat sits on a mat", "and the second one?"] * 20
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<start_of_image>{% else %}{{ p.text }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def _tokenizer_json(vocab: int = 300, specials: list[str] = SPECIALS) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(LINES, trainer=trainer)
    return tok.to_str()


def make_tiny_gemma3_vlm(path: str | Path, *, seed: int = 0) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok_json = _tokenizer_json()
    vocab = len(json.loads(tok_json)["model"]["vocab"])
    text = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16,
            "num_key_value_heads": 1, "vocab_size": vocab, "sliding_window": 8,
            "sliding_window_pattern": 2, "query_pre_attn_scalar": 16,
            "mm_tokens_per_image": 4, "max_position_embeddings": 4096}
    vision = {"model_type": "siglip_vision_model", "hidden_size": 32, "num_hidden_layers": 1,
              "intermediate_size": 64, "num_attention_heads": 2, "patch_size": 8,
              "image_size": 32}
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "image_token_index": SPECIALS.index("<image_soft_token>"),
              "boi_token_index": SPECIALS.index("<start_of_image>"),
              "eoi_token_index": SPECIALS.index("<end_of_image>"), "mm_tokens_per_image": 4,
              "hidden_size": 64, "vocab_size": vocab, "pad_token_id": 0, "eos_token_id": [2, 4],
              "text_config": text, "vision_config": vision}
    family, _ = get_model_and_args(config)
    model_config = family.ModelConfig.from_dict(config)
    model_config.text_config = family.TextConfig.from_dict(text)
    model_config.vision_config = family.VisionConfig.from_dict(vision)
    model = family.Model(model_config)
    mx.random.seed(seed)
    weights = {k: (mx.ones(v.shape) if "norm" in k and k.endswith("weight")
                   else mx.random.normal(v.shape) * 0.2).astype(mx.float32)
               for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (path / "tokenizer.json").write_text(tok_json)
    specials = {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                         "normalized": False, "single_word": False}
                for i, t in enumerate(SPECIALS)}
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "add_bos_token": False, "chat_template": TEMPLATE,
        "processor_class": "Gemma3Processor", "added_tokens_decoder": specials,
        "extra_special_tokens": {"image_token": "<image_soft_token>",
                                 "boi_token": "<start_of_image>",
                                 "eoi_token": "<end_of_image>"}}, indent=1))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "size": {"height": 32, "width": 32}, "do_resize": True, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "resample": 2,
        "do_pan_and_scan": False}))
    (path / "processor_config.json").write_text(json.dumps({
        "processor_class": "Gemma3Processor", "image_seq_length": 4}))
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return path


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tiny_qwen2_5_vl(path: str | Path, *, seed: int = 0) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok_json = _tokenizer_json(specials=QWEN_SPECIALS)
    vocab = len(json.loads(tok_json)["model"]["vocab"])
    special = {t: i for i, t in enumerate(QWEN_SPECIALS)}
    vision = {"model_type": "qwen2_5_vl", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
              "out_hidden_size": 64, "num_heads": 2, "patch_size": 4, "spatial_patch_size": 4,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16,
              "fullatt_block_indexes": [1], "in_channels": 3}
    config = {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
              "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
              "vocab_size": vocab, "rope_theta": 10000.0, "max_position_embeddings": 4096,
              "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
              "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": [special["<|im_end|>"]],
              "image_token_id": special["<|image_pad|>"],
              "video_token_id": special["<|video_pad|>"],
              "vision_start_token_id": special["<|vision_start|>"],
              "vision_end_token_id": special["<|vision_end|>"],
              "vision_token_id": special["<|vision_pad|>"], "vision_config": vision}
    family, _ = get_model_and_args(config)
    model_config = family.ModelConfig.from_dict(dict(config))
    model_config.text_config = family.TextConfig.from_dict(
        {k: v for k, v in config.items() if k != "vision_config"})
    model_config.vision_config = family.VisionConfig.from_dict(vision)
    model = family.Model(model_config)
    mx.random.seed(seed)
    weights = {k: (mx.ones(v.shape) if "norm" in k and k.endswith("weight")
                   else mx.random.normal(v.shape) * 0.2).astype(mx.float32)
               for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (path / "tokenizer.json").write_text(tok_json)
    specials = {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                         "normalized": False, "single_word": False}
                for i, t in enumerate(QWEN_SPECIALS)}
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "add_bos_token": False, "chat_template": QWEN_TEMPLATE,
        "processor_class": "Qwen2_5_VLProcessor", "added_tokens_decoder": specials}, indent=1))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
        "patch_size": 4, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 64,
        "max_pixels": 768, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    (path / "chat_template.jinja").write_text(QWEN_TEMPLATE)
    return path


def png_image(seed: int = 0, size: tuple[int, int] = (50, 40)) -> Any:
    import numpy as np
    from PIL import Image

    pixels = np.random.RandomState(seed).rand(size[1], size[0], 3) * 255
    return Image.fromarray(pixels.astype("uint8"))


def png_base64(seed: int = 0, size: tuple[int, int] = (50, 40)) -> str:
    buf = io.BytesIO()
    png_image(seed, size).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def mlx_vlm_greedy(path: Path, messages: list[dict[str, Any]], images: list[Any],
                   max_tokens: int) -> list[int]:
    """mlx-vlm's own greedy generation: the ids every frink path must reproduce."""
    from mlx_vlm import load
    from mlx_vlm.generate import generate

    model, processor = load(str(path))
    prompt = processor.tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True)
    files = []
    for k, image in enumerate(images):
        file = path / f"ref-{k}.png"
        image.save(file)
        files.append(str(file))
    out = generate(model, processor, prompt, image=files, max_tokens=max_tokens,
                   temperature=0.0, verbose=False)
    return list(out.token_ids)
