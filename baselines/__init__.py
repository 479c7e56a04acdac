"""The policies production deploys, one interface each (registered by name on import)."""

from . import token_lp  # noqa: F401

__all__: list[str] = []
