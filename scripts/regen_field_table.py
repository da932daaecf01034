"""Rewrite README.md's field table from adapters/fields.py (`markdown()`), in place.

Why a script: the table is generated, and hand-splicing it once left a stray END
marker behind; this replaces exactly the span from BEGIN to the last END after it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from frink_mlx.adapters.fields import BEGIN, END, markdown


def main(readme: str = "README.md") -> None:
    path = Path(readme)
    text = path.read_text()
    start = text.index(BEGIN)
    end = text.index(END, start)
    while text.startswith(END, end + len(END) + 1):  # collapse stray repeats of END
        end += len(END) + 1
    path.write_text(text[:start] + markdown() + text[end + len(END):])


if __name__ == "__main__":
    main(*sys.argv[1:])
