"""Theorems (THEOREMS.md), executable certificates, brute-force oracles, reductions and
hypothesis strategies. Nothing in the library imports this package."""

__all__: list[str] = []
