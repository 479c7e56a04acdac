"""SGLang plug-in: straggler's placement as the EPLB algorithm ``--eplb-algorithm straggler``.

The package declares the entry point ``straggler = "straggler.runtime.engines.sglang_plugin:
register_sglang_plugin"`` in SGLang's general plug-in group ``sglang.srt.plugins``. SGLang
(0.5.23, ``sglang/srt/plugins/__init__.py``, ``load_plugins``) runs it once in each process
it starts (``Engine.__init__``, before the server arguments are built; each scheduler
process, where ``init_by_eplb`` and the EPLB manager run; the DP controller; the
detokenizer), then applies the hooks registered (``HookRegistry.apply_hooks``).

* ``STRAGGLER_EPLB_POLICY`` unset or empty: :func:`register_sglang_plugin` returns at once
  and changes nothing (``--eplb-algorithm straggler`` then fails as any unknown name does,
  SGLang's ``KeyError`` at the first rebalance).
* Set to a policy name (``place_experts``): it registers two ``AROUND`` hooks with
  SGLang's own ``HookRegistry``, on ``sglang.srt.eplb.eplb_algorithms.compute_algorithm``
  and ``...rebalance_experts`` (SGLang's ``init_by_eplb`` looks both up on the module at
  each call). ``compute_algorithm`` returns :data:`SGLANG_ALGORITHM` for the name
  ``"straggler"`` and calls SGLang's own function for every other name;
  ``rebalance_experts`` calls :func:`sglang_rebalance` for that value and SGLang's own
  function otherwise. SGLang's ``EplbAlgorithm`` enum, its server arguments and its CLI
  are untouched (``--eplb-algorithm`` is a free string in 0.5.23).
* Set to anything else: refused with one line on stderr and exit status 2 when the
  plug-in loads (SGLang's loader logs and skips a plug-in's ordinary exception).

Every EP rank runs the algorithm itself on its copy of the all-reduced window
(``EPLBManager.rebalance``): :func:`sglang_rebalance` is deterministic (no clock, no
unseeded randomness, no thread-count dependence), so the ranks agree.

The per-batch dispatch tables are the other integration point, not part of this plug-in:
with ``--ep-dispatch-algorithm lp`` SGLang asks a per-layer solver for each batch's
``log2phy_prob``; :func:`~straggler.runtime.install_table_solvers` puts a
:class:`~straggler.runtime.TableSolver` serving a
:class:`~straggler.runtime.TablePublisher`'s live tables in its place
(``set_global_lplb_solver``).
"""

from __future__ import annotations

import logging

from ...formulations.dispatch import logical_to_physical
from ...formulations.errors import param_error
from ...formulations.validation import check_array, check_int
from ._policies import PLUGIN_POLICIES, plugin_policy, run_policy

__all__ = [
    "SGLANG_ALGORITHM",
    "SGLANG_DISPATCH_RULES",
    "register_sglang_plugin",
    "sglang_dispatch_rule",
    "sglang_rebalance",
]

_LOG = logging.getLogger(__name__)
_FUNC = "sglang_rebalance"
#: The ``--eplb-algorithm`` name the plug-in serves (and the value its ``compute_algorithm``
#: hook returns for it).
SGLANG_ALGORITHM = "straggler"
_TARGET = "sglang.srt.eplb.eplb_algorithms."
#: SGLang's ``--ep-dispatch-algorithm`` -> the rule ``place_experts`` places for (``fake``
#: draws as ``dynamic`` does, ``expert_location_dispatch.py``).
SGLANG_DISPATCH_RULES = {"static": "static", "dynamic": "dynamic", "fake": "dynamic", "lp": "lp"}


def sglang_dispatch_rule(ep_dispatch_algorithm, moe_a2a_backend=None) -> str:
    """The dispatch rule of SGLang's ``--ep-dispatch-algorithm`` (module notes).

    Unset (``None``), SGLang resolves it when EPLB is on (``_handle_eplb_and_dispatch``,
    ``sglang/srt/arg_groups/parallel_hook.py``): ``dynamic`` without an all-to-all backend
    (``moe_a2a_backend == "none"``), ``static`` otherwise.

    Examples
    --------
    >>> sglang_dispatch_rule("fake"), sglang_dispatch_rule(None, "none")
    ('dynamic', 'dynamic')
    """
    if ep_dispatch_algorithm is None:
        return "dynamic" if moe_a2a_backend == "none" else "static"
    if ep_dispatch_algorithm not in SGLANG_DISPATCH_RULES:
        raise param_error(
            "ep_dispatch_algorithm", "sglang_dispatch_rule",
            f"one of {sorted(SGLANG_DISPATCH_RULES)} or None", repr(ep_dispatch_algorithm),
        )  # fmt: skip
    return SGLANG_DISPATCH_RULES[ep_dispatch_algorithm]


_ARGS = ("tokens_per_expert", "num_physical_experts", "num_local_physical_experts",
         "num_groups", "num_nodes", "algorithm")  # fmt: skip


def _sglang_rebalance_iv(tokens, P, P_local, num_groups, num_nodes, policy):
    if policy not in PLUGIN_POLICIES:
        raise param_error("policy", _FUNC, f"one of {sorted(PLUGIN_POLICIES)}", repr(policy))
    h = check_array(
        tokens, "tokens_per_expert", _FUNC, kind="real", ndim=(2, 3), lo=0,
        expected="SGLang's recorded window [n_steps, n_layers, n_experts] (or one step "
        "[n_layers, n_experts]) of non-negative counts",
    )  # fmt: skip
    if h.ndim == 2:  # as init_by_eplb: one step
        h = h[None]
    live = h.reshape(h.shape[0], -1).any(axis=1)
    if live.any():  # rows of SGLang's circular buffer not yet written are all zero
        h = h[live]
    P = check_int(P, "num_physical_experts", _FUNC, lo=1)
    P_local = check_int(P_local, "num_local_physical_experts", _FUNC, lo=1)
    if P % P_local:
        raise param_error(
            "num_physical_experts", _FUNC, f"a multiple of num_local_physical_experts={P_local}",
            repr(P),
        )  # fmt: skip
    G = 1 if num_groups is None else check_int(num_groups, "num_groups", _FUNC, lo=1)
    N = check_int(num_nodes, "num_nodes", _FUNC, lo=1)
    return h, P, P // P_local, G, N


def sglang_rebalance(
    tokens_per_expert,
    num_physical_experts: int,
    num_local_physical_experts: int,
    num_groups: int | None,
    num_nodes: int,
    *,
    policy: str = "place_experts",
    dispatch: str = "static",
):
    """The maps of the plug-in's policy on SGLang's arguments (numpy in, numpy out).

    Parameters
    ----------
    tokens_per_expert : array_like, shape (n_steps, n_layers, n_experts) or (n_layers, n_experts)
        SGLang's recorded window (the stat recorder's buffer, all-reduced over the ranks),
        placed step by step; all-zero steps (buffer rows not yet written) are left out.
    num_physical_experts, num_local_physical_experts : int
        Slots in all and per GPU (``num_gpus = P / P_local``).
    num_groups : int or None
        Expert groups (``None``: one group).
    num_nodes : int
        The hierarchical layout when ``num_groups % num_nodes == 0`` (SGLang's ``"auto"``
        rule), the global one otherwise.
    policy : str, default "place_experts"
        A key of :data:`~straggler.runtime.engines._policies.PLUGIN_POLICIES`.
    dispatch : {"static", "dynamic", "lp"}, default "static"
        SGLang's dispatch rule in force (:func:`sglang_dispatch_rule`); the hook reads it
        from SGLang's ``--ep-dispatch-algorithm`` at each call.

    Returns
    -------
    physical_to_logical : ndarray of int64, shape (n_layers, P)
    logical_to_physical : ndarray of int64, shape (n_layers, n_experts, X)
        Each expert's slots in increasing order, ``-1`` padded (SGLang pads it to ``P``
        columns in ``_init_raw``).
    logical_count : ndarray of int64, shape (n_layers, n_experts)

    Examples
    --------
    >>> import numpy as np
    >>> window = np.random.default_rng(0).poisson([40, 20, 5, 5, 3, 1, 1, 1], size=(6, 1, 8))
    >>> p2l, l2p, cnt = sglang_rebalance(window, 12, 3, None, 1)
    >>> p2l.shape, l2p.shape[:2], int(cnt.sum())
    ((1, 12), (1, 8), 12)
    """
    h, P, g, G, N = _sglang_rebalance_iv(
        tokens_per_expert, num_physical_experts, num_local_physical_experts, num_groups,
        num_nodes, policy,
    )  # fmt: skip
    if dispatch not in SGLANG_DISPATCH_RULES.values():
        raise param_error(
            "dispatch", _FUNC, f"one of {sorted(set(SGLANG_DISPATCH_RULES.values()))}",
            repr(dispatch),
        )  # fmt: skip
    p2l = run_policy(policy, h, P, G, N, g, dispatch=dispatch)
    l2p, cnt = logical_to_physical(p2l, h.shape[2])
    return p2l, l2p, cnt


def _hooks(policy: str):
    """The two ``AROUND`` hooks (module notes) serving ``policy``."""

    def compute_algorithm(original_fn, *args, **kwargs):
        raw = kwargs.get("raw_algorithm", args[0] if args else None)
        if raw == SGLANG_ALGORITHM:
            return SGLANG_ALGORITHM
        return original_fn(*args, **kwargs)

    def rebalance_experts(original_fn, *args, **kwargs):
        bound = dict(zip(_ARGS, args), **kwargs)
        if bound.get("algorithm") != SGLANG_ALGORITHM:
            return original_fn(*args, **kwargs)
        import torch
        from sglang.srt.runtime_context import get_exec

        moe = get_exec().moe
        rule = sglang_dispatch_rule(moe.ep_dispatch_algorithm, moe.moe_a2a_backend)
        tokens = bound["tokens_per_expert"]
        tokens = tokens.detach().cpu().numpy() if hasattr(tokens, "detach") else tokens
        maps = sglang_rebalance(
            tokens, bound["num_physical_experts"], bound["num_local_physical_experts"],
            bound["num_groups"], bound["num_nodes"], policy=policy, dispatch=rule,
        )  # fmt: skip
        _LOG.info("straggler %s (%s dispatch): placed %d layers", policy, rule, maps[0].shape[0])
        return tuple(torch.from_numpy(m) for m in maps)

    return compute_algorithm, rebalance_experts


def register_sglang_plugin(environ=None) -> tuple | None:
    """The ``sglang.srt.plugins`` entry point (module notes).

    Returns the two hook functions registered with SGLang's ``HookRegistry``, or ``None``
    when ``STRAGGLER_EPLB_POLICY`` is unset (nothing is imported or changed then). SGLang's
    ``load_plugins`` applies them (``HookRegistry.apply_hooks``) after every plug-in ran.

    Parameters
    ----------
    environ : mapping, optional
        Default ``os.environ``.
    """
    name = plugin_policy(environ)
    if name is None:
        return None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = _hooks(name)
    for attr, hook in zip(("compute_algorithm", "rebalance_experts"), hooks):
        HookRegistry.register(_TARGET + attr, hook, HookType.AROUND)
    _LOG.info("straggler: SGLang's --eplb-algorithm %s is straggler's %s", SGLANG_ALGORITHM, name)
    return hooks
