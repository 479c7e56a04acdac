"""What every kernel is compiled with: numba's options, compile-time measurement."""

__all__: list[str] = []
