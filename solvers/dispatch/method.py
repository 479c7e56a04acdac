"""What a dispatch method is: a small frozen dataclass of hyperparameters whose ``solve(problem,
cost, *, time_limit, rng)`` takes one validated single-layer
:class:`~straggler.formulations.DispatchProblem` and returns a :class:`LayerSolution` (with, when
it computed one, a :class:`BoundCertificate`).

:func:`~straggler.solvers.solve_dispatch` does everything else once, for every method alike
(validation, the layer loop, scoring by the independent evaluator, the certified lower bound,
status, timing); the methods are named in :mod:`straggler.solvers.dispatch.registry`. This
module sits below both the methods and the baselines (they return its records); the name table
sits above them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ...formulations.results import Status

__all__ = ["BoundCertificate", "LayerSolution", "OPTIMALITY_RTOL"]

#: Relative slack under which a makespan equal to a certified bound counts as proved optimal
#: (``solve_dispatch``'s OPTIMAL rule; tempo's repair stops by the same rule).
OPTIMALITY_RTOL = 1e-9


class BoundCertificate(NamedTuple):
    """A layer's certified lower bound, computed by a method with the library's kernels.

    A method that already computes the optimal semi-matching and the exact token LP of a
    layer (``tempo`` does, for its own stopping rule) computes the full
    :func:`~straggler.solvers.certified_lower_bound` from them and hands it over here, so
    ``solve_dispatch`` does not compute it again. Valid only on the problem's own replica
    mask.
    """

    bound: float
    """The certified bound of :mod:`straggler.solvers.dispatch.bounds` (B1-B9) of the layer."""
    semi_matching_value: int
    """The optimal semi-matching value ``SM`` (Lemma 2) of the layer."""
    token_lp_value: float
    """The token-LP value ``lambda* = min max_g N_g`` (Lemma 1) of the layer."""


@dataclass(frozen=True, eq=False, kw_only=True)
class LayerSolution:
    """What a method's ``solve`` returns for one layer.

    ``status`` is HEURISTIC for methods that do not prove optimality; exact methods report
    their backend status. ``lower_bound`` is a method-specific certified bound (e.g. a MILP
    dual bound), combined with the library's own bounds by ``solve_dispatch``.

    ``replicas`` is None for every method that keeps to the problem's replica mask. A method
    that dispatches on a mask of its own gives it here (``moonep`` moves weights: the
    problem's mask plus the new replicas); a class marked ``moves_weights = True`` may give
    it as ``extras["replicas"]`` instead (``lplb`` with its own placement).
    ``solve_dispatch`` checks the shares against that mask and certifies the lower bound on
    it, so a result can never report a bound above its own makespan.

    ``certificate`` is None unless the method computed the library's certified bound of
    the layer itself (``BoundCertificate``); ``solve_dispatch`` then uses it instead of
    computing it again (only when the shares lie on the problem's mask).
    """

    shares: np.ndarray
    status: Status = Status.HEURISTIC
    lower_bound: float = -np.inf
    extras: dict = field(default_factory=dict)
    replicas: np.ndarray | None = None
    certificate: BoundCertificate | None = None
