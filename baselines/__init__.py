"""The policies production deploys, one interface each (registered by name on import)."""

__all__: list[str] = []
