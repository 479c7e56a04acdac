"""Dispatch methods by stable name: the name table and the lookup ``solve_dispatch`` uses.

A method is a small frozen dataclass of hyperparameters whose ``solve`` returns a
:class:`~straggler.solvers.dispatch.method.LayerSolution` (:mod:`straggler.solvers.dispatch.method`
says what a method is). The names are the literal table :data:`DISPATCH_METHODS` (this
library's methods beside the upstream baselines, each imported explicitly from the module that
defines it, as networkx's ``maxflow.py`` lists its flow functions; importing a module registers
nothing), plus the methods a user registers at run time with :func:`register_dispatch_method`.

The table sees the baselines, so this module, like :func:`~straggler.solvers.solve_dispatch`,
sits above them; the methods and the baselines import only
:mod:`~straggler.solvers.dispatch.method` below it.
"""

from __future__ import annotations

import dataclasses

from ...baselines.dispatch.dynamic import SGLangDynamic
from ...baselines.dispatch.llep import LLEP
from ...baselines.dispatch.lplb import LPLB
from ...baselines.dispatch.metro import Metro
from ...baselines.dispatch.moonep import MoonEP
from ...baselines.dispatch.static import StaticDispatch
from ...baselines.dispatch.token_lp import SGLangLP, TokenLP
from ...baselines.dispatch.uniform import UniformSplit
from ...baselines.dispatch.vllm_ep import VllmEP
from ...formulations.validation import check_choice, check_options
from .milp import MilpDispatch
from .round_robin import RoundRobin
from .semi_matching import SemiMatching
from .tempo import Tempo

__all__ = [
    "DISPATCH_METHODS",
    "register_dispatch_method",
    "get_dispatch_method",
    "dispatch_methods",
    "make_method",
]

#: Dispatch method name -> its class (a frozen dataclass of hyperparameters with ``solve``).
DISPATCH_METHODS = {
    "tempo": Tempo,
    "milp": MilpDispatch,
    "semi_matching": SemiMatching,
    "round_robin": RoundRobin,
    "token_lp": TokenLP,
    "sglang_lp": SGLangLP,
    "uniform": UniformSplit,
    "static": StaticDispatch,
    "sglang_dynamic": SGLangDynamic,
    "llep": LLEP,
    "lplb": LPLB,
    "metro": Metro,
    "moonep": MoonEP,
    "vllm_ep": VllmEP,
}

#: Methods registered at run time (:func:`register_dispatch_method`), beside the table.
_DISPATCH: dict[str, type] = {}


def register_dispatch_method(name: str):
    """Class decorator: make a frozen dataclass known as dispatch method ``name`` for this
    process, beside the library's table (a name already known raises ``RuntimeError``)."""

    def deco(cls):
        if name in DISPATCH_METHODS or (name in _DISPATCH and _DISPATCH[name] is not cls):
            raise RuntimeError(f"dispatch method {name!r} registered twice")
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"dispatch method {name!r} must be a dataclass")
        _DISPATCH[name] = cls
        return cls

    return deco


def dispatch_methods() -> list[str]:
    """Names of every dispatch method (the table's and those registered at run time), sorted."""
    return sorted([*DISPATCH_METHODS, *_DISPATCH])


def get_dispatch_method(name: str, func: str = "solve_dispatch"):
    """The class registered as ``name``; :class:`InvalidOptionError` if there is none."""
    name = check_choice(name, "method", func, dispatch_methods())
    return DISPATCH_METHODS.get(name) or _DISPATCH[name]


def make_method(name: str, options: dict, func: str = "solve_dispatch"):
    """Instantiate method ``name`` with keyword ``options``, naming any unknown option.

    The method's own ``__post_init__`` validates the option values.
    """
    cls = get_dispatch_method(name, func)
    allowed = [f.name for f in dataclasses.fields(cls) if f.init]
    check_options(options, allowed, f"The method {name!r} of {func}")
    return cls(**options)
