"""Deployment adapter (Triton/CUDA kernel with a torch reference, table publishing).

Imports cleanly without torch or a GPU; the pieces that need them raise
``BackendUnavailableError`` when called without the ``runtime`` extra.
"""

__all__: list[str] = []
