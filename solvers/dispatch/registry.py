"""Dispatch methods by stable name.

A method is a small frozen dataclass of hyperparameters whose ``solve(problem, cost, *,
time_limit, rng)`` takes one validated single-layer
:class:`~straggler.formulations.DispatchProblem` and returns a :class:`LayerSolution`.
:func:`~straggler.solvers.solve_dispatch` does everything else once, for every method alike:
validation, the layer loop, scoring by the independent evaluator, the certified lower bound,
status, timing.

The names are the literal table :data:`straggler.baselines.tables.DISPATCH_METHODS` (this
library's methods and the upstream baselines; it lives in ``baselines``, the higher layer,
and is read here on first use, so no module imports upward at import time and no import
registers anything), plus the methods a user registers at run time with
:func:`register_dispatch_method`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ...formulations.results import Status
from ...formulations.validation import check_choice, check_options

__all__ = [
    "BoundCertificate",
    "LayerSolution",
    "register_dispatch_method",
    "get_dispatch_method",
    "dispatch_methods",
]

#: Methods registered at run time (:func:`register_dispatch_method`), beside the table.
_DISPATCH: dict[str, type] = {}


class BoundCertificate(NamedTuple):
    """A layer's certified lower bound, computed by a method with the library's kernels.

    A method that already computes the optimal semi-matching and the exact token LP of a
    layer (``tempo`` does, for its own stopping rule) computes the full
    :func:`~straggler.solvers.certified_lower_bound` from them and hands it over here, so
    ``solve_dispatch`` does not compute it again. Valid only on the problem's own replica
    mask.
    """

    bound: float
    """The certified bound of :mod:`straggler.solvers.dispatch.bounds` (B1-B8) of the layer."""
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


_TABLE: dict = {}


def _table() -> dict[str, type]:
    """The name table of :mod:`straggler.baselines.tables` (it sees every layer, so it is
    imported on first use; module docstring)."""
    if not _TABLE:
        from ...baselines.tables import DISPATCH_METHODS

        _TABLE.update(DISPATCH_METHODS)
    return _TABLE


def register_dispatch_method(name: str):
    """Class decorator: make a frozen dataclass known as dispatch method ``name`` for this
    process, beside the library's table (a name already known raises ``RuntimeError``)."""

    def deco(cls):
        if name in _table() or (name in _DISPATCH and _DISPATCH[name] is not cls):
            raise RuntimeError(f"dispatch method {name!r} registered twice")
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"dispatch method {name!r} must be a dataclass")
        _DISPATCH[name] = cls
        return cls

    return deco


def dispatch_methods() -> list[str]:
    """Names of every dispatch method (the table's and those registered at run time), sorted."""
    return sorted([*_table(), *_DISPATCH])


def get_dispatch_method(name: str, func: str = "solve_dispatch"):
    """The class registered as ``name``; :class:`InvalidOptionError` if there is none."""
    name = check_choice(name, "method", func, dispatch_methods())
    return _table().get(name) or _DISPATCH[name]


def make_method(name: str, options: dict, func: str = "solve_dispatch"):
    """Instantiate method ``name`` with keyword ``options``, naming any unknown option.

    The method's own ``__post_init__`` validates the option values.
    """
    cls = get_dispatch_method(name, func)
    allowed = [f.name for f in dataclasses.fields(cls) if f.init]
    check_options(options, allowed, f"The method {name!r} of {func}")
    return cls(**options)
