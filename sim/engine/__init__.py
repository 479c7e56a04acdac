"""The lock-step simulator: its configuration, the step loop (kernel and reference) and the
deployment step model (DP attention, EP MoE)."""

__all__: list[str] = []
