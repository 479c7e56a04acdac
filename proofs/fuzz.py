"""Hypothesis strategies for fuzzing every public entry point, and the contract they check.

The contract (the error hierarchy of :mod:`straggler.formulations.errors`): called with
anything, an entry point either returns a valid answer, which the independent checkers accept,
or raises an
:class:`~straggler.formulations.errors.InvalidInputError` (an ``InvalidOptionError`` for an
unknown choice) whose message names the offending parameter (for a trace file: the file, and
the line where a row is at fault). Never another exception, never a silent no-op.

Strategies draw *mostly valid* arguments with a few values replaced by :func:`junk` of every
kind a caller gets wrong (bools for numbers, numeric strings, complex numbers, NaN and
infinities, integers beyond int64, ragged lists, object and string arrays, wrong shapes,
huge magnitudes), so that both the validation and the code behind it are reached. Each
strategy returns a :class:`Call`: the keyword arguments and the set of parameters that were
spoiled (an error must name one of them; with none spoiled the call must succeed).

:func:`trace_files` draws whole trace files as bytes (Azure, Mooncake, BurstGPT and
length-only, with mutated rows, non-UTF-8 bytes, binary junk and gzip); :func:`cli_calls`
invocations of the three commands with absurd flags and unwritable outputs;
:func:`publisher_ops` and :func:`worker_ops` call sequences of the runtime's stateful
objects; :func:`extreme_calls` dispatch calls whose numbers sit at the library's numeric
bounds; :func:`sweep_tables` and :func:`calibration_logs` what the library's own text writers
(``SweepTable.to_csv``, ``write_calibration_log``) and :func:`calibration_results` what
``CalibrationResult.save`` is given, for the round trip "a write
succeeds exactly when its reader gives back what was written". (Engine files, damaged binary
files, statistics sets and special paths: :mod:`straggler.proofs.engine_strategies`.)

>>> from hypothesis import given, settings
>>> @settings(max_examples=5, database=None)
... @given(cost_model_calls())
... def check(call):
...     assert set(call.kwargs) >= {"a", "b", "c", "beta"}
>>> check()
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from .strategies import cost_models, dispatch_instances

__all__ = [
    "Call",
    "junk",
    "spoil",
    "cost_model_calls",
    "problem_calls",
    "placement_calls",
    "method_option_calls",
    "solve_calls",
    "bound_calls",
    "routing_calls",
    "simulate_calls",
    "trace_files",
    "TraceFile",
    "names_parameter",
    "FUZZ_METHOD_OPTIONS",
    "FLAG_JUNK",
    "CliCall",
    "cli_calls",
    "publisher_ops",
    "worker_ops",
    "EXTREME_FINITE",
    "extreme_calls",
    "extreme_deployment_calls",
    "TRICKY_TEXT",
    "sweep_tables",
    "calibration_logs",
    "calibration_results",
]


@dataclass
class Call:
    """Arguments of one fuzzed call."""

    kwargs: dict
    """Keyword arguments (positional ones under their parameter names)."""
    spoiled: set = field(default_factory=set)
    """Parameters replaced by junk (or made inconsistent): an error must name one of them."""


def names_parameter(message: str, params) -> bool:
    """Whether an error message names one of ``params`` the library's way (``'name'``)."""
    return any(f"'{p}'" in message for p in params)


# --- junk ------------------------------------------------------------------------------
_JUNK_SCALARS = [
    True,
    False,
    np.True_,
    None,
    "3",
    "1e3",
    "",
    "abc",
    b"7",
    1 + 2j,
    np.complex128(1),
    math.nan,
    math.inf,
    -math.inf,
    -1,
    -0.5,
    2**63,
    10**30,
    -(2**63) - 1,
    1e308,
    1e-320,
    np.float32(np.nan),
    np.uint64(2**64 - 1),
    np.int8(-3),
    [],
    [1, 2],
    {"a": 1},
    object(),
]


@st.composite
def junk(draw, *, like=None):
    """A value a caller might pass by mistake: a bad scalar, a bad or ragged sequence, an
    array of a strange dtype or shape; ``like`` (an array) guides shapes."""
    kind = draw(st.sampled_from(["scalar", "list", "array", "array", "shape"]))
    if kind == "scalar":
        return draw(st.sampled_from(_JUNK_SCALARS))
    if kind == "list":
        return draw(
            st.sampled_from(
                [
                    [[1, 2], [3]],
                    [1, [2, 3]],
                    ["1", "2"],
                    [True, False],
                    [None, 1],
                    [1 + 1j, 2],
                    [10**30, 1],
                    [math.nan, 1.0],
                    [-1, 2],
                    [[[]]],
                    [{"a": 1}],
                ]
            )
        )
    shape = np.shape(like) if like is not None and np.ndim(like) else (3,)
    if kind == "shape":
        dims = draw(st.sampled_from([(), (0,), shape + (2,), shape[:-1] or (0, 0), (2, 3, 4, 5)]))
        return np.zeros(dims)
    dtype = draw(
        st.sampled_from(["float16", "float32", "int8", "uint64", "bool", "complex64", "U3", "O"])
    )
    base = np.asarray(like) if like is not None else np.arange(3)
    try:
        with np.errstate(all="ignore"):
            a = base.astype(dtype)
    except (ValueError, TypeError, OverflowError):
        a = np.zeros(shape, dtype=dtype)
    if a.dtype.kind == "f" and a.size and draw(st.booleans()):
        a = a.copy()
        with np.errstate(over="ignore"):  # 1e30 is inf in float16: junk either way
            a.flat[0] = draw(st.sampled_from([np.nan, np.inf, -1.0, 1e30]))
    if a.dtype.kind == "u" and a.size and draw(st.booleans()):
        a = a.copy()
        a.flat[0] = np.iinfo(np.uint64).max
    return a


@st.composite
def spoil(draw, kwargs: dict, *, at_most: int = 2, likes=None) -> Call:
    """``kwargs`` with up to ``at_most`` values replaced by :func:`junk` (often none)."""
    keys = sorted(kwargs)
    n = draw(st.integers(0, min(at_most, len(keys))))
    chosen = draw(st.permutations(keys))[:n] if keys else []
    out = dict(kwargs)
    for k in chosen:
        out[k] = draw(junk(like=(likes or {}).get(k, kwargs[k])))
    return Call(kwargs=out, spoiled=set(chosen))


# --- formulations ----------------------------------------------------------------------
@st.composite
def cost_model_calls(draw) -> Call:
    """Keyword arguments of ``CostModel``: a valid model's parameters, some spoiled, and
    sometimes a traffic piece given half-way."""
    m = draw(cost_models())
    kw = dict(a=m.a, b=m.b, c=m.c, beta=m.beta, b2=m.b2, tile=m.tile)
    if m.has_traffic:
        kw.update(c2=m.c2, gamma=m.gamma)
    call = draw(spoil(kw))
    if draw(st.integers(0, 9)) == 0:
        call.kwargs.pop("gamma", None)
        call.kwargs["c2"] = 1.0
        call.spoiled |= {"c2", "gamma"}
    return call


@st.composite
def problem_calls(draw, *, stack: bool | None = None) -> Call:
    """Keyword arguments of ``DispatchProblem``: counts, replicas (2-D, or 3-D for a stack)
    and sometimes gpu_node, then spoiled (including shape mismatches and orphan experts)."""
    p, _ = draw(dispatch_instances(max_experts=5, max_gpus=3))
    is_stack = draw(st.booleans()) if stack is None else stack
    counts, rep = p.counts, p.replicas
    if is_stack:
        L = draw(st.integers(1, 3))
        counts = np.stack([np.roll(counts, k) for k in range(L)])
        rep = np.stack([rep] * L) if draw(st.booleans()) else rep
    kw = {"counts": counts.tolist() if draw(st.booleans()) else counts, "replicas": rep}
    if draw(st.booleans()):
        kw["gpu_node"] = np.zeros(p.n_gpus, dtype=np.int64)
    call = draw(spoil(kw))
    mutation = draw(st.sampled_from(["none", "none", "orphan", "mismatch", "empty"]))
    if mutation == "orphan" and "replicas" not in call.spoiled and "counts" not in call.spoiled:
        r = np.array(call.kwargs["replicas"], dtype=bool, copy=True)
        r[..., 0, :] = False
        c = np.array(call.kwargs["counts"], copy=True)
        c[..., 0] += 1
        call.kwargs.update(replicas=r, counts=c)
        call.spoiled |= {"replicas"}
    elif mutation == "mismatch" and "replicas" not in call.spoiled:
        r = np.asarray(call.kwargs["replicas"])
        call.kwargs["replicas"] = np.concatenate([r, r[..., :1, :]], axis=-2)
        call.spoiled |= {"replicas", "counts"}
    elif mutation == "empty":
        call.kwargs["counts"] = np.zeros((0, p.n_experts), np.int64)  # a zero-layer stack
        call.spoiled |= {"counts"}
    return call


@st.composite
def placement_calls(draw) -> Call:
    """Arguments of ``DispatchProblem.from_placement``: counts, a physical-to-logical map
    (sometimes ragged or out of range), n_gpus."""
    n_gpus = draw(st.integers(1, 3))
    per = draw(st.integers(1, 3))
    E = draw(st.integers(1, per * n_gpus))
    owners = list(range(E)) + draw(
        st.lists(st.integers(-1, E - 1), min_size=per * n_gpus - E, max_size=per * n_gpus - E)
    )
    p2l = draw(st.permutations(owners))
    counts = draw(st.lists(st.integers(0, 50), min_size=E, max_size=E))
    kw = {"counts": counts, "physical_to_logical": list(p2l), "n_gpus": n_gpus}
    call = draw(spoil(kw))
    if draw(st.integers(0, 5)) == 0:
        call.kwargs["physical_to_logical"] = [list(p2l), list(p2l)[:-1]]  # ragged
        call.spoiled |= {"physical_to_logical"}
    return call


# --- solve_dispatch ----------------------------------------------------------------------
#: Valid values of each dispatch method's options (junk is drawn besides them).
FUZZ_METHOD_OPTIONS = {
    "tempo": {
        "seed": [True, False],
        "chains": [True, False],
        "local_search": [True, False],
        "ensemble": [True, False],
        "rebalance": [True, False],
        "tau": [0.0, 0.01, 0.5],
        "max_iter": [0, 3, 300],
    },
    "milp": {
        "tightened": [True, False],
        "mip_rel_gap": [0.0, 1e-4, 0.5],
        "threads": [1],
        "seed": [0, 7],
        "warm_start": [None, "tempo", "uniform"],
        "backend": ["highs"],
    },
    "round_robin": {"rule": ["auto", "fewest"]},
    "token_lp": {"topology": [None]},
    "moonep": {"charge_ratio": [0.0, 4.0]},
    "semi_matching": {},
    "static": {
        "rule": ["first", "random", "sglang"],
        "version": ["same_node", "same_gpu"],
        "seed": [0, 42],
        "top_k": [1, 8],
    },
    "uniform": {"integer": [True, False]},
    "metro": {"exact": [True, False], "order": ["tokens", "index"]},
    "llep": {"cap_factor": [1.0, 1.1, 2.0], "min_chunk": [1, 1024], "threshold": [1.0, 1.3]},
    "lplb": {"topology": ["auto", "ring"], "solver": ["exact", "ipm"], "top_k": [1, 8]},
    "sglang_dynamic": {"version": ["same_node", "uniform"], "top_k": [2, 8]},
    "vllm_ep": {"version": ["hash", "modulo", "random"], "layout_seed": [0, 3]},
    "sglang_lp": {},
}


@st.composite
def method_option_calls(draw, method: str) -> Call:
    """Options of ``method``: valid values, some spoiled, sometimes an unknown name."""
    table = FUZZ_METHOD_OPTIONS.get(method, {})
    kw = {k: draw(st.sampled_from(v)) for k, v in table.items() if draw(st.booleans())}
    call = draw(spoil(kw, at_most=1))
    if draw(st.integers(0, 9)) == 0:
        call.kwargs["no_such_option"] = 1
        call.spoiled |= {"no_such_option"}
    return call


@st.composite
def solve_calls(draw, method: str) -> Call:
    """A ``solve_dispatch`` call: a valid small problem (sometimes a stack) and cost, the
    method's options, ``time_limit`` and ``rng``, any of them possibly spoiled."""
    problem, cost = draw(dispatch_instances(max_experts=5, max_gpus=3))
    if draw(st.integers(0, 3)) == 0:
        from ..formulations.dispatch import DispatchProblem

        L = draw(st.integers(1, 3))
        problem = DispatchProblem(
            counts=np.stack([np.roll(problem.counts, k) for k in range(L)]),
            replicas=problem.replicas,
        )
    opts = draw(method_option_calls(method))
    base = {
        "problem": problem,
        "cost": cost,
        "time_limit": draw(st.sampled_from([5.0, 0.5, math.inf])),
        "rng": draw(st.sampled_from([None, 0, 12345])),
    }
    call = draw(spoil(base, at_most=1))
    if draw(st.integers(0, 7)) == 0:
        call.kwargs["time_limit"] = draw(st.sampled_from([1e-9, 1e-6, 1e-3]))  # stops at the limit
    call.kwargs.update(opts.kwargs)
    call.spoiled |= opts.spoiled
    return call


@st.composite
def bound_calls(draw) -> Call:
    """A ``certified_lower_bound`` call: a valid small problem (sometimes a stack) and cost,
    either possibly spoiled (its only parameters: no caller value enters the certificate)."""
    from ..formulations.dispatch import DispatchProblem

    problem, cost = draw(dispatch_instances(max_experts=5, max_gpus=3))
    if draw(st.booleans()):
        problem = DispatchProblem(
            counts=np.stack([problem.counts, problem.counts[::-1]]), replicas=problem.replicas
        )
    return draw(spoil({"problem": problem, "cost": cost}, at_most=2))


# --- routing ------------------------------------------------------------------------------
@st.composite
def routing_calls(draw) -> Call:
    """A ``route_batch`` call: pool lengths, loads (1-D, or 2-D for BR-H), free slots, policy
    and options, some spoiled; edge values (free slots summing past int64, lengths near the
    float maximum, empty pools) included."""
    from ..solvers.routing.registry import get_routing_policy, routing_policies

    G = draw(st.integers(1, 5))
    n = draw(st.integers(0, 8))
    policy = draw(st.sampled_from(routing_policies()))
    accepted = get_routing_policy(policy).options
    lengths = draw(st.lists(st.integers(0, 2000), min_size=n, max_size=n))
    H = draw(st.integers(0, 3)) if get_routing_policy(policy).horizon else 0
    loads = np.array(draw(st.lists(st.integers(0, 9000), min_size=G, max_size=G)), float)
    if H:
        loads = np.repeat(loads[:, None], H + 1, axis=1)
    free = draw(st.lists(st.integers(0, 4), min_size=G, max_size=G))
    edge = draw(st.sampled_from(["none"] * 6 + ["int64_slots", "huge_lengths", "empty"]))
    if edge == "int64_slots":
        free[0] = 2**63 - 1  # sum past int64
    elif edge == "huge_lengths" and n:
        lengths[0] = 1.7e308  # near the float maximum
    elif edge == "empty":
        lengths = []
    kw = {"prefill_lengths": lengths, "loads": loads, "free_slots": free}
    call = draw(spoil(kw, at_most=1))
    # an edge value may be refused (naming its parameter) or handled exactly, never garbled
    call.spoiled |= {"int64_slots": {"free_slots"}, "huge_lengths": {"prefill_lengths"}}.get(
        edge, set()
    )
    opts = {}
    if "r_max" in accepted and draw(st.booleans()):
        opts["r_max"] = draw(st.sampled_from([1, 2, 4]))
    if "optimistic" in accepted and draw(st.booleans()):
        opts["optimistic"] = draw(st.booleans())
    if "version" in accepted and draw(st.booleans()):
        opts["version"] = draw(st.sampled_from(get_routing_policy(policy).versions))
    if draw(st.booleans()):
        opts["rng"] = draw(st.sampled_from([0, 5]))
    if draw(st.booleans()):
        opts["n_running"] = draw(st.lists(st.integers(0, 6), min_size=G, max_size=G))
    ocall = draw(spoil(opts, at_most=1))
    call.kwargs.update(ocall.kwargs)
    call.kwargs["policy"] = policy
    call.spoiled |= ocall.spoiled
    if draw(st.integers(0, 15)) == 0:
        # (None is no spoil: it means DEFAULT_POLICY)
        call.kwargs["policy"] = draw(st.sampled_from(["lifo", "", 3, 2.5]))
        call.spoiled |= {"policy"}
    call.kwargs["_edge"] = edge
    return call


@st.composite
def simulate_calls(draw) -> Call:
    """A ``simulate`` call on a tiny trace (six to twelve requests) with a policy and some
    settings spoiled."""
    from ..sim.workloads.traces import Trace
    from ..solvers.routing.registry import routing_policies

    n = draw(st.integers(1, 12))
    arrival = np.cumsum(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))) / 100
    trace = Trace(
        arrival_s=arrival,
        prompt_len=draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n)),
        output_len=draw(st.lists(st.integers(1, 12), min_size=n, max_size=n)),
        name="fuzz",
    )
    kw = {
        "n_replicas": draw(st.integers(1, 4)),
        "max_slots": draw(st.integers(1, 4)),
        "tick": draw(st.integers(1, 3)),
        "stale": draw(st.integers(0, 2)),
        "seed": draw(st.integers(0, 3)),
        "admission": draw(st.sampled_from(["pool", "queue"])),
    }
    call = draw(spoil(kw, at_most=1))
    call.kwargs["trace"] = trace
    call.kwargs["policy"] = draw(st.sampled_from(routing_policies()))
    return call


# --- trace files as bytes -------------------------------------------------------------------
_AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
_BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
_LENGTHS_HEADER = "num_prefill_tokens,num_decode_tokens"

_BAD_FIELDS = [
    "1e30",
    str(10**30),
    "1e400",
    "-5",
    "3.5",
    "nan",
    "inf",
    "",
    "x",
    "1_0",
    "True",
    "0x10",
    "\u0663",  # an Arabic-Indic digit
]


def _field(draw, good: str, state: dict) -> str:
    if draw(st.integers(0, 9)) == 0:
        state["dirty"] = True
        return draw(st.sampled_from(_BAD_FIELDS))
    return good


def _azure_row(draw, k: int, state: dict) -> str:
    ts = f"2023-11-16 18:{15 + k // 60:02d}:{k % 60:02d}.6805900"
    if draw(st.integers(0, 15)) == 0:
        ts = draw(st.sampled_from(["yesterday", "2023-13-40 99:99:99", ""]))
        state["dirty"] = True
    p = _field(draw, str(draw(st.integers(0, 5000))), state)
    o = _field(draw, str(draw(st.integers(1, 500))), state)
    return f"{ts},{p},{o}"


def _mooncake_row(draw, k: int, state: dict) -> str:
    rec = {
        "timestamp": 100 * k,
        "input_length": draw(st.integers(0, 5000)),
        "output_length": draw(st.integers(1, 500)),
        "hash_ids": draw(st.lists(st.integers(0, 99), max_size=4)),
    }
    if draw(st.integers(0, 5)) == 0:
        state["dirty"] = True
        key = draw(st.sampled_from(sorted(rec)))
        rec[key] = draw(
            st.sampled_from([5, "12", True, None, 1e400, 10**30, -1, 2.5, [1, "a"], {"x": 1}])
        )
    if draw(st.integers(0, 20)) == 0:
        state["dirty"] = True
        del rec[draw(st.sampled_from(sorted(rec)))]
    s = json.dumps(rec)
    if draw(st.integers(0, 25)) == 0:
        state["dirty"] = True
        s = s[: len(s) // 2]  # truncated record
    return s


@dataclass
class TraceFile:
    """A drawn trace file."""

    data: bytes
    kind: str
    """``"azure"``, ``"mooncake"``, ``"burstgpt"``, ``"lengths"`` or ``"junk"``."""
    n_requests: int | None
    """Requests a loader must return when the file is clean (None: mutated, may fail)."""


@st.composite
def trace_files(draw) -> TraceFile:
    """A trace file as bytes in one of the loader's formats, mostly valid, with mutated rows,
    a BOM, CRLF line ends, non-UTF-8 bytes, NUL bytes, or gzip compression."""
    kind = draw(st.sampled_from(["azure", "mooncake", "burstgpt", "lengths", "junk"]))
    n = draw(st.integers(0, 6))
    state = {"dirty": False}
    expected = n
    if kind == "azure":
        lines = [_AZURE_HEADER] + [_azure_row(draw, k, state) for k in range(n)]
    elif kind == "mooncake":
        lines = [_mooncake_row(draw, k, state) for k in range(n)]
    elif kind == "burstgpt":
        lines = [_BURST_HEADER]
        for k in range(n):
            resp = draw(st.integers(0, 90))
            log = draw(st.sampled_from(["Conversation log", "API log", "fail"]))
            expected -= resp == 0 or log == "fail"  # BurstGPT's failed requests are skipped
            lines.append(
                f"{_field(draw, str(k * 0.5), state)},gpt,"
                f"{_field(draw, str(draw(st.integers(0, 900))), state)},"
                f"{_field(draw, str(resp), state)},0,{log}"
            )
    elif kind == "lengths":
        lines = [_LENGTHS_HEADER] + [
            f"{_field(draw, str(draw(st.integers(0, 900))), state)},"
            f"{_field(draw, str(draw(st.integers(1, 90))), state)}"
            for _ in range(n)
        ]
    else:
        return TraceFile(data=draw(st.binary(max_size=300)), kind=kind, n_requests=None)
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    text = sep.join(lines) + (sep if draw(st.booleans()) else "")
    data = text.encode("utf-8")
    mutation = draw(st.sampled_from(["none"] * 5 + ["bom", "latin1", "nul", "gzip", "cut"]))
    if mutation == "bom":
        data = b"\xef\xbb\xbf" + data
    elif mutation == "latin1" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + b"\xe9\xff" + data[i:]
    elif mutation == "nul" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + b"\x00" + data[i:]
    elif mutation == "gzip":
        data = gzip.compress(data)
        if draw(st.booleans()):
            data = data[: max(2, len(data) // 2)]  # a truncated gzip file
            state["cut_gzip"] = True
    elif mutation == "cut" and data:
        data = data[: draw(st.integers(0, len(data)))]
    clean = mutation in ("none", "bom") or (mutation == "gzip" and not state.get("cut_gzip"))
    ok = clean and not state["dirty"] and (kind != "mooncake" or n > 0)
    return TraceFile(data=data, kind=kind, n_requests=expected if ok else None)


# --- commands ----------------------------------------------------------------------------
#: Values an absurd or mistyped flag takes.
FLAG_JUNK = (
    "0",
    "-1",
    "nan",
    "inf",
    "-inf",
    "1e9",
    "10000000",
    "2147483648",
    "99999999999999999999",
    "1e308",
    ",",
    " , ,",
    "",
    "abc",
    "1.5",
    "0x10",
)


@dataclass
class CliCall:
    """One command-line invocation: the command, its argv (with ``{tmp}`` and ``{log}``
    placeholders for a scratch directory and a small valid log) and the flags spoiled."""

    command: str
    argv: list
    spoiled: set = field(default_factory=set)

    def resolve(self, tmp: str, log: str) -> list:
        return [a.replace("{tmp}", tmp).replace("{log}", log) for a in self.argv]


# command -> (fixed argv of a small valid run, {flag: [good values]})
_CLI = {
    "plan": (
        ["{log}", "--gpus", "2", "--no-progress"],
        {
            "--gpus": ["2", "4"],
            "--nodes": ["1", "2"],
            "--slots": ["4", "8"],
            "--groups": ["1"],
            "--holdout": ["0", "0.5"],
            "--max-batches": ["1", "4"],
            "--worst": ["1"],
            "--seed": ["0", "3"],
            "--format": ["sglang", "vllm", "trtllm", "eplb"],
            "--input-format": ["sglang"],
            "--placement": ["eplb", "recorded"],
            "--out": ["{tmp}/out", "{tmp}"],
        },
    ),
    "simulate": (
        ["bursty", "--requests", "10", "--no-progress", "--replicas", "2", "--policies", "jsq"],
        {
            "--replicas": ["2", "3"],
            "--max-slots": ["4", "16"],
            "--kv-capacity": ["100000"],
            "--requests": ["10", "5"],
            "--prefill-instances": ["0", "1"],
            "--load": ["0.5", "1.0"],
            "--ctx-cost": ["0", "0.0001"],
            "--seed": ["0", "1"],
            "--dispatch": ["pool", "queue"],
            "--policies": ["jsq", "jsq,br0"],
            "--json": ["{tmp}/r.json"],
        },
    ),
    "compare": (
        ["--shape", "qwen3_30b", "--gpus", "2", "--tokens-per-gpu", "8", "--methods", "uniform"],
        {
            "--gpus": ["2", "4"],
            "--tokens-per-gpu": ["8", "16"],
            "--skew": ["0", "1.2"],
            "--kappa": ["50"],
            "--replication": ["1.0", "1.5"],
            "--layers": ["1"],
            "--nodes": ["1"],
            "--seed": ["0", "2"],
            "--time-limit": ["1"],
            "--methods": ["uniform", "uniform,static"],
        },
    ),
}
#: Output paths that cannot be written: a file where a directory is wanted and the reverse.
_BAD_PATHS = {"--out": ["{tmp}/a_file", "{tmp}/a_file/sub"], "--json": ["{tmp}", "{tmp}/a_file/x"]}


@st.composite
def cli_calls(draw, command: str | None = None) -> CliCall:
    """An invocation of ``straggler-plan``, ``straggler-simulate`` or ``straggler-compare``:
    a small valid run with up to three flags set, some to :data:`FLAG_JUNK`, unwritable
    output paths, an unknown flag or a missing value. ``{tmp}/a_file`` is a file."""
    cmd = command or draw(st.sampled_from(sorted(_CLI)))
    base, flags = _CLI[cmd]
    argv = list(base)
    spoiled = set()
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=3, unique=True)):
        how = draw(st.sampled_from(["good", "good", "junk", "path"]))
        if how == "junk" and flag in _BAD_PATHS:
            how = "path"  # an output flag takes a path (junk text would be a file name)
        if how == "junk":
            value = draw(st.sampled_from(FLAG_JUNK))
            spoiled.add(flag)
        elif how == "path" and flag in _BAD_PATHS:
            value = draw(st.sampled_from(_BAD_PATHS[flag]))
            spoiled.add(flag)
        else:
            value = draw(st.sampled_from(flags[flag]))
        argv += [flag, value]
    tail = draw(st.sampled_from(["none", "none", "none", "unknown", "dangling"]))
    if tail == "unknown":
        argv.append("--no-such-flag")
        spoiled.add("--no-such-flag")
    elif tail == "dangling":
        argv.append(draw(st.sampled_from(sorted(flags))))
        spoiled.add("dangling")
    return CliCall(cmd, argv, spoiled)


# --- stateful runtime objects ------------------------------------------------------------
@st.composite
def publisher_ops(draw, shape: tuple, *, max_ops: int = 6) -> list:
    """A sequence of :class:`~straggler.runtime.TablePublisher` calls on tables of ``shape``
    ``(L, E, X)``: ``("publish", probs, rows)`` and ``("reset", log2phy, probs)``, each
    argument valid or :func:`junk` (huge finite weights, zeros, wrong shapes, NaN, -1)."""
    L, E, X = shape
    ops = []
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(["publish", "publish", "reset"]))
        weights = st.sampled_from([0.0, 1.0, 0.25, 3.0, 1e-300, 1e308, 1.7e308])
        probs = np.array(draw(st.lists(weights, min_size=L * E * X, max_size=L * E * X))).reshape(
            shape
        )
        if draw(st.integers(0, 3)) == 0:
            probs = draw(junk(like=probs))
        if op == "publish":
            rows = None
            if draw(st.booleans()):
                rows = np.array(
                    draw(st.lists(st.booleans(), min_size=L * E, max_size=L * E))
                ).reshape(L, E)
                if draw(st.integers(0, 4)) == 0:
                    rows = draw(junk(like=rows))
            ops.append(("publish", probs, rows))
        else:
            slots = np.array(
                draw(st.lists(st.integers(-1, 7), min_size=L * E * X, max_size=L * E * X))
            ).reshape(shape)
            if draw(st.integers(0, 3)) == 0:
                slots = draw(junk(like=slots))
            ops.append(("reset", slots, None if draw(st.booleans()) else probs))
    return ops


@st.composite
def worker_ops(draw, n_layers: int, n_experts: int, n_slots: int, *, max_ops: int = 6) -> list:
    """A sequence of :class:`~straggler.runtime.SolverWorker` engine-side calls:
    ``("submit", counts)`` and ``("set_placement", physical_to_logical)``, valid or spoiled
    (counts past ``2**52``, negative, fractional; maps leaving an expert without a slot,
    ids out of range, wrong shapes, junk)."""
    ops = []
    for _ in range(draw(st.integers(1, max_ops))):
        if draw(st.booleans()):
            c = np.array(
                draw(
                    st.lists(
                        st.sampled_from([0, 1, 7, 2**52, 2**52 + 1, 2**62]),
                        min_size=n_layers * n_experts,
                        max_size=n_layers * n_experts,
                    )
                )
            ).reshape(n_layers, n_experts)
            if draw(st.integers(0, 3)) == 0:
                c = draw(junk(like=c))
            ops.append(("submit", c))
        else:
            rows = [
                draw(st.lists(st.integers(-1, n_experts), min_size=n_slots, max_size=n_slots))
                for _ in range(n_layers)
            ]
            m = np.array(rows)
            if draw(st.integers(0, 3)) == 0:
                m = draw(junk(like=m))
            ops.append(("set_placement", m))
    return ops


# --- extreme finite numbers -------------------------------------------------------------------

#: Finite values at and around the library's numeric bounds: the smallest subnormal, HiGHS's
#: matrix and bound limits (1e15, 1e20), ``CostModel``'s ``2**900`` and the next float above
#: it, float64's largest.
EXTREME_FINITE = (
    0.0,
    5e-324,
    1.0,
    1e15,
    1e20,
    2.0**900,
    float(np.nextafter(2.0**900, math.inf)),
    1e300,
    float(np.finfo(np.float64).max),
)
_COUNT_EDGES = (0, 1, 2**26, 2**52 - 1, 2**52, 2**52 + 1)
_TILE_EDGES = (1, 128, 2**53, 2**53 + 1, 2**70)


@st.composite
def extreme_calls(draw) -> Call:
    """A ``solve_dispatch`` call whose cost parameters, tile and counts sit at the library's
    numeric bounds (:data:`EXTREME_FINITE`, counts around ``2**52`` per expert and ``2**53``
    per layer, tiles around ``2**53``). ``spoiled`` lists what is past a bound every method
    shares (``CostModel``'s, ``DispatchProblem``'s); a method may refuse more, naming
    ``cost`` (``milp``: HiGHS's limits) or ``counts`` (the per-token baselines)."""
    typical = dict(a=10.0, b=5.0, c=20.0, beta=0.1, b2=0.0, c2=25.0, gamma=0.1)
    kw, spoiled = {}, set()
    for name, v in typical.items():
        if draw(st.booleans()):
            v = draw(st.sampled_from(EXTREME_FINITE))
            if v > 2.0**900:
                spoiled.add(name)
        kw[name] = v
    kw["tile"] = draw(st.sampled_from(_TILE_EDGES))
    if kw["tile"] > 2**53:
        spoiled.add("tile")
    E = draw(st.integers(1, 4))
    counts = [draw(st.sampled_from(_COUNT_EDGES)) for _ in range(E)]
    if max(counts) > 2**52 or sum(counts) > 2**53:
        spoiled.add("counts")
    g = draw(st.integers(1, 3))
    method = draw(
        st.sampled_from(["tempo", "round_robin", "semi_matching", "token_lp", "milp", "static"])
    )
    return Call(kwargs=dict(cost=kw, counts=counts, n_gpus=g, method=method), spoiled=spoiled)


@st.composite
def extreme_deployment_calls(draw) -> Call:
    """A ``simulate_steps`` call on a ``DeploymentConfig`` whose numbers sit at the bounds
    (``replication``, ``kappa``, ``drift``, ``internode_us_per_token``,
    ``dispatch_period_s`` from :data:`EXTREME_FINITE`; resident KV tokens around ``2**53``;
    running requests far below and far above what one step may sample). ``kwargs``:
    ``config`` (the config's keyword arguments), ``kv`` and ``requests`` (one value for
    every rank and step); ``spoiled``: what is past a bound."""
    G = draw(st.sampled_from([1, 2, 4]))
    cfg = dict(preset="dsv3", n_gpus=G, layers=1, seed=0)
    cfg["n_nodes"] = draw(st.sampled_from([1, 2])) if G > 1 else 1
    # each parameter's accepted range (DeploymentConfig's checks)
    ok = {
        "replication": lambda v: 1 <= v <= G,
        "kappa": lambda v: v > 0,
        "drift": lambda v: v <= 10,
        "internode_us_per_token": lambda v: v <= 2.0**900,
        "dispatch_period_s": lambda v: True,
    }
    spoiled = set()
    for name, fits in ok.items():
        if draw(st.booleans()):
            cfg[name] = draw(st.sampled_from(EXTREME_FINITE))
            if not fits(cfg[name]):
                spoiled.add(name)
    kv = draw(st.sampled_from([0, 1000, 2**53, 2.0**53 + 2, 1e300]))
    if kv > 2**53:
        spoiled.add("kv")
    req = draw(st.sampled_from([0, 8, 2**16, 2**40]))
    if G * req * 8 > 2**26:  # the preset's top_k: 8
        spoiled.add("requests")
    return Call(kwargs=dict(config=cfg, kv=kv, requests=req), spoiled=spoiled)


# --- the library's own files: what a writer is given -----------------------------------------

#: Texts a text format stores ambiguously or not at all: empty, numbers in every spelling
#: Python's parsers accept (underscores, padding, other scripts' digits, NaN, infinity),
#: the words of booleans and None, CSV's delimiter and quote, line breaks of every kind
#: ``str.splitlines`` knows, a comment mark, a ``key: value`` separator, a lone surrogate
#: (UTF-8 cannot encode it).
TRICKY_TEXT = (
    "",
    "1",
    "-0",
    "1_0",
    " 1",
    "\u0661",
    "1e3",
    "nan",
    "-inf",
    "True",
    "False",
    "None",
    "a,b",
    'q"x',
    "x\ny",
    "x\ry",
    "x\x1cy",
    "x\u2028y",
    " a",
    "a ",
    "#",
    "k: v",
    "\ud800",
    "\u00e9",
)


def _texts(max_size: int = 6):
    return st.one_of(st.sampled_from(TRICKY_TEXT), st.text(max_size=max_size))


@st.composite
def sweep_tables(draw) -> tuple[list, list]:
    """``(rows, settings)`` for ``SweepTable``: up to three rows over up to four columns
    (names from :data:`TRICKY_TEXT` and any text, now and then an int), settings in every
    row, results in some; values Python and numpy scalars of every kind (NaN, infinities,
    ``-0.0``, ints beyond int64, float32), tricky text, None, and now and then a list or a
    tuple, which CSV cannot hold."""
    names = draw(
        st.lists(
            st.one_of(_texts(4), st.integers(0, 2)), min_size=1, max_size=4, unique_by=repr
        ).filter(lambda ns: len({str(n) for n in ns}) == len(ns))
    )
    strs = [n for n in names if isinstance(n, str)]
    settings = strs[: draw(st.integers(0, len(strs)))]
    values = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        _texts(),
        st.builds(np.float64, st.floats()),
        st.builds(np.float32, st.floats(width=32)),
        st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
        st.builds(np.bool_, st.booleans()),
        st.lists(st.integers(0, 3), max_size=2),
        st.tuples(st.integers(0, 3)),
    )
    rows = []
    for _ in range(draw(st.integers(0, 3))):
        keys = settings + [n for n in names if n not in settings and draw(st.booleans())]
        rows.append({k: draw(values) for k in keys})
    return rows, settings


@st.composite
def calibration_logs(draw) -> dict:
    """Keyword arguments of ``write_calibration_log``: ``G``, ``N``, ``t`` (and perhaps
    ``T``) of one length, up to three samples, each value now and then negative, zero,
    subnormal, huge, infinite or NaN; ``meta`` None or a dict whose keys and values are
    tricky text (:data:`TRICKY_TEXT`), numbers, None, or now and then a non-string key."""
    n = draw(st.integers(0, 3))
    edge = st.sampled_from([0.0, -0.0, 5e-324, 1.0, 2.0**53 + 2, 1e308, -1.0, math.inf, math.nan])
    num = st.one_of(edge, st.floats(0, 1e6), st.integers(0, 2**60))
    cols = {k: draw(st.lists(num, min_size=n, max_size=n)) for k in ("G", "N", "t")}
    if draw(st.booleans()):
        cols["T"] = draw(st.lists(num, min_size=n, max_size=n))
    if draw(st.booleans()):
        key = st.one_of(_texts(), st.integers(0, 2))
        val = st.one_of(_texts(), st.integers(), st.floats(), st.none())
        cols["meta"] = draw(st.dictionaries(key, val, max_size=3))
    return cols


_JSON_JUNK = (
    (1, 2),
    {1: "x"},
    {"a": {2: 3}},
    {"a", "b"},
    math.nan,
    math.inf,
    object,
    b"x",
)


@st.composite
def calibration_results(draw) -> dict:
    """Keyword arguments of ``CalibrationResult``: a consistent fit (2 or 3 pieces, with or
    without tiles; parameters, intervals, bootstrap replicates, pieces of the samples), then
    up to two fields replaced by what its JSON would not give back as given (``iterations``
    2.5 or True, a float ``piece``, a ``bootstrap_params`` of the wrong width, an int
    parameter name, a tuple, a set, NaN or an int key in ``meta``, no ``CostModel``)."""
    from ..formulations import CostModel

    pieces = draw(st.sampled_from([2, 3]))
    tiles = draw(st.booleans())
    names = ["a", "b"] + (["b2"] if tiles else []) + ["c", "beta"]
    names += ["c2", "gamma"] if pieces == 3 else []
    vals = {n: draw(st.floats(0, 100)) for n in names}
    cost = CostModel(**vals, **({"tile": 128} if tiles else {}))
    n, k = draw(st.integers(0, 4)), draw(st.integers(0, 3))
    boot = np.array(
        draw(st.lists(st.floats(0, 100), min_size=k * len(names), max_size=k * len(names)))
    )
    kw = dict(
        cost=cost,
        params=dict(vals),
        intervals={
            m: (math.nan, math.nan) if draw(st.booleans()) else (v, v) for m, v in vals.items()
        },
        level=draw(st.sampled_from([0.95, 0.5])),
        rel_rms=draw(st.floats(0, 1)),
        max_rel_error=draw(st.floats(0, 1)),
        n_star=cost.n_star,
        piece=np.array(
            draw(st.lists(st.integers(0, pieces - 1), min_size=n, max_size=n)), dtype=np.int64
        ),
        bootstrap_params=boot.reshape(k, len(names)),
        iterations=draw(st.integers(1, 50)),
        converged=draw(st.booleans()),
        pieces=pieces,
        tile=128,
        meta=draw(
            st.dictionaries(
                _texts(), st.one_of(_texts(), st.integers(), st.floats(0, 1)), max_size=2
            )
        ),
    )
    spoilers = {
        "iterations": st.sampled_from([2.5, True, "3"]),
        "piece": st.just(np.array([0.5, 1.0])),
        "bootstrap_params": st.just(np.zeros((2, len(names) + 1))),
        "params": st.just({1: 1.0, **vals}),
        "meta": st.builds(lambda j: {"x": j}, st.sampled_from(_JSON_JUNK)),
        "cost": st.sampled_from([None, vals]),
        "level": st.sampled_from(["x", None]),
    }
    for name in draw(st.lists(st.sampled_from(sorted(spoilers)), max_size=2, unique=True)):
        kw[name] = draw(spoilers[name])
    return kw
