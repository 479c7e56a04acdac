"""Theorems (THEOREMS.md), executable certificates, brute-force oracles, reductions and
hypothesis strategies. Nothing in the library imports this package."""

from .certificates import Certificate, certify

__all__: list[str] = ["Certificate", "certify"]
