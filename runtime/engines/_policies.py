"""The placement policies the engine plug-ins serve, by name, and the variable naming one.

One table, :data:`PLUGIN_POLICIES`, maps a policy name to a function of the engines' common
arguments; both plug-ins (``vllm_plugin``, ``sglang_plugin``) read the name from
:data:`PLUGIN_POLICY_ENV` when the engine loads them and call the function at each
rebalance. A second policy is one more entry: a function with the same signature.

Signature of an entry: ``policy(history, num_replicas, num_groups, num_nodes, num_gpus, *,
dispatch, previous) -> physical_to_logical``, with ``history`` the recorded window
``(n_batches, n_layers, n_experts)`` as the engine hands it, ``dispatch`` the engine's own
dispatch rule (a value of ``straggler.solvers.placement.rules.DISPATCH_RULES``),
``previous`` the slot map in force
(``(n_layers, num_replicas)``, or ``None``) and the result an int64 ``(n_layers,
num_replicas)`` slot map (slot ``p`` on GPU
``p // (num_replicas / num_gpus)``).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from ...solvers.placement.place import place_experts

__all__ = ["PLUGIN_POLICIES", "PLUGIN_POLICY_ENV", "plugin_policy", "run_policy"]

#: The environment variable that names the policy a plug-in registers (unset: none).
PLUGIN_POLICY_ENV = "STRAGGLER_EPLB_POLICY"


def _place_experts_policy(history, num_replicas, num_groups, num_nodes, num_gpus, *, dispatch,
                          previous):  # fmt: skip
    """:func:`~straggler.solvers.place_experts` under the engine's dispatch rule; with the
    map in force, each GPU's slots arranged by vLLM's ``preserve_intragpu_slots``."""
    p2l, _, _ = place_experts(
        history, num_replicas, num_groups, num_nodes, num_gpus, dispatch=dispatch,
        previous=previous,
    )  # fmt: skip
    return p2l


#: Policy name -> function (module notes). The name is what :data:`PLUGIN_POLICY_ENV` holds.
PLUGIN_POLICIES = {"place_experts": _place_experts_policy}


def plugin_policy(environ=None) -> str | None:
    """The policy :data:`PLUGIN_POLICY_ENV` names, ``None`` when it is unset or empty.

    A name outside :data:`PLUGIN_POLICIES` is refused with one line on stderr and
    ``SystemExit(2)``: the plug-ins call this when the engine loads them, and SGLang's
    plug-in loader logs and ignores an ordinary exception, so a bad value would otherwise
    surface only at the first rebalance.

    Parameters
    ----------
    environ : mapping, optional
        Default ``os.environ``.

    Examples
    --------
    >>> plugin_policy({}) is None
    True
    >>> plugin_policy({"STRAGGLER_EPLB_POLICY": "place_experts"})
    'place_experts'
    """
    env = os.environ if environ is None else environ
    raw = env.get(PLUGIN_POLICY_ENV)
    if raw is None or not str(raw).strip():
        return None
    name = str(raw).strip()
    if name not in PLUGIN_POLICIES:
        sys.stderr.write(
            f"error: {PLUGIN_POLICY_ENV}={raw!r} names no straggler placement policy; expected "
            f"one of {', '.join(repr(k) for k in PLUGIN_POLICIES)}, or unset for the engine's "
            "own.\n"
        )
        raise SystemExit(2)
    return name


def run_policy(name, history, num_replicas, num_groups, num_nodes, num_gpus, *, dispatch,
               previous=None):  # fmt: skip
    """Call policy ``name`` and return its map as a contiguous int64 array."""
    p2l = PLUGIN_POLICIES[name](
        history, num_replicas, num_groups, num_nodes, num_gpus, dispatch=dispatch,
        previous=previous,
    )  # fmt: skip
    return np.ascontiguousarray(p2l, dtype=np.int64)
