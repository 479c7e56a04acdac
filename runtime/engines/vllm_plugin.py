"""vLLM plug-in: straggler's placement as vLLM's EPLB policy, by one environment variable.

The package declares the entry point ``straggler = "straggler.runtime.engines.vllm_plugin:
register_vllm_plugin"`` in the group ``vllm.general_plugins``. vLLM (0.32,
``vllm/plugins/__init__.py``, ``load_general_plugins``) calls it once in every process it
starts: the front end (``EngineArgs.__post_init__``; before CLI parsing in ``vllm serve``),
the engine core and each worker before it loads the model.

* :data:`~straggler.runtime.engines._policies.PLUGIN_POLICY_ENV` (``STRAGGLER_EPLB_POLICY``)
  unset or empty: :func:`register_vllm_plugin` returns at once and changes nothing.
* Set to a policy name (``place_experts``): it rebinds **one dict entry**,
  ``vllm.distributed.eplb.policy.EPLB_POLICIES["default"]``, to a subclass of vLLM's
  ``AbstractEplbPolicy`` (:func:`vllm_policy_class`) whose ``rebalance_experts`` is
  :func:`vllm_rebalance`. Nothing else in vLLM changes: ``EPLBConfig`` keeps its
  ``Literal["default"]`` policy check, its default ``use_async=True`` (the asynchronous
  rebalance, which vLLM allows only for the ``"default"`` policy name) and its CLI;
  ``DefaultEplbPolicy`` itself is untouched and importable. ``EplbState.add_model``
  resolves ``EPLB_POLICIES[eplb_config.policy]`` when each worker adds its model, so the
  plug-in, loaded by then, is what ``rearrange`` (and the asynchronous worker) calls.
* Set to anything else: refused with one line on stderr and exit status 2 when the
  plug-in loads (at start-up), not at the first rearrangement.

:func:`vllm_rebalance` keeps vLLM's argument contract (``AbstractEplbPolicy``,
``vllm/distributed/eplb/policy/abstract.py``; the call in ``EplbState.rearrange``):
``weight [n_layers, n_logical]`` (the window's load, any device and dtype), ``num_replicas``
a multiple of ``num_ranks``, the hierarchical layout when ``num_groups % num_nodes == 0``
(then ``n_logical % num_groups == 0`` and ``num_ranks % num_nodes == 0``, which vLLM
asserts) and the global one otherwise; it returns an int64 CPU tensor ``[n_layers,
num_replicas]``, the same on every rank for the same input. With
``old_global_expert_indices`` (the map in force, which ``EplbState`` always passes) each GPU's
slots are arranged by vLLM's own rule (:func:`~straggler.solvers.placement.eplb.
preserve_intragpu_slots`): an expert staying on a GPU keeps its slot, so only moved replicas
copy weights; their number is logged per rearrangement and kept in
``moved_replicas`` on the class.
"""

from __future__ import annotations

import logging

import numpy as np

from ...formulations.errors import param_error
from ...formulations.validation import check_array, check_int
from ...solvers.placement.place import moved_replicas
from ._policies import PLUGIN_POLICIES, plugin_policy, run_policy

__all__ = ["VLLM_DISPATCH", "register_vllm_plugin", "vllm_policy_class", "vllm_rebalance"]

_LOG = logging.getLogger(__name__)
#: The dispatch rule the plug-in places for: vLLM's per-token hash
#: (``straggler.solvers.placement.rules.DISPATCH_RULES``).
VLLM_DISPATCH = "vllm"
_FUNC = "vllm_rebalance"


def _vllm_rebalance_iv(weight, num_replicas, num_groups, num_nodes, num_ranks, old, policy):
    if policy not in PLUGIN_POLICIES:
        raise param_error("policy", _FUNC, f"one of {sorted(PLUGIN_POLICIES)}", repr(policy))
    w = check_array(
        weight, "weight", _FUNC, kind="real", ndim=2, lo=0,
        expected="vLLM's load window [n_layers, n_logical_experts] of non-negative numbers",
    )  # fmt: skip
    L, E = w.shape
    P = check_int(num_replicas, "num_replicas", _FUNC, lo=1)
    G = check_int(num_groups, "num_groups", _FUNC, lo=1)
    N = check_int(num_nodes, "num_nodes", _FUNC, lo=1)
    R = check_int(num_ranks, "num_ranks", _FUNC, lo=1)
    if P % R:
        raise param_error("num_replicas", _FUNC, f"a multiple of num_ranks={R}", repr(P))
    if G % N == 0:  # vLLM's hierarchical policy, and what it asserts for it
        if E % G:
            raise param_error("num_groups", _FUNC, f"a divisor of n_logical={E}", repr(G))
        if R % N:
            raise param_error("num_ranks", _FUNC, f"a multiple of num_nodes={N}", repr(R))
    else:  # vLLM's global policy: one group, one node
        G, N = 1, 1
    if old is not None:
        old = check_array(
            old, "old_global_expert_indices", _FUNC, kind="int", ndim=2, lo=-1, hi=E - 1,
            expected=f"the map in force [n_layers, num_replicas] of expert ids in [-1, {E - 1}]",
        )  # fmt: skip
        if old.shape[0] != L:
            raise param_error(
                "old_global_expert_indices", _FUNC, f"a map of {L} layers", f"shape {old.shape}"
            )
    return w, P, G, N, R, old


def vllm_rebalance(
    weight,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_ranks: int,
    old_global_expert_indices=None,
    *,
    policy: str = "place_experts",
) -> np.ndarray:
    """The slot map of the plug-in's policy, on vLLM's arguments (numpy in, numpy out).

    Parameters
    ----------
    weight : array_like, shape (n_layers, n_logical)
        vLLM's load window (``EplbState`` passes the window's sum over its steps,
        all-reduced over the EP group): placed as one batch of those loads, for vLLM's
        hash rule (``place_experts(weight[None], ..., dispatch="vllm")``).
    num_replicas, num_groups, num_nodes, num_ranks : int
        As vLLM passes them (``AbstractEplbPolicy.rebalance_experts``).
    old_global_expert_indices : array_like of int, shape (n_layers, num_replicas), optional
        The map in force (``-1``: an empty slot, as elastic scale-up leaves), passed as
        ``previous``: its GPUs' slots are kept where the expert stays (vLLM's
        ``preserve_intragpu_slots``); a map of another width (elastic scale-down)
        preserves nothing.
    policy : str, default "place_experts"
        A key of :data:`~straggler.runtime.engines._policies.PLUGIN_POLICIES`.

    Returns
    -------
    ndarray of int64, shape (n_layers, num_replicas)

    Raises
    ------
    InvalidInputError
        Where vLLM's own policy asserts, and for a weight that is not a non-negative 2-D
        array or an old map of other layers or ids.

    Examples
    --------
    >>> w = [[40, 20, 5, 5, 3, 1, 1, 1]]
    >>> p2l = vllm_rebalance(w, 12, 1, 1, 4)
    >>> p2l.shape, sorted(set(p2l[0].tolist())) == list(range(8))
    ((1, 12), True)
    """
    w, P, G, N, R, old = _vllm_rebalance_iv(
        weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices, policy
    )
    L = w.shape[0]
    keep = old is not None and old.shape == (L, P)
    return run_policy(
        policy, w[None], P, G, N, R, dispatch=VLLM_DISPATCH, previous=old if keep else None
    )


def vllm_policy_class(policy: str = "place_experts"):
    """A subclass of vLLM's ``AbstractEplbPolicy`` whose ``rebalance_experts`` is
    :func:`vllm_rebalance` with ``policy`` (imports vLLM).

    The class attribute ``moved_replicas`` holds the replicas moved per layer by its last
    call with a map in force of the same shape (``None`` before).
    """
    import torch
    from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy

    if policy not in PLUGIN_POLICIES:
        raise param_error(
            "policy", "vllm_policy_class", f"one of {sorted(PLUGIN_POLICIES)}", repr(policy)
        )

    class StragglerEplbPolicy(AbstractEplbPolicy):
        """straggler's placement policy ``{policy}`` for vLLM's ``EplbState``."""

        straggler_policy = policy
        moved_replicas = None

        @classmethod
        def rebalance_experts(
            cls,
            weight,
            num_replicas,
            num_groups,
            num_nodes,
            num_ranks,
            old_global_expert_indices=None,
        ):
            w = weight.detach().cpu().numpy()
            old = old_global_expert_indices
            old = None if old is None else old.detach().cpu().numpy()
            p2l = vllm_rebalance(
                w, num_replicas, num_groups, num_nodes, num_ranks, old, policy=cls.straggler_policy
            )
            if old is not None and old.shape == p2l.shape:
                cls.moved_replicas = moved_replicas(old, p2l)
                _LOG.info(
                    "straggler %s: %d replicas moved over %d layers",
                    cls.straggler_policy, int(cls.moved_replicas.sum()), p2l.shape[0],
                )  # fmt: skip
            return torch.from_numpy(p2l)

    StragglerEplbPolicy.__doc__ = StragglerEplbPolicy.__doc__.format(policy=policy)
    StragglerEplbPolicy.__qualname__ = "StragglerEplbPolicy"  # as vLLM's logs print it
    return StragglerEplbPolicy


def register_vllm_plugin(environ=None) -> type | None:
    """The ``vllm.general_plugins`` entry point (module notes).

    Returns the policy class registered as ``EPLB_POLICIES["default"]``, or ``None`` when
    ``STRAGGLER_EPLB_POLICY`` is unset (nothing is imported or changed then). Calling it
    again registers a fresh class; vLLM calls it once per process.

    Parameters
    ----------
    environ : mapping, optional
        Default ``os.environ``.
    """
    name = plugin_policy(environ)
    if name is None:
        return None
    import vllm.distributed.eplb.policy as vllm_policy

    cls = vllm_policy_class(name)
    vllm_policy.EPLB_POLICIES["default"] = cls
    _LOG.info("straggler: vLLM's EPLB policy 'default' is straggler's %s", name)
    return cls
