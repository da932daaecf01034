"""Images on a vision model: frink-mlx vs mlx_vlm.server on the same tiny weights.

    python benchmarks/vision_bench.py [--family gemma3|qwen2_5_vl] [--model DIR]
                                      [--tokens 32] [--rounds 3] [--only frink|mlx_vlm]

The weights are the tests' tiny random VLM of `--family` (tests/vision_support.py,
written to a temp dir), or a checkpoint dir with `--model`. Both servers run in
their own subprocess (benchmarks/_common.py rules 1-4) and get the same requests:
  * 1 client: `--rounds` requests one after the other, each with its own
    1024x1024 PNG (a different image each time, so no server may reuse one);
  * 4 clients: 4 concurrent requests, each with its own image, `--rounds` times;
  * turn 2: the conversation [user: image + text, assistant: the answer, user:
    follow-up] after its turn 1, so the image is in the history: frink's prefix
    cache keys the image's blocks by its bytes (serving/vision.py rule 4).
Reported per server: TTFT (request sent -> first text chunk) median and range,
decode tok/s per stream ((completion tokens - 1) / (last chunk - first)) and
the aggregate tok/s of the 4-client rounds (all completion tokens / wall time),
and turn 2's TTFT and cached prompt tokens (mlx_vlm.server's own prompt cache
is off by default; its usage says what it reused).

mlx_vlm.server needs fastapi and mlx-audio (its server imports its audio routes)
besides what frink-mlx installs; they are installed with --no-deps into a side
directory (`--side-packages`, default /tmp/vision-bench-site) put on that
server's PYTHONPATH only, so the project's venv is left as it is.
Not a timed test: it prints the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402 - after the path entry
    PYTHON,
    ROOT,
    Reply,
    Server,
    bench_env,
    chat_body,
    free_port,
    start_frink,
    stream_chat,
    wait_healthy,
)

sys.path.insert(0, str(ROOT / "tests"))
TEXT = "Describe this image in detail."
FOLLOW_UP = "And what colours stand out?"
SIDE_PACKAGES = ("fastapi", "mlx-audio")


def image_1024(seed: int) -> str:
    """A 1024x1024 PNG (a gradient with noise: photo-like, not worst-case), base64."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:1024, 0:1024] / 1024.0
    base = np.stack([x, y, (x + y) / 2], axis=-1) * 200 + rng.rand(3) * 40
    pixels = np.clip(base + rng.randn(1024, 1024, 3) * 8, 0, 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def user_turn(b64: str) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
        {"type": "text", "text": TEXT}]}


def start_mlx_vlm(model_dir: str, site: Path, timeout_s: float = 300.0) -> Server:
    """`python -m mlx_vlm.server --model DIR`, polled on /health (it preloads the model)."""
    if not (site / "fastapi").is_dir() or not (site / "mlx_audio").is_dir():
        subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                        str(site), *SIDE_PACKAGES], check=True)
    port = free_port()
    env = bench_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    log_path = Path(tempfile.gettempdir()) / f"bench-mlx_vlm-{port}.log"
    proc = subprocess.Popen([PYTHON, "-m", "mlx_vlm.server", "--model", model_dir, "--host",
                             "127.0.0.1", "--port", str(port), "--log-level", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=log_path.open("w"), text=True,
                            cwd=ROOT, env=env)
    return wait_healthy(Server("mlx_vlm.server", proc, f"http://127.0.0.1:{port}", model_dir,
                               log_path), timeout_s)


def decode_tps(reply: Reply) -> float | None:
    if reply.first is None or reply.last is None or not reply.completion_tokens:
        return None
    span = reply.last - reply.first
    return (reply.completion_tokens - 1) / span if reply.completion_tokens > 1 and span > 0 else None


def checked(reply: Reply, server: Server) -> Reply:
    if reply.error or reply.first is None:
        raise SystemExit(f"{server.name}: {reply.error or 'no text'}\n{server.log_tail()}")
    return reply


async def run_server(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    seed = iter(range(1000, 10_000))
    images = {k: image_1024(k) for k in range(1000, 1000 + 2 + args.rounds * 6)}
    async with httpx.AsyncClient(timeout=600) as client:

        async def ask(messages: list[dict[str, Any]]) -> Reply:
            return checked(await stream_chat(client, server, chat_body(server, messages, args.tokens)),
                           server)

        await ask([user_turn(images[next(seed)])])             # warm-up (loads, compiles)
        alone = [await ask([user_turn(images[next(seed)])]) for _ in range(args.rounds)]
        four, walls = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            batch = await asyncio.gather(*(ask([user_turn(images[next(seed)])]) for _ in range(4)))
            walls.append((time.perf_counter() - started, sum(r.completion_tokens or 0 for r in batch)))
            four += batch
        turn2 = []
        for _ in range(args.rounds):
            first_turn = [user_turn(images[next(seed)])]
            answer = await ask(first_turn)
            turn2.append(await ask([*first_turn, {"role": "assistant", "content": answer.text},
                                    {"role": "user", "content": FOLLOW_UP}]))
    return {"alone": alone, "four": four, "walls": walls, "turn2": turn2,
            "image_kib": len(images[1000]) * 3 / 4 / 1024}


def spread(values: list[float], unit: str, scale: float = 1.0) -> str:
    if not values:
        return "n/a"
    scaled = [v * scale for v in values]
    return (f"{statistics.median(scaled):8.1f} {unit} (min {min(scaled):.1f}, "
            f"max {max(scaled):.1f}, n={len(scaled)})")


def report(name: str, r: dict[str, Any]) -> None:
    print(f"\n== {name}")
    print(f"  image: 1024x1024 PNG, {r['image_kib']:.0f} KiB")
    for label, replies in (("1 client ", r["alone"]), ("4 clients", r["four"])):
        print(f"  {label} TTFT       {spread([x.ttft_s for x in replies], 'ms', 1000)}")
        tps = [t for t in (decode_tps(x) for x in replies) if t is not None]
        print(f"  {label} decode     {spread(tps, 'tok/s per stream')}")
        print(f"  {label} tokens     {[x.completion_tokens for x in replies]}, prompt "
              f"{replies[0].prompt_tokens}")
    print(f"  4 clients aggregate {spread([n / wall for wall, n in r['walls']], 'tok/s')}")
    turn2 = r["turn2"]
    print(f"  turn 2     TTFT       {spread([x.ttft_s for x in turn2], 'ms', 1000)}")
    print(f"  turn 2     cached     {[x.cached_tokens for x in turn2]} of prompt "
          f"{[x.prompt_tokens for x in turn2]}")


def write_weights(args: argparse.Namespace, root: Path) -> str:
    if args.model:
        return str(Path(args.model).resolve())
    from vision_support import make_tiny_gemma3_vlm, make_tiny_qwen2_5_vl

    make = make_tiny_gemma3_vlm if args.family == "gemma3" else make_tiny_qwen2_5_vl
    return str(make(root / args.family))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=["gemma3", "qwen2_5_vl"], default="gemma3")
    parser.add_argument("--model", help="a vision checkpoint dir instead of the tiny weights")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["frink", "mlx_vlm"])
    parser.add_argument("--side-packages", default="/tmp/vision-bench-site")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        weights = write_weights(args, Path(tmp))
        models = Path(tmp) / "models.toml"
        models.write_text(f'default = "vlm"\n\n[models.vlm]\nsource = "{weights}"\n')
        print(f"weights: {weights} ({args.family if not args.model else 'checkpoint'}), "
              f"{args.tokens} tokens, {args.rounds} rounds")
        starts = {"frink": lambda: start_frink(str(models)),
                  "mlx_vlm": lambda: start_mlx_vlm(weights, Path(args.side_packages))}
        for name, start in starts.items():
            if args.only and args.only != name:
                continue
            server = start()
            try:
                results = asyncio.run(run_server(server, args))
            finally:
                server.stop()
            report(server.name, results)


if __name__ == "__main__":
    main()
