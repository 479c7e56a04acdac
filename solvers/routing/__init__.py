"""Problem 2, data-parallel decode routing (BalanceRoute): route_batch, the policy
registry, the BR-0 / BR-H / BR-S kernels and the termination predictors."""

__all__: list[str] = []
