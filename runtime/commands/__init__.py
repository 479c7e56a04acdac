"""The command-line programs: straggler-compare, straggler-simulate, straggler-plan and
straggler-warmup."""

__all__: list[str] = []
