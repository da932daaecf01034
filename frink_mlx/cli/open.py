"""`frink-mlx open`: the daemon's status page in the default browser.

Rules:
1. The URL is --url, else the configured host and port (settings: flags >
   FRINK_MLX_* > defaults), a wildcard bind address read as 127.0.0.1: the
   same address `frink-mlx chat` talks to (local_daemon.py).
2. The daemon must answer /health first (any state: loading and idle count);
   a browser pointed at a dead port shows only its own error page, so instead
   the command says how to start the daemon and exits 1. --no-check skips it.
3. The API key never goes into the URL (it would land in the browser's
   history); the page asks for it once per tab.
4. --print prints the URL and opens nothing (for a remote shell, or scripts).
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from collections.abc import Callable
from typing import TextIO

from ..settings import Settings
from .local_daemon import daemon_answers, daemon_url

Opener = Callable[[str], bool]


def open_command(settings: Settings, args: argparse.Namespace, out: TextIO = sys.stdout,
                 opener: Opener = webbrowser.open) -> int:
    url = daemon_url(settings, args.url) + "/"
    if not args.no_check and not daemon_answers(url.rstrip("/")):
        print(f"frink-mlx: no daemon answers at {url}; start one with `frink-mlx serve` "
              "(or `frink-mlx service start`), or pass --url", file=sys.stderr)
        return 1
    if args.print_only:
        print(url, file=out)
        return 0
    if not opener(url):
        print(f"frink-mlx: could not start a browser; open {url} yourself", file=sys.stderr)
        return 1
    print(f"opened {url}", file=out)
    return 0
