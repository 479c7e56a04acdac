"""What a rebalance policy is: a clock, a window, and a planner.

A policy is a small frozen object of hyperparameters (STYLE: one interface for every
baseline). The loop that runs it (the simulator's step model; an engine beside a
:class:`~straggler.runtime.SolverWorker`) records each step's tokens per expert into a window
of :meth:`RebalancePolicy.window_steps` steps, asks the policy at the steps of its
:meth:`RebalancePolicy.schedule`, and moves to the placement :meth:`RebalancePolicy.plan`
returns (None: stay). A rank lost or returned (``RebalanceContext.forced``) asks every
policy at once, whatever its clock: an expert whose replicas were all on the lost rank must
be placed again before the layer can run.

The names the simulator and the command accept are the literal table
:data:`straggler.solvers.placement.rebalance.registry.REBALANCE_POLICIES`
(:func:`~straggler.solvers.placement.rebalance.registry.get_rebalance_policy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ....formulations.cost import CostModel
from ....formulations.errors import param_error
from ....formulations.validation import check_int, check_real
from .transfer import MoveCost

__all__ = ["RebalanceContext", "RebalancePlan", "RebalancePolicy"]


@dataclass(frozen=True, kw_only=True, eq=False)
class RebalanceContext:
    """What a policy plans from.

    Attributes
    ----------
    history : ndarray of int64, shape (n_steps, n_layers, n_experts)
        The recorded window, oldest step first.
    previous : ndarray of int64, shape (n_layers, P)
        The placement in force (``-1``: an empty slot).
    num_replicas, num_groups, num_nodes, num_gpus : int
        The layout (``num_replicas = P``).
    cost : CostModel
        The MoE layer's cost model.
    move : MoveCost
        Expert size, bandwidths and the mode the copies run in.
    layer_scale : float
        Model MoE layers each layer of ``history`` stands for.
    active : ndarray of bool, shape (num_gpus,)
        Ranks that hold weights.
    step_s, comm_s : float or None
        The recent mean step time and its all-to-all's share (seconds).
    forced : bool
        A rank was lost or returned: the policy must plan now (and place every expert on the
        active ranks).
    """

    history: np.ndarray
    previous: np.ndarray
    num_replicas: int
    num_groups: int
    num_nodes: int
    num_gpus: int
    cost: CostModel
    move: MoveCost
    layer_scale: float = 1.0
    active: np.ndarray | None = None
    step_s: float | None = None
    comm_s: float | None = None
    forced: bool = False

    def __post_init__(self) -> None:
        if self.active is None:
            object.__setattr__(self, "active", np.ones(self.num_gpus, dtype=bool))

    @property
    def weight(self) -> np.ndarray:
        """The window's tokens per expert summed over its steps, ``(n_layers, n_experts)``
        (what vLLM and SGLang hand their EPLB)."""
        return self.history.sum(axis=0)


@dataclass(frozen=True, eq=False)
class RebalancePlan:
    """A policy's answer: the placement to move to, with the policy's own account."""

    physical_to_logical: np.ndarray
    """``(n_layers, P)``; an inactive rank's slots ``-1`` (or whatever its planner writes
    there: the loop treats them as empty)."""
    detail: dict
    """Policy-specific figures (``auto``: the decision's predicted gain and cost)."""
    planning_s: float | None = None
    """Seconds this plan took to make, when not the policy's ``planning_s_per_layer`` times
    the model's MoE layers."""


@dataclass(frozen=True, kw_only=True)
class RebalancePolicy:
    """Base of the rebalance policies.

    Subclasses set :attr:`name`, :meth:`schedule`, :meth:`window_steps` and :meth:`plan`.

    Attributes
    ----------
    planning_s_per_layer : float
        Seconds the planner takes per MoE layer of the model on the engine's host (a stated
        constant, so that a simulated run does not depend on this machine's load; each
        policy states where its default comes from). The loop charges ``planning_s_per_layer
        * n_moe_layers`` per rearrangement: as a stall when the planner runs on the critical
        path, as a delay before the copies start otherwise.
    """

    name: ClassVar[str] = ""
    #: Whether the planner runs beside serving in every mode (the ``SolverWorker``), not on
    #: the critical path of a synchronous rearrangement.
    offloaded: ClassVar[bool] = False
    #: The hyperparameter ``name:N`` sets on the command line.
    spec_field: ClassVar[str | None] = None

    planning_s_per_layer: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "planning_s_per_layer",
            check_real(self.planning_s_per_layer, "planning_s_per_layer", self.name, lo=0),
        )  # fmt: skip

    def schedule(self) -> tuple[int, int]:
        """``(first, period)``: the policy is asked after ``first`` steps, then ``period``
        steps after each time it planned (``period`` 0: never asked)."""
        return 0, 0

    def window_steps(self) -> int:
        """Steps of recorded tokens per expert the policy plans from."""
        return 1

    def plan(self, ctx: RebalanceContext) -> RebalancePlan | None:
        """The placement to move to, or None to keep the one in force."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """The policy's name with its clock (``every:2000``)."""
        if self.spec_field is None:
            return self.name
        return f"{self.name}:{getattr(self, self.spec_field)}"

    @classmethod
    def from_spec(cls, arg: str | None, func: str) -> RebalancePolicy:
        """The policy for ``name`` or ``name:N`` on the command line (``N``: the field
        :attr:`spec_field`)."""
        if arg is None:
            return cls()
        if cls.spec_field is None:
            raise param_error(
                "rebalance", func, f"{cls.name!r} without ':N' (it takes no clock)",
                repr(f"{cls.name}:{arg}"),
            )  # fmt: skip
        try:
            n = int(arg)
        except ValueError:
            raise param_error(
                "rebalance", func, f"'{cls.name}:N' with N a positive integer ({cls.spec_field})",
                repr(f"{cls.name}:{arg}"),
            ) from None  # fmt: skip
        return cls(**{cls.spec_field: check_int(n, cls.spec_field, func, lo=1)})
