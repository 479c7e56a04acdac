"""Placement baselines beside EPLB (FlashLB)."""

__all__: list[str] = []
