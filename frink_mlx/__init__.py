"""frink-mlx: one always-on local daemon serving MLX models over the protocols clients already speak."""

__version__ = "0.1.0"
