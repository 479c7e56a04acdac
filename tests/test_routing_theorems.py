"""Part II theorems (proofs/THEOREMS.md, Part II) as hypothesis properties, exact on integers."""

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st
from straggler.formulations.routing import (
    apply_assignment,
    discount_vector,
    f_score,
    horizon_f_score,
    horizon_margins,
    imbalance,
    margins,
)

loads_st = st.lists(st.integers(0, 10**6), min_size=1, max_size=9)


@given(L=loads_st, data=st.data())
@example(L=[5, 5], data=None)
def test_R1_fscore_is_minus_the_change_of_imbalance(L, data):
    """Theorem R1: I(L + D e_g) - I(L) = -F_g(Q), F_g(Q) = D - G (D - m_g)_+."""
    L = np.array(L, dtype=float)
    G = L.size
    if data is None:
        g, Q = 0, [3, 4]
    else:
        g = data.draw(st.integers(0, G - 1))
        Q = data.draw(st.lists(st.integers(0, 10**6), max_size=5))
    D = float(sum(Q))
    assignment = np.full(len(Q), g)
    after = apply_assignment(L, assignment, np.array(Q, dtype=float))
    assert imbalance(after) - imbalance(L) == -f_score(D, margins(L)[g], G)


@given(m=st.integers(0, 10**6), G=st.integers(1, 64), D=st.integers(0, 2 * 10**6))
def test_R2_two_slopes(m, G, D):
    """Theorem R2: slope 1 below the margin, -(G-1) at and above it; the kink is at D = m."""
    step = f_score(D + 1, m, G) - f_score(D, m, G)
    assert step == (1.0 if D < m else -(G - 1.0))
    assert f_score(D, m, G) == (D if D <= m else G * m - (G - 1) * D)


@given(
    L=st.lists(st.lists(st.integers(0, 1000), min_size=3, max_size=3), min_size=1, max_size=6),
    D=st.integers(0, 3000),
    data=st.data(),
)
def test_R3_horizon_fscore_is_discounted_imbalance_change(L, D, data):
    """Theorem R3: with alpha = 1, beta = G the horizon F is -sum_h d_h (I_h(after) - I_h)."""
    P = np.array(L, dtype=float)  # (G, H+1) with H = 2
    G = P.shape[0]
    g = data.draw(st.integers(0, G - 1))
    gamma = data.draw(st.sampled_from([1.0, 0.5, 0.25]))
    d = discount_vector(P.shape[1] - 1, gamma)
    after = P.copy()
    after[g] += D
    change = float((imbalance(after) - imbalance(P)) @ d)
    F = horizon_f_score(D, horizon_margins(P)[g], alpha=1.0, beta=float(G), gamma=gamma)
    assert F == -change


@given(m=st.integers(0, 1000), G=st.integers(1, 32), D=st.integers(0, 3000))
def test_R3_reduction_to_br0_score(m, G, D):
    """With H = 0, alpha = 1, beta = G the horizon F-score is the BR-0 F-score (any gamma)."""
    for gamma in (1.0, 0.3):
        assert horizon_f_score(D, [m], alpha=1.0, beta=float(G), gamma=gamma) == f_score(D, m, G)
