"""Rebalancing in the loop: what a rearrangement costs, and when and how far to move."""

__all__: list[str] = []
