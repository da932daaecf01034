"""Writes edit_prompts.json: 20 code-editing requests for spec_bench.py (already generated;
rerun only to rebuild the set).

Each request quotes a 40-120-line snippet of Python and asks for the whole snippet back
with one small change (rename one identifier), which is what editor plugins ask a model
for: the answer is almost all quoted from the prompt. Snippets are cut from this
repository's own modules at a fixed commit (`SNAPSHOT`), so the set is fixed once written.

Layout: the code first, the request after it, as editor plugins lay out an edit
(Continue's edit prompts quote the code to edit, then the user's request). With the
request before the code, SmolLM2-135M described 14 of the 20 snippets in prose instead
of rewriting them (greedy, 128 tokens; code first: 2 of 20), which measured the model's
attention span, not an edit.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = "ee3a1af"  # the commit the snippets are cut from
FILES = ["frink_mlx/engine/kv/block_pool.py", "frink_mlx/engine/kv/manager.py",
         "frink_mlx/engine/kv/hashing.py", "frink_mlx/engine/scheduler.py",
         "frink_mlx/engine/sampling.py", "frink_mlx/engine/stream.py",
         "frink_mlx/engine/admission.py", "frink_mlx/engine/think_budget.py",
         "frink_mlx/core/output.py", "frink_mlx/core/prompt.py", "frink_mlx/core/checks.py",
         "frink_mlx/core/parsers/stream.py", "frink_mlx/core/parsers/tool_formats.py",
         "frink_mlx/http/sse.py", "frink_mlx/http/body.py", "frink_mlx/registry.py",
         "frink_mlx/errors.py", "frink_mlx/models/budget.py", "frink_mlx/serving/hub.py",
         "frink_mlx/metrics.py"]
LENGTHS = [40, 55, 70, 85, 100, 120, 48, 62, 77, 93]


def snippet(rel: str, num_lines: int) -> str:
    """`num_lines` lines of `rel` at `SNAPSHOT`, from its second top-level def or class."""
    text = subprocess.run(["git", "show", f"{SNAPSHOT}:{rel}"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"(def|class|async def) ", line)]
    start = starts[1] if len(starts) > 1 else starts[0]
    start = max(0, min(start, len(lines) - num_lines))
    return "\n".join(lines[start:start + num_lines])


def rename_target(code: str) -> tuple[str, str]:
    """A local-looking identifier used at least twice, and its new name."""
    names = re.findall(r"\b([a-z][a-z0-9]*_[a-z0-9_]+)\b", code)
    counts = {n: names.count(n) for n in names}
    name = max(sorted(counts), key=lambda n: (counts[n] >= 2, -abs(len(n) - 10)))
    return name, name + "_v2"


def main() -> None:
    prompts = []
    for i, rel in enumerate(FILES):
        code = snippet(rel, LENGTHS[i % len(LENGTHS)])
        old, new = rename_target(code)
        prompts.append({
            "source": rel, "num_lines": code.count("\n") + 1, "rename": [old, new],
            "messages": [
                {"role": "system", "content": "You are a careful coding assistant. When asked "
                 "to edit code, reply with the complete edited code and nothing else."},
                {"role": "user", "content": f"```python\n{code}\n```\n\nRename `{old}` to "
                 f"`{new}` everywhere in the code above and give me the whole code back."}]})
    out = Path(__file__).with_name("edit_prompts.json")
    out.write_text(json.dumps(prompts, indent=1) + "\n")
    print(f"wrote {len(prompts)} prompts to {out}")


if __name__ == "__main__":
    main()
