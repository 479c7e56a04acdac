"""What the simulator and the benchmarks consume: request traces, synthetic routed batches,
prompt prefix blocks, drifting windows."""

__all__: list[str] = []
