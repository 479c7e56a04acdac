"""The one cost family of the dispatch problem (TEMPO Eq. 1, 2 and 4).

Per GPU ``g`` with ``G`` activated replicas, ``N`` tokens and ``T`` M-tiles::

    t_g = max(a + b*G + b2*(T - G),   # memory-bound floor + tile staircase (Eq. 1, 2)
              c + beta*N,             # compute-bound linear term
              c2 + gamma*N)           # all-to-all traffic term (Eq. 4), optional

All parameters are in microseconds (per expert, per token, per tile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from .errors import InvalidInputError
from .validation import MAX_EXACT_INT, check_choice, check_int, check_options, check_real

__all__ = ["CostModel", "PRESETS", "MAX_COST_PARAMETER", "MAX_TILE"]

#: Largest value of a time parameter (``a``, ``b``, ``b2``, ``c``, ``beta``, ``c2``,
#: ``gamma``, in microseconds). Every time the library computes is a sum of at most
#: ``2**63`` per-GPU, per-layer times (int64 sizes), each at most ``3 + G + 3N`` multiples of
#: one parameter with ``G``, ``N <= 2**53`` (a layer's replicas and tokens,
#: ``DispatchProblem``'s bound): at most ``2**119`` multiples, so below ``2**900`` every time
#: stays far below float64's largest value, ``2**1024``, and a makespan is never infinite.
MAX_COST_PARAMETER = 2.0**900
#: Largest ``tile``: tiles are passed to the kernels as float64 (``CostModel.as_array``),
#: exact up to ``2**53``, and a tile beyond every layer's tokens (at most ``2**53``) already
#: makes every replica one tile.
MAX_TILE = MAX_EXACT_INT


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Max-affine per-GPU time model of one MoE layer.

    .. math::

        t_g = \\max(a + b G_g + b_2 (T_g - G_g),\\; c + \\beta N_g,\\; c_2 + \\gamma N_g)

    Parameters
    ----------
    a, b : float
        Floor intercept (us) and activation cost (us per activated replica, the weight
        streaming floor).
    c, beta : float
        Compute intercept (us) and slope (us per token).
    b2 : float, default 0
        Cost of each M-tile beyond the first of an activated replica (Eq. 2).
    tile : int, default 128
        M-tile size in tokens (grouped GEMM rounds each replica's tokens up to it).
    c2, gamma : float or None
        Optional traffic piece (Eq. 4); give both or neither.

    Raises
    ------
    InvalidInputError
        A parameter is negative, non-finite or above ``2**900``
        (``straggler.formulations.cost.MAX_COST_PARAMETER``: beyond it a time could overflow
        float64), ``tile`` above ``2**53``, or only one of ``c2``/``gamma`` is given.

    Examples
    --------
    >>> m = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> float(m.time(G=7, N=390))
    105.0
    >>> CostModel.preset("dsv3_a_offline").b
    14.78
    """

    a: float
    b: float
    c: float
    beta: float
    b2: float = 0.0
    tile: int = 128
    c2: float | None = None
    gamma: float | None = None

    def __post_init__(self) -> None:
        for name, value in _cost_model_iv(self).items():
            object.__setattr__(self, name, value)

    # --- derived views ---------------------------------------------------------------
    @property
    def has_traffic(self) -> bool:
        """Whether the traffic piece ``c2 + gamma*N`` is present."""
        return self.c2 is not None

    @property
    def has_tiles(self) -> bool:
        """Whether the tile staircase term is active (``b2 > 0``)."""
        return self.b2 > 0

    @property
    def token_pieces(self) -> tuple[tuple[float, float], ...]:
        """The token-linear pieces ``(intercept, slope)``: compute, then traffic if present."""
        pieces = [(self.c, self.beta)]
        if self.has_traffic:
            pieces.append((float(self.c2), float(self.gamma)))
        return tuple(pieces)

    def as_array(self) -> np.ndarray:
        """``[a, b, b2, c, beta, c2, gamma, tile]`` as float64, for kernels.

        An absent traffic piece is written as ``c2 = gamma = 0``, which is exact: every
        parameter is non-negative, so ``0 + 0*N`` never exceeds the other two pieces.
        """
        return np.array(
            [
                self.a,
                self.b,
                self.b2,
                self.c,
                self.beta,
                self.c2 if self.has_traffic else 0.0,
                self.gamma if self.has_traffic else 0.0,
                float(self.tile),
            ]
        )

    @property
    def n_star(self) -> float:
        """Inflection tokens per expert ``n* = b / beta`` of the two-piece model (inf if beta=0)."""
        return self.b / self.beta if self.beta > 0 else math.inf

    def time(self, G, N, T=None):
        """Per-GPU time for activated replicas ``G``, tokens ``N`` and tiles ``T`` (arrays ok).

        ``T`` defaults to ``G`` (every replica within one tile), which is exact when
        ``b2 == 0``.
        """
        G = np.asarray(G, dtype=float)
        N = np.asarray(N, dtype=float)
        T = G if T is None else np.asarray(T, dtype=float)
        t = np.maximum(self.a + self.b * G + self.b2 * (T - G), self.c + self.beta * N)
        if self.has_traffic:
            t = np.maximum(t, self.c2 + self.gamma * N)
        return t

    def replace(self, **changes) -> CostModel:
        """A copy with some parameters changed (validated again)."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        check_options(changes, kw, "CostModel.replace", "parameter")
        kw.update(changes)
        return CostModel(**kw)

    @classmethod
    def preset(cls, name: str) -> CostModel:
        """A calibrated parameter set by name; see :data:`PRESETS` for the list and sources."""
        return cls(**PRESETS[check_choice(name, "name", "CostModel.preset", sorted(PRESETS))])


def _cost_model_iv(m: CostModel) -> dict:
    """Validated, normalized parameters of a :class:`CostModel` (floats, an int tile).

    Every parameter is a finite non-negative real number at most ``MAX_COST_PARAMETER``
    (never a bool or a string such as ``"0.1"``); ``tile`` an integer in ``[1, MAX_TILE]``;
    ``c2`` and ``gamma`` given together or not at all.
    """
    func = "CostModel"
    hi = MAX_COST_PARAMETER
    out = {
        name: check_real(getattr(m, name), name, func, lo=0, hi=hi)
        for name in ("a", "b", "c", "beta", "b2")
    }
    out["tile"] = check_int(m.tile, "tile", func, lo=1, hi=MAX_TILE)
    if (m.c2 is None) != (m.gamma is None):
        raise InvalidInputError(
            "The 'c2' and 'gamma' parameters of CostModel must be given together "
            f"(the traffic piece of Eq. 4). Got c2={m.c2!r}, gamma={m.gamma!r} instead."
        )
    if m.c2 is not None:
        out["c2"] = check_real(m.c2, "c2", func, lo=0, hi=hi)
        out["gamma"] = check_real(m.gamma, "gamma", func, lo=0, hi=hi)
    return out


#: Every calibrated parameter set the TEMPO paper reports (Tables 6 and 7) and a fit to public
#: H20 grouped-GEMM timings. Offline fits are kernel-only two-piece models with ``a = c = 0``.
PRESETS: dict[str, dict] = {
    # Table 6: Testbed A, fp8 masked grouped GEMM, offline kernel grid.
    "qwen3_30b_a_offline": dict(a=0.0, b=1.74, c=0.0, beta=0.0108),
    "dsv2_lite_a_offline": dict(a=0.0, b=2.99, c=0.0, beta=0.0179),
    "dsv3_a_offline": dict(a=0.0, b=14.78, c=0.0, beta=0.0945),
    "dsv3_bf16_a_offline": dict(a=0.0, b=45.29, c=0.0, beta=0.1370),
    # Table 7: microbenchmark refits on Testbed A EP8.
    "dsv3_a_mb_gemm": dict(a=116.0, b=12.99, c=176.0, beta=0.0851),
    "dsv3_a_mb_full": dict(a=358.0, b=16.59, c=266.0, beta=0.358),
    "dsv3_a_refit2_full": dict(a=488.0, b=5.93, c=294.0, beta=0.356),
    # Table 7: serving three-term model (proxy DSv2-Lite shape).
    "dsv2_lite_a_serving": dict(a=16.4, b=2.99, c=15.6, beta=0.0179, c2=25.0, gamma=0.10),
    # Table 7: Testbed B tile-aware fits (Eq. 2) with the traffic pair of Eq. 4.
    "dsv3_b_tile": dict(a=37.1, b=8.32, b2=2.65, c=23.4, beta=0.0336, c2=25.0, gamma=0.10),
    "qwen3_235b_b_tile": dict(a=34.9, b=3.95, b2=1.23, c=34.8, beta=0.0154, c2=25.0, gamma=0.10),
    # Public H20 grouped-GEMM timings, Qwen3-235B expert shape, bf16 w13 (max-affine fit).
    "qwen3_235b_h20": dict(a=19.0, b=7.1, c=40.0, beta=0.178),
}
