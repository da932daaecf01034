"""The CPU backend's pieces: backend.py (the object), kernels.py (+ fastexp.py, segments.py),
split.py, blas.py.

Imported only through the backend seam (frink_mlx/backend/select.py). This
package file stays empty so that `blas` can be imported, and the OpenBLAS
re-exec taken, before anything loads MLX.
"""
