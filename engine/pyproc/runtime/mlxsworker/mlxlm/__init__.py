"""The mlx backend (backend.py): models built from mlx_lm's definitions."""
