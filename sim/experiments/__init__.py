"""Studies built on the solvers and the simulator: the dispatch comparison, the phase
diagram, the levers table, the routing load sweep, the rebalance frontier, the sweep runner
and plots."""

__all__: list[str] = []
