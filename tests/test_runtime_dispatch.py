"""dispatch_and_count: the spec (plain reference), torch == reference, Triton == torch.

The Triton kernel runs under ``TRITON_INTERPRET=1`` on CPU (small sizes: the interpreter is
slow) and on CUDA where a GPU exists; everything skips cleanly without torch or triton.
"""

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from straggler.formulations import BackendUnavailableError, InvalidInputError, InvalidOptionError
from straggler.proofs.runtime import dispatch_violations, replica_tables, topk_batches
from straggler.runtime import dispatch_and_count
from straggler.runtime._dispatch_kernels import dispatch_reference

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed (runtime extra)")
needs_triton = pytest.mark.skipif(
    not (HAS_TORCH and HAS_TRITON), reason="torch and triton not installed (runtime extra)"
)
HAS_CUDA = False
if HAS_TORCH:
    import torch

    HAS_CUDA = torch.cuda.is_available()


# --- the spec itself, on the plain-Python reference (numpy only) -------------------------


@st.composite
def _instances(draw, max_experts=8, max_tokens=48):
    l2p, probs = draw(replica_tables(max_experts=max_experts))
    ids = draw(topk_batches(l2p.shape[0], max_tokens=max_tokens))
    seed = draw(st.integers(0, 2**31 - 1))
    return ids, l2p, probs, seed


@given(_instances())
@example((np.zeros((0, 2), np.int64), np.array([[3, -1]]), np.array([[1.0, 0.0]], np.float32), 0))
@example((np.full((40, 1), 0), np.array([[5, 6, 7]]), np.array([[0.2, 0.3, 0.5]], np.float32), 1))
@example((np.full((9, 2), -1), np.array([[0, 1]]), np.array([[0.5, 0.5]], np.float32), 0))
def test_reference_meets_the_spec(inst):
    ids, l2p, probs, seed = inst
    phys, counts = dispatch_reference(ids, l2p, probs, seed)
    assert phys.shape == ids.shape and counts.shape == (l2p.shape[0],)
    assert dispatch_violations(ids, l2p, probs, phys, counts) == []


@given(_instances(), st.integers(0, 60))
def test_num_valid_tokens_is_padding_of_the_rows_after(inst, n_valid):
    """Rows past num_valid_tokens (CUDA-graph padding, degenerate routing) are never
    counted nor mapped: the same output as those rows set to -1."""
    ids, l2p, probs, seed = inst
    masked = ids.copy()
    masked[n_valid:] = -1
    got = dispatch_and_count(ids, l2p, probs, seed=seed, num_valid_tokens=n_valid)
    want = dispatch_and_count(masked, l2p, probs, seed=seed)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_stratification_bound_on_a_large_batch():
    """10^4 tokens of one expert over 5 replicas: each within 1 token of its share."""
    rng = np.random.default_rng(7)
    l2p = np.array([[10, 11, 12, 13, 14]])
    probs = np.array([[0.123456, 0.3, 0.0, 0.2, 0.376544]], np.float32)
    for seed in range(5):
        ids = np.zeros((10_000, 1), np.int64)
        ids[rng.random(10_000) < 0.1] = -1
        phys, counts = dispatch_and_count(ids, l2p, probs, seed=seed)
        n = counts[0]
        real = np.array([(phys == s).sum() for s in l2p[0]])
        share = n * probs[0].astype(float) / probs[0].astype(float).sum()
        assert np.abs(real - share).max() < 1 and real[2] == 0


def test_rank_order_is_flat_order():
    """The r-th entry of an expert (token by token, slot by slot) takes the r-th stratum."""
    ids = np.array([[0, 1], [1, 0], [0, 0]])  # expert 0 at flat positions 0, 3, 4, 5
    l2p = np.array([[7, 8], [9, -1]])
    probs = np.array([[0.5, 0.5], [1.0, 0.0]])
    phys, _ = dispatch_and_count(ids, l2p, probs)
    assert phys.ravel()[[0, 3, 4, 5]].tolist() == [7, 7, 8, 8]
    assert phys.ravel()[[1, 2]].tolist() == [9, 9]


def test_seed_is_deterministic_and_rotates_the_offset():
    ids = np.zeros((1, 1), np.int64)  # one token: the offset alone decides its replica
    l2p = np.array([[0, 1, 2, 3]])
    probs = np.full((1, 4), 0.25)
    picks = {int(dispatch_and_count(ids, l2p, probs, seed=s)[0][0, 0]) for s in range(64)}
    assert picks == {0, 1, 2, 3}
    a = dispatch_and_count(np.zeros((5, 3), np.int64), l2p, probs, seed=11)[0]
    b = dispatch_and_count(np.zeros((5, 3), np.int64), l2p, probs, seed=11)[0]
    assert np.array_equal(a, b)


def test_single_expert_offsets_spread_across_experts():
    """With one token per expert (decode), the per-expert offsets spread the singletons
    over the replica columns instead of always picking one (vLLM's modulo-rule bias)."""
    E = 256
    l2p = np.tile(np.array([[0, 1]]), (E, 1))
    probs = np.full((E, 2), 0.5)
    phys, _ = dispatch_and_count(np.arange(E)[:, None], l2p, probs)
    share = (phys == 1).mean()
    assert 0.35 < share < 0.65


def test_counter_accumulates_and_int32_wraps():
    ids = np.array([[0, 1], [1, -1]])
    l2p = np.array([[0], [1]])
    probs = np.ones((2, 1))
    c64 = np.zeros(2, np.int64)
    dispatch_and_count(ids, l2p, probs, counter=c64)
    dispatch_and_count(ids, l2p, probs, counter=c64)
    assert c64.tolist() == [2, 4]
    c32 = np.array([2**31 - 1, 0], np.int32)
    with np.errstate(over="ignore"):
        dispatch_and_count(ids, l2p, probs, counter=c32)
    assert c32.tolist() == [-(2**31), 2]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(topk_ids=[[0, 3]]), "topk_ids"),
        (dict(topk_ids=[[0.5]]), "topk_ids"),
        (dict(log2phy=[[0, 1, 2]]), "probs"),
        (dict(log2phy=[[-2], [1]], probs=[[1.0], [1.0]]), "log2phy"),
        (dict(probs=[[np.nan], [1.0]]), "probs"),
        (dict(probs=[[-1.0], [1.0]]), "probs"),
        (dict(log2phy=[[-1], [1]]), "replica"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(check=1), "check"),
        (dict(counter=np.zeros(3, np.int64)), "counter"),
        (dict(counter=np.zeros(2, np.float64)), "counter"),
        (dict(num_valid_tokens=-1), "num_valid_tokens"),
        (dict(num_valid_tokens=1.0), "num_valid_tokens"),
    ],
)
def test_bad_input_is_named(kwargs, match):
    args = dict(topk_ids=[[0, 1]], log2phy=[[0], [1]], probs=[[1.0], [1.0]])
    args.update(kwargs)
    with pytest.raises(InvalidInputError, match=match):
        dispatch_and_count(args.pop("topk_ids"), args.pop("log2phy"), args.pop("probs"), **args)


def test_bad_backend():
    with pytest.raises(InvalidOptionError, match="backend"):
        dispatch_and_count([[0]], [[0]], [[1.0]], backend="cuda")
    with pytest.raises(InvalidInputError, match="numpy inputs"):
        dispatch_and_count([[0]], [[0]], [[1.0]], backend="torch")


def test_unchecked_padding_rule():
    """check=False: out-of-range ids are padding, negative and NaN weights are zero."""
    phys, counts = dispatch_and_count(
        np.array([[5, -3, 0]]), np.array([[4, 6]]), np.array([[np.nan, -2.0]]), check=False
    )
    assert phys.tolist() == [[-1, -1, 4]] and counts.tolist() == [1]  # torn row: uniform


def test_unchecked_orphan_expert_is_padding_not_counted():
    """check=False: an expert whose row lists no replica maps to -1 and is not counted
    (the counts are exactly the entries sent to a slot)."""
    ids = np.array([[0, 1], [1, 2], [1, -1]])
    l2p = np.array([[4, 5], [-1, -1], [7, -1]])
    probs = np.array([[0.5, 0.5], [0.3, 0.7], [1.0, 0.0]])
    want_phys = [[4, -1], [-1, 7], [-1, -1]]
    phys, counts = dispatch_and_count(ids, l2p, probs, check=False)
    assert phys.tolist() == want_phys and counts.tolist() == [1, 0, 1]
    if HAS_TORCH:
        tensors = [torch.as_tensor(a) for a in (ids, l2p, probs)]
        c = torch.zeros(3, dtype=torch.int64)
        tphys, tcounts = dispatch_and_count(*tensors, check=False, backend="torch", counter=c)
        assert tphys.tolist() == want_phys and tcounts.tolist() == [1, 0, 1]
        assert c.tolist() == [1, 0, 1]


# --- torch reference == plain reference ------------------------------------------------


@needs_torch
@given(
    _instances(),
    st.one_of(st.none(), st.integers(0, 50)),
    st.sampled_from(["int64", "int32"]),
    st.sampled_from(["float32", "float64", "bfloat16"]),
)
def test_torch_equals_reference(inst, n_valid, id_dtype, p_dtype):
    ids, l2p, probs, seed = inst
    tp = torch.tensor(probs).to(getattr(torch, p_dtype))
    ti = torch.tensor(ids).to(getattr(torch, id_dtype))
    nv = n_valid if n_valid is None or n_valid % 2 else torch.tensor([n_valid])
    phys, counts = dispatch_and_count(
        ti, torch.tensor(l2p), tp, seed=seed, backend="torch", num_valid_tokens=nv
    )
    ref_phys, ref_counts = dispatch_reference(ids, l2p, tp.double().numpy(), seed, None, n_valid)
    assert phys.dtype == ti.dtype and tuple(phys.shape) == ids.shape
    assert np.array_equal(phys.numpy(), ref_phys) and np.array_equal(counts.numpy(), ref_counts)


@needs_torch
def test_torch_counter_and_errors():
    ids = torch.tensor([[0, 1], [1, -1]])
    l2p = torch.tensor([[0], [1]])
    probs = torch.ones(2, 1)
    counter = torch.zeros(2, dtype=torch.int32)
    dispatch_and_count(ids, l2p, probs, counter=counter, backend="torch")
    assert counter.tolist() == [1, 2]
    with pytest.raises(InvalidInputError, match="all torch"):
        dispatch_and_count(ids, np.array([[0], [1]]), probs)
    with pytest.raises(InvalidInputError, match="topk_ids"):
        dispatch_and_count(torch.tensor([[0, 2]]), l2p, probs)
    with pytest.raises(InvalidInputError, match="probs"):
        dispatch_and_count(ids, l2p, torch.ones(2, 1, dtype=torch.int64))
    with pytest.raises(InvalidInputError, match="counter"):
        dispatch_and_count(ids, l2p, probs, counter=torch.zeros(2))
    with pytest.raises(InvalidInputError, match="num_valid_tokens"):
        dispatch_and_count(ids, l2p, probs, num_valid_tokens=torch.tensor([1.0]))
    with pytest.raises(InvalidInputError, match="num_valid_tokens"):
        dispatch_and_count(ids, l2p, probs, num_valid_tokens=torch.tensor([-1]))
    if not HAS_TRITON:
        with pytest.raises(BackendUnavailableError, match="triton"):
            dispatch_and_count(ids, l2p, probs, backend="triton")


# --- Triton kernel == torch reference (interpreter on CPU, compiled on CUDA) -------------


@pytest.fixture
def interpret(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return "cuda" if HAS_CUDA else "cpu"


def _triton_vs_torch(
    device,
    ids,
    l2p,
    probs,
    seed,
    *,
    block=None,
    n_programs=None,
    counter_dtype=None,
    n_valid=None,
):
    from straggler.runtime._dispatch_kernels import dispatch_torch, dispatch_triton

    ti = torch.as_tensor(ids, device=device)
    tl2p = torch.as_tensor(l2p, device=device)
    tp = torch.as_tensor(probs, device=device)
    c_tri = c_ref = None
    if counter_dtype is not None:
        c_tri = torch.full((l2p.shape[0],), 5, dtype=counter_dtype, device=device)
        c_ref = c_tri.clone()
    nv = None if n_valid is None else torch.tensor([n_valid], device=device)
    got = dispatch_triton(ti, tl2p, tp, seed, c_tri, nv, block=block, n_programs=n_programs)
    want = dispatch_torch(ti, tl2p, tp, seed, c_ref, nv)
    assert torch.equal(got[0], want[0]), (ids, l2p, probs, seed)
    assert torch.equal(got[1], want[1])
    if counter_dtype is not None:
        assert torch.equal(c_tri, c_ref)
    if n_valid is not None:
        ids = ids.copy()
        ids[n_valid:] = -1  # the checker's view: those rows are padding
    assert dispatch_violations(ids, l2p, probs, got[0].cpu().numpy(), got[1].cpu().numpy()) == []


@needs_triton
@settings(max_examples=12)
@given(
    _instances(max_experts=20, max_tokens=40),
    st.sampled_from([16, 32, 64]),
    st.sampled_from([1, 3]),
    st.one_of(st.none(), st.integers(0, 40)),
)
def test_triton_equals_torch(inst, block, n_programs, n_valid):
    ids, l2p, probs, seed = inst
    old = os.environ.get("TRITON_INTERPRET")
    if not HAS_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        dev = "cuda" if HAS_CUDA else "cpu"
        _triton_vs_torch(
            dev, ids, l2p, probs, seed, block=block, n_programs=n_programs, n_valid=n_valid
        )
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


ADVERSARIAL = {
    "empty batch": (np.zeros((0, 8), np.int64), [[0, 1]], [[0.5, 0.5]]),
    "all padding": (np.full((7, 2), -1), [[0, 1]], [[0.5, 0.5]]),
    "one expert, many tiles": (np.zeros((90, 2), np.int64), [[3, 9, 4]], [[0.2, 0.5, 0.3]]),
    "zero row": (np.zeros((20, 1), np.int64), [[3, 9, -1]], [[0.0, 0.0, 0.7]]),
    "-1 columns with junk": (
        np.array([[0, 1]] * 9),
        [[-1, 2, -1], [5, -1, 6]],
        [[0.9, 0.1, 0.9], [0.0, 0.4, 0.6]],
    ),
    "single replica": (np.array([[0, 1, 2]] * 11), [[0], [1], [2]], [[1.0], [0.0], [0.3]]),
    "zero-prob replica": (np.zeros((33, 1), np.int64), [[1, 2, 3]], [[0.5, 0.0, 0.5]]),
    "orphan expert": (
        np.array([[0, 1], [1, 2], [2, 1]] * 7),
        [[4, 5], [-1, -1], [7, -1]],
        [
            [0.5, 0.5],
            [0.3, 0.7],
            [1.0, 0.0],
        ],
    ),
}


@needs_triton
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("counter_dtype", [None, "int32", "int64"])
def test_triton_adversarial(interpret, name, counter_dtype):
    ids, l2p, probs = ADVERSARIAL[name]
    dt = None if counter_dtype is None else getattr(torch, counter_dtype)
    _triton_vs_torch(
        interpret,
        np.asarray(ids),
        np.asarray(l2p),
        np.asarray(probs, np.float32),
        3,
        block=16,
        n_programs=2,
        counter_dtype=dt,
    )


@needs_triton
def test_triton_public_entry_and_dtypes(interpret):
    rng = np.random.default_rng(3)
    E, X = 40, 3
    l2p = np.stack([rng.choice(64, X, replace=False) for _ in range(E)])
    probs = rng.random((E, X))
    ids = rng.integers(-1, E, size=(70, 4))
    for id_dt, p_dt in [(torch.int32, torch.float16), (torch.int64, torch.float64)]:
        ti = torch.tensor(ids, dtype=id_dt, device=interpret)
        tp = torch.tensor(probs, device=interpret).to(p_dt)
        tl2p = torch.tensor(l2p, dtype=torch.int32, device=interpret)
        a = dispatch_and_count(ti, tl2p, tp, seed=9, backend="triton")
        b = dispatch_and_count(ti, tl2p, tp, seed=9, backend="torch")
        assert a[0].dtype == id_dt and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.skipif(not HAS_CUDA or not HAS_TRITON, reason="needs a CUDA GPU and triton")
@pytest.mark.parametrize("n_tok", [4096, 16384, 65536])
def test_triton_equals_torch_on_cuda_at_scale(n_tok):
    """The benchmark sizes (4k-64k tokens x top-8, 256 experts, 288 slots), on the GPU."""
    rng = np.random.default_rng(n_tok)
    E, X = 256, 3
    l2p = np.full((E, X), -1)
    l2p[:, 0] = np.arange(E)
    extra = rng.choice(E, 32, replace=False)
    l2p[extra, 1] = E + np.arange(32)
    probs = rng.random((E, X)) * (l2p >= 0)
    w = 1.0 / np.arange(1, E + 1)
    ids = rng.choice(E, size=(n_tok, 8), p=w / w.sum())
    ids[rng.random(n_tok) < 0.05] = -1
    _triton_vs_torch("cuda", ids, l2p, probs.astype(np.float32), 5)


@pytest.mark.skipif(not HAS_CUDA or not HAS_TRITON, reason="needs a CUDA GPU and triton")
def test_triton_kernel_replays_in_a_cuda_graph():
    """Captured once, replayed with new ids, a new table and a new valid-token count (all
    read through the captured addresses), the kernel gives the torch reference's output and
    keeps counting into the persistent counter."""
    from straggler.runtime._dispatch_kernels import dispatch_torch, dispatch_triton

    rng = np.random.default_rng(11)
    E, X, n_tok = 64, 3, 512
    l2p = torch.tensor(
        np.stack([rng.choice(96, X, replace=False) for _ in range(E)]), device="cuda"
    )
    probs = torch.rand(E, X, device="cuda")
    ids = torch.randint(-1, E, (n_tok, 8), device="cuda", dtype=torch.int32)
    nvalid = torch.tensor([n_tok], device="cuda")
    counter = torch.zeros(E, dtype=torch.int64, device="cuda")
    dispatch_triton(ids, l2p, probs, 1, counter, nvalid)  # compile outside the capture
    counter.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        phys, counts = dispatch_triton(ids, l2p, probs, 1, counter, nvalid)
    total = torch.zeros_like(counter)
    for step in range(4):
        ids.copy_(torch.randint(-1, E, (n_tok, 8), device="cuda", dtype=torch.int32))
        probs.copy_(torch.rand(E, X, device="cuda") * (torch.rand(E, X, device="cuda") > 0.3))
        nvalid.fill_(n_tok - 50 * step)
        graph.replay()
        want = dispatch_torch(ids, l2p, probs, 1, None, nvalid)
        torch.cuda.synchronize()
        assert torch.equal(phys, want[0]) and torch.equal(counts, want[1])
        total += want[1]
        assert torch.equal(counter, total)
