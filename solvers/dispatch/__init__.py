"""Problem 1, expert-parallel dispatch (TEMPO): solve_dispatch, tempo, the exact
methods, bounds, calibration and the topology split."""

__all__: list[str] = []
