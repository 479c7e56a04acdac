"""Workloads, trace loaders, the lock-step decode simulator and experiments."""

__all__: list[str] = []
