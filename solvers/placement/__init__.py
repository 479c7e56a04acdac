"""Replica placement: DeepSeek's EPLB (numpy and kernels) and place_experts."""

__all__: list[str] = []
