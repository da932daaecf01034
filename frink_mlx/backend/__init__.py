"""The backend seam: one object answers every device question (base.py).

`select_backend(settings)` picks it once at start-up (select.py); `metal.py`
is the default and changes nothing; `cpu/` holds the CPU specialisation and is
imported only from here (tests/backend/test_seam.py checks it). Importing this
package loads no MLX, so the entry points can select (and re-exec) first.
"""

from .base import (
           Backend,
           BackendName,
           ForwardScope,
           MemoryBudget,
           no_scope,
           physical_ram_bytes,
)
from .select import backend_name, select_backend

__all__ = ["Backend", "BackendName", "ForwardScope", "MemoryBudget", "backend_name", "no_scope",
           "physical_ram_bytes", "select_backend"]
