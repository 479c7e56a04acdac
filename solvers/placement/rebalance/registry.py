"""The rebalance policies by name: ``never``, ``every:N``, ``auto``, ``vllm``, ``sglang``.

The names the simulator and ``straggler-simulate --rebalance`` accept are the literal table
:data:`REBALANCE_POLICIES`: this library's policies beside the engines' clocks (the baselines),
so this module sits above ``baselines``, as the dispatch and routing name tables do
(``docs/architecture.md``). A name may carry its clock, ``name:N`` (the field
``RebalancePolicy.spec_field`` of the policy: ``every:2000``, ``vllm:100`` for vLLM's
``step_interval``, ``sglang:500``, ``auto:500`` for its decision period).
"""

from __future__ import annotations

from ....baselines.placement.sglang_clock import SGLangClock
from ....baselines.placement.vllm_clock import VllmClock
from ....formulations.errors import InvalidInputError, InvalidOptionError
from .auto import Auto
from .every import Every
from .never import Never
from .policy import RebalancePolicy

__all__ = [
    "REBALANCE_POLICIES",
    "rebalance_policies",
    "get_rebalance_policy",
    "parse_rebalance_policies",
]

#: Rebalance policy name -> its class (a frozen dataclass of hyperparameters with ``plan``).
REBALANCE_POLICIES: dict[str, type[RebalancePolicy]] = {
    "never": Never,
    "every": Every,
    "auto": Auto,
    "vllm": VllmClock,
    "sglang": SGLangClock,
}


def _table() -> dict[str, type[RebalancePolicy]]:
    return REBALANCE_POLICIES


def rebalance_policies() -> list[str]:
    """The names of the registered rebalance policies, sorted.

    Examples
    --------
    >>> rebalance_policies()
    ['auto', 'every', 'never', 'sglang', 'vllm']
    """
    return sorted(_table())


def get_rebalance_policy(spec, func: str = "simulate") -> RebalancePolicy:
    """The policy named by ``spec`` (``"name"`` or ``"name:N"``), or ``spec`` itself when it
    is already a :class:`~straggler.solvers.placement.rebalance.policy.RebalancePolicy`.

    Examples
    --------
    >>> get_rebalance_policy("every:2000").interval
    2000
    """
    if isinstance(spec, RebalancePolicy):
        return spec
    if not isinstance(spec, str):
        names = ", ".join(rebalance_policies())
        raise InvalidOptionError(
            f"The 'rebalance' parameter of {func} must be a policy name ({names}, optionally "
            f"'name:N') or a RebalancePolicy. Got {type(spec).__name__} instead."
        )
    name, sep, arg = spec.strip().partition(":")
    table = _table()
    if name not in table:
        raise InvalidOptionError(
            f"The 'rebalance' parameter of {func} must be one of {rebalance_policies()} "
            f"(optionally 'name:N'). Got {spec!r} instead."
        )
    return table[name].from_spec(arg if sep else None, func)


def parse_rebalance_policies(text: str, func: str) -> list[RebalancePolicy]:
    """A comma-separated list of policies (``"never,auto,every:2000"``); an empty list is
    refused.

    Examples
    --------
    >>> [p.label for p in parse_rebalance_policies("never, vllm:100", "f")]
    ['never', 'vllm:100']
    """
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    if not names:
        raise InvalidInputError(
            f"The 'rebalance' parameter of {func} must name at least one policy. Got "
            f"{text!r} instead."
        )
    return [get_rebalance_policy(n, func) for n in names]
