"""``TableSolver``: SGLang's per-layer LP solver replaced by the live table of a publisher.

SGLang 0.5.23 (``sglang/srt/eplb/lplb_solver.py``) has no input for an external dispatch
table. With ``--ep-dispatch-algorithm lp`` it builds one ``LPLBSolver(phy2log, log2phy,
num_gpus, ep_group, ...)`` per MoE layer (``init_lplb_solvers`` in
``model_executor/model_runner_components/moe_ep_setup.py``), registers it with
``set_global_lplb_solver(layer_id, solver)``, and on every forward pass
``layers/moe/topk.py`` calls ``get_global_lplb_solver(layer_id).solve(topk_ids)`` and hands
the returned ``log2phy_prob [num_logical, num_physical]`` (float32, in the columns of
``metadata.logical_to_all_physical_map[layer_id]``) to the CUDA dispatch kernel. Ranks with
no tokens call ``solve`` with an empty ``topk_ids`` (``TopK.empty_topk_output``).

:class:`TableSolver` has that interface: ``solve(topk_ids)`` returns its layer's row of a
:class:`~straggler.runtime.TablePublisher` built on SGLang's map, the live tensor the
solver worker publishes into (no copy, no collective: every rank reads its own publisher).
:func:`install_table_solvers` replaces the solvers of every layer; call it after SGLang's
``init_lplb_solvers`` (start-up and after each EPLB rebalance, which rebuilds them).
"""

from __future__ import annotations

import numpy as np

from ..formulations.errors import InvalidInputError
from .publisher import TablePublisher

__all__ = ["TableSolver", "install_table_solvers"]


class TableSolver:
    """Serves layer ``layer`` of ``publisher`` where SGLang expects an ``LPLBSolver``.

    Parameters
    ----------
    publisher : TablePublisher
        Built on SGLang's ``metadata.logical_to_all_physical_map`` (``[L, E, P]``): its
        columns are the ones SGLang's dispatch kernel reads.
    layer : int
        The MoE layer (SGLang's ``layer_id``).

    Attributes
    ----------
    num_logical, max_copies : int
        ``E`` and ``P``, as on ``LPLBSolver``.
    log2phy : torch.Tensor
        The layer's map (a view of ``publisher.log2phy``).
    """

    def __init__(self, publisher, layer: int):
        if not isinstance(publisher, TablePublisher):
            raise InvalidInputError(
                "The 'publisher' parameter of TableSolver must be a TablePublisher. Got "
                f"{type(publisher).__name__} instead."
            )
        L = publisher.shape[0]
        if (
            isinstance(layer, bool)
            or not isinstance(layer, (int, np.integer))
            or not (0 <= layer < L)
        ):
            raise InvalidInputError(
                f"The 'layer' parameter of TableSolver must be an integer in [0, {L}). Got "
                f"{layer!r} instead."
            )
        self.publisher = publisher
        self.layer = int(layer)
        self.log2phy = publisher.log2phy[self.layer]
        self.num_logical, self.max_copies = (int(n) for n in publisher.shape[1:])

    def solve(self, topk_ids):
        """The live ``[E, P]`` table of the layer (``topk_ids`` is not needed: the table was
        solved from the counts the worker received)."""
        return self.publisher.probs[self.layer]

    def __repr__(self) -> str:
        return f"TableSolver(layer={self.layer}, version={self.publisher.version})"


def install_table_solvers(publisher, metadata=None) -> list:
    """Register a :class:`TableSolver` for every layer with SGLang's
    ``set_global_lplb_solver`` (needs SGLang); returns them.

    ``metadata`` (SGLang's ``ExpertLocationMetadata``, default the global one) must have
    the publisher's map: a table in other columns would put probabilities on the wrong
    replicas.
    """
    from sglang.srt.eplb.expert_location import get_global_expert_location_metadata
    from sglang.srt.eplb.lplb_solver import set_global_lplb_solver

    md = get_global_expert_location_metadata() if metadata is None else metadata
    if md is not None:
        engine = md.logical_to_all_physical_map.detach().cpu().numpy()
        ours = publisher.log2phy.detach().cpu().numpy()
        if engine.shape != ours.shape or not np.array_equal(engine, ours):
            raise InvalidInputError(
                "The publisher given to install_table_solvers must be built on SGLang's "
                f"logical_to_all_physical_map (shape {engine.shape}). Got a map of shape "
                f"{ours.shape}{'' if engine.shape != ours.shape else ' in other columns'} "
                "instead."
            )
    solvers = [TableSolver(publisher, layer) for layer in range(publisher.shape[0])]
    for layer, solver in enumerate(solvers):
        set_global_lplb_solver(layer, solver)
    return solvers
