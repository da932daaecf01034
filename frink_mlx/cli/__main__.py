"""`python -m frink_mlx.cli ...`: what the service manager and the tests run (the venv's
own interpreter, so no console script needs to be on PATH)."""

import sys

from .main import main

sys.exit(main())
