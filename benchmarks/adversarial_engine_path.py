"""A rerunnable adversarial pass over the engine path: malformed files for the readers,
inexact values for the writers, absurd flags and unwritable outputs for the three commands,
bad calls to the publisher and the worker, damaged sweep journals.

Each case states what the contract requires: ``error`` (an ``InvalidInputError``, or for a
command exit 2 with one ``error:`` line and nothing written) or ``value`` (a returned
answer that a check accepts). Outcomes:

* ``ok``: as required;
* ``silent``: a value where an error was required, or a value the check rejects (a silent
  wrong answer);
* ``raw``: an exception other than ``InvalidInputError`` (``BackendUnavailableError`` only
  where the case says a backend is missing);
* ``traceback``: a command printed a traceback or exited with another status;
* ``refused``: a valid call was refused;
* ``hang``: no answer within ``TIMEOUT`` seconds (a FIFO opened for reading, a loop);
* ``noisy``: a command exited 2 but printed more than its one ``error:`` line;
* ``misnamed``: the error does not name the parameter the caller passed (cases whose
  check is the parameter's name).

A case whose ``want`` is ``either`` accepts an ``InvalidInputError`` or a value its check
accepts; ``cmd`` cases run a command as a subprocess (``exit2``: in this process). Every
case runs under a ``TIMEOUT`` alarm; cases registered through ``isolated`` run in a forked
child with a ``CHILD_MEMORY`` address-space limit, killed at the timeout.

The cases are not the unit tests' cases. Writes
``straggler-results/adversarial_engine_path.json`` and prints the counts per area.

    python benchmarks/adversarial_engine_path.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.formulations import CostModel, InvalidInputError
from straggler.formulations.validation import MAX_EXACT_INT
from straggler.runtime import (
    SolverWorker,
    TablePublisher,
    dispatch_and_count,
    normalize_table,
    read_engine_log,
    uniform_table,
    window_delta,
)
from straggler.runtime.engines import (
    detect_format,
    fold_physical_counts,
    read_eplb_maps,
    read_moe_load_balancer,
    read_sglang_init_location,
    read_sglang_recorder,
    read_trtllm_statistics,
    read_vllm_state,
    sglang_per_token_record,
    vllm_maps,
    write_eplb_maps,
    write_moe_load_balancer,
    write_sglang_detail_dump,
    write_sglang_init_location,
    write_sglang_stat_dump,
    write_trtllm_statistics,
    write_vllm_state,
)
from straggler.runtime.engines._common import save_json
from straggler.sim.experiments.sweep import SweepTable, grid_cells, sweep

try:
    import torch  # noqa: F401

    HAS_TORCH = True
except ImportError:
    HAS_TORCH = False
OUT = results_dir() / "adversarial_engine_path.json"
TMP = Path(tempfile.mkdtemp(prefix="adv-"))
CASES: list[tuple[str, str, str, object, object]] = []  # (area, name, want, fn, check)
ISOLATED: set[int] = set()  # ids of the fns run in a forked child (FIFOs, huge sizes)
TIMEOUT = float(os.environ.get("ADVERSARIAL_TIMEOUT", "60"))  # seconds per case: else ``hang``
CHILD_MEMORY = 6 << 30  # address-space limit of a forked case (bytes)


def case(area, name, want="error", check=None):
    def deco(fn):
        CASES.append((area, name, want, fn, check))
        return fn

    return deco


def fresh(name: str) -> Path:
    d = TMP / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def jfile(name: str, obj) -> str:
    p = fresh("files") / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


def log_ok(log) -> bool:
    E = log.n_experts
    ok = isinstance(E, int) and E >= 1
    if log.counts is not None:
        c = log.counts
        ok &= bool((c >= 0).all()) and float(c.astype(float).sum()) <= MAX_EXACT_INT
        ok &= c.shape[1:] == (log.n_layers, E)
    if log.physical_to_logical is not None:
        m = log.physical_to_logical
        ok &= bool((m >= -1).all() and (m < E).all())
    return ok


# --- readers ------------------------------------------------------------------------------
P2L = [[0, 1, 2, 0]]
R = "readers"
case(R, "sglang init: id = slots")(
    lambda: read_engine_log(jfile("a.json", {"physical_to_logical_map": [[0, 4, 1, 2]]}))
)
case(R, "sglang init: negative id")(
    lambda: read_engine_log(jfile("b.json", {"physical_to_logical_map": [[0, -1, 1, 2]]}))
)
case(R, "sglang init: float ids 0.5")(
    lambda: read_engine_log(jfile("c.json", {"physical_to_logical_map": [[0, 0.5]]}))
)
case(R, "sglang init: 3-D map")(
    lambda: read_engine_log(jfile("d.json", {"physical_to_logical_map": [[[0, 1]]]}))
)
case(R, "sglang init: empty map")(
    lambda: read_engine_log(jfile("e.json", {"physical_to_logical_map": [[]]}))
)
case(R, "sglang count: 4-D")(lambda: read_engine_log(jfile("f.json", {"logical_count": [[[[1]]]]})))
case(R, "sglang count: uint64 max as text")(
    lambda: read_engine_log(jfile("g.json", {"logical_count": [[18446744073709551615]]}))
)
case(R, "sglang count: totals past 2**53 over steps")(
    lambda: read_engine_log(jfile("h.json", {"logical_count": [[[2**52, 2**52], [2**52, 1]]]}))
)
case(R, "sglang count: bool values")(
    lambda: read_engine_log(jfile("i.json", {"logical_count": [[True, False]]}))
)
case(R, "sglang count: rate is a list")(
    lambda: read_engine_log(
        jfile(
            "j.json",
            {"logical_count": [[1, 2]], "rank": 0, "average_utilization_rate_over_window": [1]},
        )
    )
)
case(R, "sglang count: all-zero steps only", "value", log_ok)(
    lambda: read_engine_log(jfile("k.json", {"logical_count": [[[0, 0]], [[0, 0]]], "rank": 0}))
)
case(R, "inline JSON: not an object")(lambda: read_engine_log("{[1, 2]"))
case(R, "inline JSON: deep nesting")(
    lambda: read_engine_log('{"logical_count": ' + "[" * 5000 + "]" * 5000 + "}")
)
case(R, "init location: 'trivial'")(lambda: read_sglang_init_location("trivial"))
case(R, "init location: an int")(lambda: read_sglang_init_location(7))
case(R, "vllm: replica count disagrees")(
    lambda: read_vllm_state(
        jfile(
            "s_rank0.json",
            {"physical_to_logical_map": P2L, "logical_replica_count": [[1, 1, 1]], "rank": 0},
        )
    )
)
case(R, "vllm: window step past the window")(
    lambda: read_vllm_state(
        jfile(
            "t_rank0.json",
            {
                "physical_to_logical_map": P2L,
                "expert_load_window": [[[1, 1, 1, 1]]],
                "expert_load_window_step": 5,
            },
        )
    )
)
case(R, "vllm: window of int64 max")(
    lambda: read_vllm_state(
        jfile(
            "u_rank0.json",
            {"physical_to_logical_map": P2L, "expert_load_window": [[[2**63 - 1, 0, 0, 0]]]},
        )
    )
)
case(R, "vllm: rank is a string")(
    lambda: read_vllm_state(
        jfile(
            "v_rank0.json",
            {"physical_to_logical_map": P2L, "expert_load_pass": [[1, 1, 1, 1]], "rank": "0"},
        )
    )
)
case(R, "vllm: empty file list")(lambda: read_vllm_state([]))
case(R, "vllm: map override with wrong shape")(
    lambda: read_vllm_state(
        jfile("w_rank0.json", {"physical_to_logical_map": P2L, "expert_load_pass": [[1, 1, 1, 1]]}),
        physical_to_logical=[[0, 1]],
    )
)
case(R, "vllm: map-only file", "value", log_ok)(
    lambda: read_vllm_state(
        jfile("x_rank0.json", {k: v.tolist() for k, v in vllm_maps(P2L, 3).items()})
    )
)
case(R, "eplb: logcnt negative")(
    lambda: read_eplb_maps(
        jfile("m1.json", {"phy2log": [[0, 1]], "log2phy": [[[0], [1]]], "logcnt": [[-1, 1]]})
    )
)
case(R, "eplb: log2phy slot out of range")(
    lambda: read_eplb_maps(
        jfile("m2.json", {"phy2log": [[0, 1]], "log2phy": [[[0], [9]]], "logcnt": [[1, 1]]})
    )
)
case(R, "eplb: weight NaN")(
    lambda: read_eplb_maps(
        jfile(
            "m3.json",
            '{"phy2log": [[0, 1]], "log2phy": [[[0], [1]]], "logcnt": [[1, 1]], '
            '"weight": [[NaN, 1]]}',
        )
    )
)
case(R, "eplb: fractional weight kept", "value", log_ok)(
    lambda: read_eplb_maps(
        jfile(
            "m4.json",
            {
                "phy2log": [[0, 1]],
                "log2phy": [[[0], [1]]],
                "logcnt": [[1, 1]],
                "weight": [[0.5, 1]],
            },
        )
    )
)
case(R, "eplb: a .txt path")(lambda: read_eplb_maps(jfile("m5.txt", "{}")))
YAML_OK = "initial_global_assignments:\n  3: [0, 1]\nnum_slots: 2\n"
case(R, "yaml: anchors")(lambda: read_moe_load_balancer(jfile("y1.yaml", "a: &x 1\nb: *x\n")))
case(R, "yaml: tabs")(lambda: read_moe_load_balancer(jfile("y2.yaml", "a:\n\t- 1\n")))
case(R, "yaml: row too short for num_slots")(
    lambda: read_moe_load_balancer(
        jfile("y3.yaml", "initial_global_assignments:\n  3: [0]\nnum_slots: 2\n")
    )
)
case(R, "yaml: layer key negative")(
    lambda: read_moe_load_balancer(
        jfile("y4.yaml", "initial_global_assignments:\n  -3: [0, 1]\nnum_slots: 2\n")
    )
)
case(R, "yaml: layer key a float")(
    lambda: read_moe_load_balancer(
        jfile("y5.yaml", "initial_global_assignments:\n  3.5: [0, 1]\nnum_slots: 2\n")
    )
)
case(R, "yaml: two keys for one layer ('3' and 3)")(
    lambda: read_moe_load_balancer(
        jfile("y6.yaml", "initial_global_assignments:\n  3: [0, 1]\n  '3': [1, 0]\nnum_slots: 2\n")
    )
)
case(R, "yaml: ep_size not dividing")(
    lambda: read_moe_load_balancer(jfile("y7.yaml", YAML_OK + "ep_size: 3\n"))
)
case(R, "yaml: unknown field")(
    lambda: read_moe_load_balancer(jfile("y8.yaml", YAML_OK + "foo: 1\n"))
)
case(R, "yaml: non-UTF-8 bytes")(
    lambda: read_moe_load_balancer(
        (lambda p: (Path(p).write_bytes(b"\xff\xfe\x00a: 1"), p)[1])(jfile("y9.yaml", ""))
    )
)
case(R, "yaml: n_experts=True")(
    lambda: read_moe_load_balancer(jfile("y10.yaml", YAML_OK), n_experts=True)
)
case(R, "yaml: flow mapping over lines unterminated")(
    lambda: read_moe_load_balancer(jfile("y11.yaml", "a: {x: 1,\n"))
)
case(R, "trtllm: meta num_experts 0")(
    lambda: read_trtllm_statistics(
        (
            lambda d: (
                save_json({"num_experts": 0, "num_experts_per_token": 1}, d / "meta_info.json"),
                d,
            )[1]
        )(fresh("tr1"))
    )
)
case(R, "trtllm: meta null")(
    lambda: read_trtllm_statistics(
        (lambda d: ((d / "meta_info.json").write_text("null"), d)[1])(fresh("tr2"))
    )
)
case(R, "trtllm: iter_stop a float")(lambda: read_trtllm_statistics(fresh("tr3"), iter_stop=2.5))
case(R, "recorder: empty directory")(lambda: read_sglang_recorder(fresh("rec0")))
case(R, "recorder: n_experts beyond the slots")(
    lambda: read_sglang_recorder(fresh("rec1"), n_experts=10**12)
)
case(R, "detect: an empty directory")(lambda: detect_format(fresh("empty")))
case(R, "detect: a FIFO")(
    lambda: read_engine_log((lambda p: (os.mkfifo(p), p)[1])(str(fresh("fifo") / "x.yaml")))
)
case(R, "detect: unreadable directory name type")(lambda: detect_format(Path("/nonexistent/x")))
case(R, "read_engine_log: format 'SGLANG'")(
    lambda: read_engine_log(jfile("z.json", "{}"), format="SGLANG")
)
case(R, "read_engine_log: n_experts -1")(
    lambda: read_engine_log(jfile("z2.json", {"logical_count": [[1]]}), n_experts=-1)
)
case(R, "fold: counts negative")(lambda: fold_physical_counts([[-1, 2]], [[0, 1]], 2))
case(R, "fold: map 1-D")(lambda: fold_physical_counts([[1, 2]], [0, 1], 2))
case(R, "fold: n_experts numpy int", "value", lambda v: v.tolist() == [[3]])(
    lambda: fold_physical_counts([[1, 2]], [[0, 0]], np.int64(1))
)


def pt_case(name, value, want="error", check=None):
    def fn():
        import torch

        p = fresh("pt") / f"{name}.pt"
        torch.save({"logical_count": value() if callable(value) else value, "rank": 0}, p)
        return read_engine_log(p)

    case(R, f".pt stat dump: {name}", want, check)(fn)


try:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt_case("complex", torch.tensor([[[1 + 1j, 2]]]))
        pt_case("bool", torch.tensor([[[True, False]]]))
        pt_case("int8 negative", torch.tensor([[[-3, 1]]], dtype=torch.int8))
        pt_case("uint8", torch.tensor([[[255, 1]]], dtype=torch.uint8), "value", log_ok)
        pt_case(
            "list of tensors", [torch.tensor([[1, 2]]), torch.tensor([[3, 4]])], "value", log_ok
        )
        pt_case("a string", "abc")
        pt_case("nested tensor", lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]))
        pt_case("meta tensor", torch.empty((1, 1, 2), device="meta"))
        pt_case(
            "quantized tensor",
            lambda: torch.quantize_per_tensor(torch.ones(1, 1, 2), 0.1, 0, torch.quint8),
        )
        pt_case("NaN", torch.tensor([[[float("nan"), 1.0]]]))
        pt_case("1e38 floats", torch.tensor([[[1e38, 1e38]]]))
        pt_case("zero steps", torch.zeros((0, 1, 2)), "value", log_ok)
        pt_case("bfloat16 fraction", torch.tensor([[[1.5, 1.0]]], dtype=torch.bfloat16))
except ImportError:
    pass


# third round: SGLang per-pass / per-token recorder dumps (.pt, one file per rank)
def rec_dir(name, dumps, **kw):
    import torch

    d = fresh(name)
    for i, obj in enumerate(dumps):
        torch.save(obj, d / f"expert_distribution_recorder_1.0_{i}.pt")
    return read_sglang_recorder(d, **kw)


def rec(pid=0, rank=0, gpc=((1, 0, 2, 1),), **extra):
    import torch

    return {
        "forward_pass_id": pid,
        "rank": rank,
        "global_physical_count": torch.tensor(gpc),
    } | extra


def dump(records, m=((0, 1, 0, 2),)):
    import torch

    return {"records": records, "last_physical_to_logical_map": torch.tensor(m)}


if HAS_TORCH:
    case(R, "recorder: records a dict")(lambda: rec_dir("r1", [dump({"a": 1})]))
    case(R, "recorder: forward pass id 1.5")(lambda: rec_dir("r2", [dump([rec(pid=1.5)])]))
    case(R, "recorder: forward pass id 2**70")(lambda: rec_dir("r3", [dump([rec(pid=2**70)])]))
    case(R, "recorder: negative count")(lambda: rec_dir("r4", [dump([rec(gpc=((1, -1, 0, 0),))])]))
    case(R, "recorder: counts of 3 slots for a 4-slot map")(
        lambda: rec_dir("r5", [dump([rec(gpc=((1, 1, 1),))])])
    )
    case(R, "recorder: tokens on an empty slot")(
        lambda: rec_dir("r6", [dump([rec(gpc=((1, 1, 1, 1),))], m=((0, 1, 0, -1),))])
    )
    case(R, "recorder: ranks disagree on the map")(
        lambda: rec_dir("r7", [dump([rec()]), dump([rec(rank=1)], m=((2, 1, 0, 0),))])
    )
    case(R, "recorder: a rank misses a pass")(
        lambda: rec_dir("r8", [dump([rec(), rec(pid=1)]), dump([rec(rank=1)])])
    )
    case(R, "recorder: the same pass twice for one rank")(
        lambda: rec_dir("r9", [dump([rec(), rec()])])
    )
    case(R, "recorder: no records")(lambda: rec_dir("r10", [dump([])]))
    case(R, "recorder: override history key 'a'")(
        lambda: rec_dir("r11", [dump([rec()])], physical_to_logical={"a": [[0, 1, 0, 2]]})
    )
    case(R, "recorder: override id past n_experts")(
        lambda: rec_dir("r12", [dump([rec()])], physical_to_logical=[[0, 1, 0, 9]])
    )
    case(R, "recorder: n_experts below the largest id")(
        lambda: rec_dir("r13", [dump([rec()])], n_experts=2)
    )
    case(R, "recorder: stat and per-pass files mixed")(
        lambda: rec_dir("r14", [dump([rec()]), {"logical_count": [[[1, 2, 3]]], "rank": 0}])
    )
    case(R, "recorder: per-token ids disagree with the counts")(
        lambda: rec_dir(
            "r15",
            [dump([rec(topk_ids_of_layer=__import__("torch").tensor([[[0, 1]]]))])],
        )
    )
    case(R, "recorder: per-pass totals past 2**53 over ranks")(
        lambda: rec_dir(
            "r16",
            [
                dump([rec(gpc=((2**52, 0, 2**52, 0),))]),
                dump([rec(rank=1, gpc=((2**52, 0, 0, 0),))]),
            ],
        )
    )
    case(
        R,
        "recorder: a valid two-rank recording",
        "value",
        lambda log: log.counts.tolist() == [[[6, 2, 4]]],
    )(lambda: rec_dir("r17", [dump([rec()]), dump([rec(rank=1, gpc=((2, 2, 1, 3),))])]))

# --- writers ------------------------------------------------------------------------------
W = "writers"
case(W, "stat dump: float 1e10 fits int64 but not int32")(
    lambda: write_sglang_stat_dump(fresh("w1"), [[[1e10, 1]]])
)
case(W, "stat dump: rank -1")(lambda: write_sglang_stat_dump(fresh("w2"), [[[1, 1]]], rank=-1))
case(W, "stat dump: rate 'high'")(
    lambda: write_sglang_stat_dump(fresh("w3"), [[[1, 1]]], average_utilization_rate="high")
)
case(W, "detail dump: record without counts")(
    lambda: write_sglang_detail_dump(fresh("w4"), [{"forward_pass_id": 0}], [[0, 1]], rank=0)
)
case(W, "detail dump: counts shape != map")(
    lambda: write_sglang_detail_dump(
        fresh("w5"),
        [{"forward_pass_id": 0, "global_physical_count": [[1, 2, 3]]}],
        [[0, 1]],
        rank=0,
    )
)
case(W, "per-token record: id >= n_physical")(
    lambda: sglang_per_token_record(0, [[[0, 5]]], n_physical=4)
)
case(W, "per-token record: 9 columns")(
    lambda: sglang_per_token_record(0, [[[0] * 9]], n_physical=4)
)
case(W, "init location: map with -1")(
    lambda: write_sglang_init_location(fresh("w6") / "x.json", physical_to_logical=[[0, -1]])
)
case(W, "init location: .yaml path")(
    lambda: write_sglang_init_location(fresh("w7") / "x.yaml", physical_to_logical=[[0, 1]])
)
case(W, "init location: both arguments")(
    lambda: write_sglang_init_location(
        fresh("w8") / "x.json", physical_to_logical=[[0]], logical_count=[[1]]
    )
)
case(W, "vllm: unknown field")(
    lambda: write_vllm_state(fresh("w9") / "s_rank0.json", {"expert_load": [1]})
)
case(W, "vllm: state not a dict")(lambda: write_vllm_state(fresh("w10") / "s_rank0.json", [1]))
case(W, "vllm: map id 2.5")(
    lambda: write_vllm_state(fresh("w11") / "s_rank0.json", {"physical_to_logical_map": [[2.5]]})
)
case(W, "vllm: window step -1")(
    lambda: write_vllm_state(fresh("w12") / "s_rank0.json", {"expert_load_window_step": -1})
)
case(W, "vllm: .npz path")(lambda: write_vllm_state(fresh("w13") / "s.npz", {"rank": 0}))
case(W, "trtllm stats: iter ids negative")(
    lambda: write_trtllm_statistics(
        fresh("w14"), np.ones((1, 1, 1, 2)), layer_ids=[3], iter_ids=[-1], top_k=1
    )
)
case(W, "trtllm stats: 3-D counts")(
    lambda: write_trtllm_statistics(fresh("w15"), np.ones((1, 1, 2)), layer_ids=[3], top_k=1)
)
case(W, "trtllm stats: top_k > experts")(
    lambda: write_trtllm_statistics(fresh("w16"), np.ones((1, 1, 1, 2)), layer_ids=[3], top_k=3)
)
case(W, "trtllm yaml: layer ids as a string")(
    lambda: write_moe_load_balancer(fresh("w17") / "m.yaml", [[0, 1]], layer_ids="3")
)
case(W, "trtllm yaml: updates per iter 1.5")(
    lambda: write_moe_load_balancer(fresh("w18") / "m.yaml", [[0, 1]], layer_updates_per_iter=1.5)
)
case(W, "trtllm yaml: path is a directory")(lambda: write_moe_load_balancer(fresh("w19"), [[0, 1]]))
case(W, "eplb: maps disagree")(
    lambda: write_eplb_maps(fresh("w20") / "e.json", [[0, 1]], [[[1], [0]]], [[1, 1]])
)
case(W, "eplb: weight negative")(
    lambda: write_eplb_maps(
        fresh("w21") / "e.json", [[0, 1]], [[[0], [1]]], [[1, 1]], weight=[[-1, 1]]
    )
)
# sixth round: builders and names
case(W, "vllm_maps: n_experts 10**12")(lambda: vllm_maps([[0, 1]], 10**12))
case(W, "vllm_maps: n_experts 2.5")(lambda: vllm_maps([[0, 1]], 2.5))
case(W, "per-token record: 3 input ids for 1 token")(
    lambda: sglang_per_token_record(0, [[[0]]], 2, input_ids=[1, 2, 3])
)
case(W, "per-token record: pass id 'a'")(lambda: sglang_per_token_record("a", [[[0]]], 2))
case(W, "stat dump: timestamp 'x/../y' (a path in the name)")(
    lambda: write_sglang_stat_dump(fresh("w23"), [[[1]]], timestamp="x/../y")
)
case(W, "eplb maps: a bytes path")(
    lambda: write_eplb_maps(b"/tmp/e.json", [[0, 1]], [[[0], [1]]], [[1, 1]])
)
case(
    W,
    "round trip: yaml with layer ids 3, 4",
    "value",
    lambda v: read_moe_load_balancer(v).physical_to_logical.tolist() == [[0, 1], [1, 0]],
)(lambda: write_moe_load_balancer(fresh("w22") / "m.yaml", [[0, 1], [1, 0]], layer_ids=[3, 4]))


# --- commands ------------------------------------------------------------------------------
def run_cli(command, argv):
    from straggler.runtime.commands.compare import main as compare_main
    from straggler.runtime.commands.plan import main as plan_main
    from straggler.runtime.commands.simulate import main as simulate_main

    main = {"plan": plan_main, "simulate": simulate_main, "compare": compare_main}[command]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, err.getvalue()


LOG = jfile("stat.json", {"logical_count": [[[5, 1, 0, 2]], [[3, 3, 1, 0]]], "rank": 0})
A_FILE = jfile("a_file", "x")
CLI = [
    ("plan", [LOG, "--gpus", "2", "--slots", "3"]),  # slots not a multiple of GPUs
    ("plan", [LOG, "--gpus", "2", "--out", A_FILE + "/deeper/out"]),
    ("plan", [LOG, "--gpus", "2", "--plot", A_FILE + "/p.png"]),
    ("plan", [LOG, "--gpus", "2", "--calibration", A_FILE]),
    ("plan", [LOG, "--gpus", "2", "--calibration", "/nonexistent.json"]),
    ("plan", [LOG, "--gpus", "2", "--input-format", "trtllm"]),
    ("plan", [LOG, "--gpus", "2", "--input-format", "eplb"]),
    ("plan", [LOG, "--gpus", "2", "--max-batches", "-4"]),
    ("plan", [LOG, "--gpus", "2", "--holdout", "nan"]),
    ("plan", [LOG, "--gpus", "99999999999999999999"]),
    ("plan", ["", "--gpus", "2"]),
    ("plan", ["{not json", "--gpus", "2"]),
    ("plan", [str(TMP), "--gpus", "2"]),
    ("plan", [LOG, "--gpus", "2", "--nodes", "0"]),
    ("plan", [LOG, "--gpus", "2", "--placement", "recorded"]),  # no recorded placement
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq:nope"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--load", "inf"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--kv-capacity", "0"]),
    ("simulate", ["bursty", "--requests", "5", "--prefix-cache"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--json", A_FILE + "/x"]),
    ("simulate", [A_FILE, "--requests", "5", "--policies", "jsq"]),  # a file that is no trace
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--rate", "-2"]),
    ("simulate", ["bursty", "--replicas", "65536", "--max-slots", "1"]),
    ("compare", ["--replication", "0.5", "--methods", "uniform"]),
    ("compare", ["--methods", "uniform,,nope"]),
    ("compare", ["--tokens-per-gpu", "0", "--methods", "uniform"]),
    ("compare", ["--skew", "nan", "--methods", "uniform"]),
    ("compare", ["--kappa", "-inf", "--methods", "uniform"]),
    ("compare", ["--layers", "0", "--methods", "uniform"]),
    ("compare", ["--time-limit", "-1", "--methods", "uniform"]),
]
for cmd, argv in CLI:
    CASES.append(
        (
            "commands",
            f"{cmd} {' '.join(a.replace(str(TMP), '$TMP') for a in argv)}",
            "exit2",
            (cmd, argv),
            None,
        )
    )

# --- publisher, worker, dispatch ------------------------------------------------------------
S = "runtime"
L2P = np.array([[[0, 2], [1, -1]]])


def pub():
    return TablePublisher(L2P, device="cpu")


if HAS_TORCH:
    case(S, "publish: rows as floats 0.5")(
        lambda: pub().publish(np.ones((1, 2, 2)), rows=[[0.5, 1.0]])
    )
    case(S, "publish: probs a torch int tensor", "value", lambda v: v == 1)(
        lambda: pub().publish(torch.ones((1, 2, 2), dtype=torch.int64))
    )
    case(S, "publish: probs inf")(lambda: pub().publish(np.full((1, 2, 2), np.inf)))
    case(S, "publish: tiny weights", "value", lambda v: v == 1)(
        lambda: pub().publish(np.full((1, 2, 2), 5e-324))
    )
    case(S, "reset: log2phy below -1")(lambda: pub().reset(np.full((1, 2, 2), -2)))
    case(S, "reset: shape change")(lambda: pub().reset(np.zeros((2, 2, 2), np.int64)))
    case(S, "constructor: X = 0")(
        lambda: TablePublisher(np.zeros((1, 2, 0), np.int64), device="cpu")
    )
    case(S, "constructor: device 'cuda:-1'")(lambda: TablePublisher(L2P, device="cuda:-1"))
    case(S, "constructor: probs string")(lambda: TablePublisher(L2P, probs="1", device="cpu"))
case(S, "uniform_table: bools")(lambda: uniform_table([[True, False]]))
case(S, "normalize_table: NaN")(lambda: normalize_table([[np.nan, 1]], [[0, 1]]))
case(S, "window_delta: float arrays")(lambda: window_delta([1.0], [0.0]))
case(S, "window_delta: shapes differ")(lambda: window_delta(np.array([1, 2]), np.array([1])))
COST = CostModel(a=0, b=15, c=0, beta=0.1)
W2 = SolverWorker([[0, 1, 0, 2]], 2, COST)
case(S, "worker: submit counts 1-D")(lambda: W2.submit([1, 2, 3]))
case(S, "worker: submit NaN")(lambda: W2.submit([[np.nan, 1, 1]]))
case(S, "worker: submit 2**52 + 1")(lambda: W2.submit([[2**52 + 1, 1, 1]]))
case(S, "worker: set_placement drops expert 2")(lambda: W2.set_placement([[0, 1, 0, 1]]))
case(S, "worker: set_placement id 3")(lambda: W2.set_placement([[0, 1, 3, 2]]))
case(S, "worker: n_experts past the slots")(lambda: SolverWorker([[0, 1]], 1, COST, n_experts=9))
case(S, "worker: gpu_node of wrong length")(lambda: SolverWorker([[0, 1]], 2, COST, gpu_node=[0]))
case(S, "worker: status before start")(lambda: W2.status())
# seventh round: the worker's constructor and dispatch's scalars
case(S, "worker: period inf")(lambda: SolverWorker([[0, 1]], 1, COST, period=float("inf")))
case(S, "worker: stale_after NaN")(
    lambda: SolverWorker([[0, 1]], 1, COST, stale_after=float("nan"))
)
case(S, "worker: n_threads 0")(lambda: SolverWorker([[0, 1]], 1, COST, n_threads=0))
case(S, "worker: options a list")(lambda: SolverWorker([[0, 1]], 1, COST, options=[1]))
case(S, "worker: method None")(lambda: SolverWorker([[0, 1]], 1, COST, method=None))
case(S, "worker: seed -1")(lambda: SolverWorker([[0, 1]], 1, COST, seed=-1))
case(S, "worker: time_limit 0")(lambda: SolverWorker([[0, 1]], 1, COST, time_limit=0))
case(S, "worker: expert id 10**9 in a 2-slot map")(lambda: SolverWorker([[0, 10**9]], 1, COST))
case(S, "worker: n_experts 10**12")(lambda: SolverWorker([[0, 1]], 1, COST, n_experts=10**12))
case(S, "dispatch: 3-D ids")(
    lambda: dispatch_and_count(np.zeros((1, 1, 1), int), np.array([[0]]), np.array([[1.0]]))
)
case(S, "dispatch: num_valid_tokens 1.5")(
    lambda: dispatch_and_count(
        np.zeros((1, 1), int), np.array([[0]]), np.array([[1.0]]), num_valid_tokens=1.5
    )
)
case(S, "dispatch: backend triton on numpy")(
    lambda: dispatch_and_count(
        np.zeros((1, 1), int), np.array([[0]]), np.array([[1.0]]), backend="triton"
    )
)
case(S, "dispatch: ids float")(
    lambda: dispatch_and_count(np.array([[0.5]]), np.array([[0]]), np.array([[1.0]]))
)
case(
    S,
    "dispatch: check=False orphan not counted",
    "value",
    lambda v: v[1].tolist() == [0, 1] and v[0].tolist() == [[-1, 1]],
)(
    lambda: dispatch_and_count(
        np.array([[0, 1]]), np.array([[-1], [1]]), np.ones((2, 1)), check=False
    )
)

# second round: public methods' scalar arguments, rank names, sweep outputs
if HAS_TORCH:
    case(S, "publisher.layer(5) of a 1-layer table")(lambda: pub().layer(5))
    case(S, "publisher.layer('0')")(lambda: pub().layer("0"))
case(S, "worker: wait_ready(timeout='x')")(lambda: W2.wait_ready(timeout="x"))
case(S, "worker: wait_tables(window=None)")(lambda: W2.wait_tables(None))
case(S, "worker: close(timeout=-1) before start")(lambda: W2.close(timeout=-1))
case(S, "dispatch: counter of floats")(
    lambda: dispatch_and_count(
        np.array([[0]]), np.array([[0]]), np.array([[1.0]]), counter=np.zeros(1)
    )
)
case(S, "dispatch: num_valid_tokens -1")(
    lambda: dispatch_and_count(
        np.array([[0]]), np.array([[0]]), np.array([[1.0]]), num_valid_tokens=-1
    )
)


def trt_dir(name, files):
    import safetensors.numpy as stn

    d = fresh(name)
    save_json({"num_experts": 2, "num_experts_per_token": 1}, d / "meta_info.json")
    for fname, tensors in files.items():
        stn.save_file(tensors, str(d / fname))
    return d


ONE = {"0_3": np.ones(2, np.int32)}
case(
    R,
    "trtllm: a stray 'rank\u0661' (Arabic-Indic digit) file is not a rank file",
    "value",
    lambda log: len(log.sources) == 2 and log.n_ranks == 1,
)(
    lambda: read_trtllm_statistics(
        trt_dir("tr4", {"rank0.safetensors": ONE, "rank\u0661.safetensors": ONE})
    )
)
case(R, "trtllm: ranks 0 and 2")(
    lambda: read_trtllm_statistics(
        trt_dir("tr5", {"rank0.safetensors": ONE, "rank2.safetensors": ONE})
    )
)
case(R, "trtllm: 2-D tensor")(
    lambda: read_trtllm_statistics(
        trt_dir("tr6", {"rank0.safetensors": {"0_3": np.ones((1, 2), np.int32)}})
    )
)
case(R, "trtllm: fractional float16 counts")(
    lambda: read_trtllm_statistics(
        trt_dir("tr7", {"rank0.safetensors": {"0_3": np.array([0.5, 1], np.float16)}})
    )
)
case(R, "trtllm: iter_start past every iteration")(
    lambda: read_trtllm_statistics(trt_dir("tr8", {"rank0.safetensors": ONE}), iter_start=5)
)
case(R, "trtllm: a file with no tensors")(
    lambda: read_trtllm_statistics(trt_dir("tr9", {"rank0.safetensors": {}}))
)
case(R, "vllm: rank file named with a non-ASCII digit")(
    lambda: read_vllm_state(
        [
            jfile(
                "s_rank\u0661.json",
                {"physical_to_logical_map": P2L, "expert_load_pass": [[1, 1, 1, 1]]},
            ),
            jfile(
                "s_rank0.json",
                {"physical_to_logical_map": P2L, "expert_load_pass": [[1, 1, 1, 1]]},
            ),
        ]
    )
)


# fourth round: EngineLog built directly (what plan() takes)
def elog(**kw):
    from straggler.runtime import EngineLog

    return EngineLog(engine="sglang", kind="k", sources=["s"], **({"n_experts": 1} | kw))


case(S, "EngineLog: counts 2.9")(lambda: elog(counts=[[[2.9]]]))
case(S, "EngineLog: counts a string")(lambda: elog(counts="abc"))
case(S, "EngineLog: counts 2-D")(lambda: elog(counts=[[1]]))
case(S, "EngineLog: counts negative")(lambda: elog(counts=[[[-1]]]))
case(S, "EngineLog: map id past n_experts")(lambda: elog(physical_to_logical=[[0, 5]]))
case(S, "EngineLog: neither counts nor map")(lambda: elog())
case(S, "EngineLog: two layer ids for one layer")(lambda: elog(counts=[[[1]]], layer_ids=[0, 1]))

# --- sweep ----------------------------------------------------------------------------------
SW = "sweep"


def journal(name, text):
    p = fresh("sweep") / f"{name}.csv"
    Path(str(p) + ".cells.jsonl").write_text(text)
    return p


def cell(x):
    return {"y": x}


case(SW, "journal: settings a list")(
    lambda: sweep(
        cell,
        {"x": [1]},
        backend="serial",
        progress=False,
        path=journal("a", '{"settings": [1], "result": {"y": 1}}\n'),
    )
)
case(SW, "journal: result NaN is fine", "value", lambda t: len(t) == 1)(
    lambda: sweep(
        cell,
        {"x": [1]},
        backend="serial",
        progress=False,
        path=journal("b", '{"settings": {"x": 1}, "result": {"y": NaN}}\n'),
    )
)
case(SW, "journal: extra top-level key")(
    lambda: sweep(
        cell,
        {"x": [1]},
        backend="serial",
        progress=False,
        path=journal("c", '{"settings": {"x": 1}, "result": {"y": 1}, "z": 0}\n'),
    )
)
case(SW, "journal: a directory")(
    lambda: sweep(
        cell,
        {"x": [1]},
        backend="serial",
        progress=False,
        path=(lambda p: (Path(str(p) + ".cells.jsonl").mkdir(), p)[1])(fresh("sweep") / "d.csv"),
    )
)
case(SW, "journal: binary junk lines rerun", "value", lambda t: t.column("y").tolist() == [1])(
    lambda: sweep(
        cell, {"x": [1]}, backend="serial", progress=False, path=journal("e", "\x00\x01garbage\n")
    )
)
case(SW, "sweep: func of a guarded script on the process backend", "value", lambda t: len(t) == 1)(
    lambda: sweep(cell, {"x": [1]}, progress=False, workers=1)
)
case(SW, "sweep: path an int")(lambda: sweep(cell, {"x": [1]}, backend="serial", path=5))
case(SW, "sweep: path a directory (refused before the cells run)")(
    lambda: sweep(slow_cell, {"x": [1]}, backend="serial", progress=False, path=fresh("sweepdir"))
)
case(SW, "sweep: path under a file")(
    lambda: sweep(slow_cell, {"x": [1]}, backend="serial", progress=False, path=A_FILE + "/t.csv")
)
case(SW, "sweep: desc None")(lambda: sweep(cell, {"x": [1]}, backend="serial", desc=None))
case(SW, "sweep: empty grid")(lambda: sweep(cell, {"x": []}, backend="serial", progress=False))

# fifth round: the sweep's table and grid
case(SW, "SweepTable: rows of ints")(lambda: SweepTable([1, 2], settings=["a"]))
case(SW, "SweepTable: a setting no row has")(lambda: SweepTable([{"a": 1}], settings=["z"]))
case(SW, "SweepTable.to_csv: a directory")(
    lambda: SweepTable([{"a": 1}], settings=["a"]).to_csv(fresh("tcsv"))
)
case(SW, "SweepTable.to_csv: under a file")(
    lambda: SweepTable([{"a": 1}], settings=["a"]).to_csv(A_FILE + "/t.csv")
)
case(SW, "SweepTable.read_csv: missing")(lambda: SweepTable.read_csv(TMP / "nope.csv"))
case(SW, "SweepTable.read_csv: a directory")(lambda: SweepTable.read_csv(fresh("rcsv")))
case(SW, "SweepTable.read_csv: binary")(
    lambda: SweepTable.read_csv((lambda p: (p.write_bytes(b"\xff\xfe\x00"), p)[1])(TMP / "b.csv"))
)
case(SW, "grid_cells: 10**12 cells (refused before building them)")(
    lambda: grid_cells({f"k{i}": list(range(10)) for i in range(12)})
)
case(SW, "grid_cells: a setting in grid and fixed")(lambda: grid_cells({"a": [1]}, fixed={"a": 2}))
case(SW, "sweep: func returns None")(
    lambda: sweep(cell_none, {"x": [1]}, backend="serial", progress=False)
)
case(S, "window_delta: torch tensors", "value", lambda v: v.tolist() == [2])(
    lambda: window_delta(__import__("torch").tensor([5]), __import__("torch").tensor([3]))
)
case(S, "window_delta: bools")(lambda: window_delta(np.array([True]), np.array([False])))


def cell_none(x):
    return None


def slow_cell(x):
    # a cell that should never run: the output path is refused first
    raise AssertionError("the cell ran before the output path was checked")


# =========================================================================================
# b: the second author's cases. Written from the public surface only (README, docs/, the
# docstrings, the commands' --help), without reading the fixes. Areas ``b:writers`` (a
# writer refuses what its reader refuses; valid inputs round-trip exactly), ``b:sets``
# (directory outputs), ``b:damage`` (damaged binaries), ``b:paths`` (special paths),
# ``b:cert`` (certificates against the exact MILP optimum), ``b:numbers`` (extreme
# values), ``b:names`` (the error names the parameter the caller passed) and
# ``b:commands`` (each command, run as a subprocess).
# =========================================================================================
import shutil  # noqa: E402
import stat as _stat  # noqa: E402

from straggler.formulations import DispatchProblem  # noqa: E402
from straggler.runtime.engines import read_sglang_recorder as _read_rec  # noqa: E402
from straggler.runtime.engines import vllm_maps as _vmaps  # noqa: E402

BW, BS, BD, BP = "b:writers", "b:sets", "b:damage", "b:paths"
BC, BN, BE, BX = "b:cert", "b:numbers", "b:names", "b:commands"


def bdir(tag="d") -> Path:
    """A fresh, empty folder of its own for one case."""
    (TMP / "b").mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=tag, dir=TMP / "b"))  # unique in a forked child too


def same(a, b) -> bool:
    return a is not None and b is not None and np.array_equal(np.asarray(a), np.asarray(b))


def fifo(tag="f") -> Path:
    p = bdir(tag) / "fifo"
    os.mkfifo(p)
    return p


def isolated(area, name, want="error", check=None):
    """A case run in a forked child with a memory limit (FIFOs, huge sizes)."""

    def deco(fn):
        ISOLATED.add(id(fn))
        return case(area, name, want, check)(fn)

    return deco


# --- (1) writers vs their readers -----------------------------------------------------------
MAP4 = [[0, 1, 2, 0]]
L2P4 = [[[0, 3], [1, -1], [2, -1]]]
CNT4 = [[2, 1, 1]]


def rt_eplb(suffix, weight):
    p = write_eplb_maps(bdir() / f"e{suffix}", MAP4, L2P4, CNT4, weight=weight)
    return read_eplb_maps(p)


case(
    BW,
    "eplb .json round trip (maps and weight)",
    "value",
    lambda v: (
        same(v.physical_to_logical, MAP4)
        and same(v.counts, [[[5, 0, 7]]])
        and same(v.extras["log2phy"], L2P4)
    ),
)(lambda: rt_eplb(".json", [[5, 0, 7]]))
if HAS_TORCH:
    case(
        BW,
        "eplb .pt round trip (maps and weight)",
        "value",
        lambda v: same(v.physical_to_logical, MAP4) and same(v.counts, [[[5, 0, 7]]]),
    )(lambda: rt_eplb(".pt", [[5, 0, 7]]))
case(BW, "eplb: weight inf")(lambda: rt_eplb(".json", [[float("inf"), 0, 1]]))
case(BW, "eplb: weight 2**64 (past int64)")(lambda: rt_eplb(".json", [[2**64, 0, 1]]))
case(BW, "eplb: weight of a different expert count")(lambda: rt_eplb(".json", [[1, 2]]))
case(BW, "eplb: phy2log id 1.5")(
    lambda: write_eplb_maps(bdir() / "e.json", [[0, 1.5, 2, 0]], L2P4, CNT4)
)
case(BW, "eplb: phy2log of bools")(
    lambda: write_eplb_maps(bdir() / "e.json", [[True, False]], [[[1], [0]]], [[1, 1]])
)
case(BW, "eplb: logcnt 0 for an expert with a slot")(
    lambda: write_eplb_maps(bdir() / "e.json", MAP4, L2P4, [[2, 0, 1]])
)
case(BW, "eplb: log2phy lists a slot twice")(
    lambda: write_eplb_maps(bdir() / "e.json", MAP4, [[[0, 0], [1, -1], [2, -1]]], [[2, 1, 1]])
)
case(BW, "eplb: a .yaml path")(lambda: write_eplb_maps(bdir() / "e.yaml", MAP4, L2P4, CNT4))
case(BW, "eplb: layer counts differ (2 map rows, 1 count row)")(
    lambda: write_eplb_maps(bdir() / "e.json", MAP4 * 2, L2P4 * 2, CNT4)
)

case(
    BW,
    "init location: counts round trip",
    "value",
    lambda v: same(v.counts, [[[3, 0, 9]]]) and v.n_experts == 3,
)(
    lambda: read_sglang_init_location(
        write_sglang_init_location(bdir() / "i.json", logical_count=[[3, 0, 9]])
    )
)
case(
    BW,
    "init location: map round trip",
    "value",
    lambda v: same(v.physical_to_logical, [[1, 0, 2, 2]]),
)(
    lambda: read_sglang_init_location(
        write_sglang_init_location(bdir() / "i.json", physical_to_logical=[[1, 0, 2, 2]])
    )
)
case(BW, "init location: map skips expert 1 (0, 2, 2)")(
    lambda: write_sglang_init_location(bdir() / "i.json", physical_to_logical=[[0, 2, 2]])
)
case(BW, "init location: counts NaN")(
    lambda: write_sglang_init_location(bdir() / "i.json", logical_count=[[1, float("nan")]])
)
case(BW, "init location: counts negative")(
    lambda: write_sglang_init_location(bdir() / "i.json", logical_count=[[1, -3]])
)
case(BW, "init location: counts 1.5")(
    lambda: write_sglang_init_location(bdir() / "i.json", logical_count=[[1, 1.5]])
)
case(BW, "init location: neither argument")(lambda: write_sglang_init_location(bdir() / "i.json"))
case(BW, "init location: empty map [[]]")(
    lambda: write_sglang_init_location(bdir() / "i.json", physical_to_logical=[[]])
)
case(BW, "init location: map of strings")(
    lambda: write_sglang_init_location(bdir() / "i.json", physical_to_logical=[["0", "1"]])
)

if HAS_TORCH:
    case(
        BW,
        "stat dump: round trip with rate",
        "value",
        lambda v: same(v.counts, [[[1, 0, 4]], [[2, 2, 2]]]),
    )(
        lambda: _read_rec(
            write_sglang_stat_dump(
                bdir(), [[[1, 0, 4]], [[2, 2, 2]]], average_utilization_rate=0.5, timestamp=7.0
            )
        )
    )
    case(BW, "stat dump: bool counts")(
        lambda: write_sglang_stat_dump(bdir(), [[[True, False]]], timestamp=1.0)
    )
    case(BW, "stat dump: counts past 2**53 in total")(
        lambda: write_sglang_stat_dump(bdir(), [[[2**52, 2**52, 2**52]]], timestamp=1.0)
    )
    case(BW, "stat dump: counts 2-D")(
        lambda: write_sglang_stat_dump(bdir(), [[1, 2]], timestamp=1.0)
    )
    case(
        BW,
        "stat dump: rate NaN (refused, or read back as NaN: the reader takes NaN)",
        "either",
        lambda v: np.isnan(v.extras["average_utilization_rate_over_window"]),
    )(
        lambda: _read_rec(
            write_sglang_stat_dump(bdir(), [[[1, 2]]], average_utilization_rate=float("nan"))
        )
    )
    case(BW, "stat dump: timestamp inf")(
        lambda: write_sglang_stat_dump(bdir(), [[[1, 2]]], timestamp=float("inf"))
    )
    case(BW, "stat dump: rank True")(lambda: write_sglang_stat_dump(bdir(), [[[1, 2]]], rank=True))
    case(
        BW,
        "detail dump: per-pass round trip",
        "value",
        lambda v: same(v.counts, [[[1, 5, 0]], [[0, 4, 1]]]),
    )(
        lambda: _read_rec(
            write_sglang_detail_dump(
                bdir(),
                [
                    {"forward_pass_id": 0, "global_physical_count": [[1, 2, 0, 3]]},
                    {"forward_pass_id": 1, "global_physical_count": [[0, 4, 1, 0]]},
                ],
                [[0, 1, 2, 1]],
                rank=0,
                timestamp=1.0,
            )
        )
    )
    case(BW, "detail dump: one forward_pass_id twice")(
        lambda: write_sglang_detail_dump(
            bdir(),
            [
                {"forward_pass_id": 0, "global_physical_count": [[1, 2, 0, 3]]},
                {"forward_pass_id": 0, "global_physical_count": [[1, 2, 0, 3]]},
            ],
            [[0, 1, 2, 1]],
            rank=0,
            timestamp=1.0,
        )
    )
    case(BW, "detail dump: counts negative")(
        lambda: write_sglang_detail_dump(
            bdir(),
            [{"forward_pass_id": 0, "global_physical_count": [[1, -2, 0, 3]]}],
            [[0, 1, 2, 1]],
            rank=0,
            timestamp=1.0,
        )
    )
    case(BW, "detail dump: rank -3")(
        lambda: write_sglang_detail_dump(
            bdir(),
            [{"forward_pass_id": 0, "global_physical_count": [[1, 2, 0, 3]]}],
            [[0, 1, 2, 1]],
            rank=-3,
            timestamp=1.0,
        )
    )
    case(BW, "detail dump: counts on an empty slot (-1 in the map)")(
        lambda: write_sglang_detail_dump(
            bdir(),
            [{"forward_pass_id": 0, "global_physical_count": [[1, 2, 0, 3]]}],
            [[0, 1, 2, -1]],
            rank=0,
            timestamp=1.0,
        )
    )

case(
    BW,
    "moe yaml: round trip",
    "value",
    lambda v: (
        same(v.physical_to_logical, [[2, 0, 1, 1], [0, 1, 2, 2]]) and same(v.layer_ids, [7, 9])
    ),
)(
    lambda: read_moe_load_balancer(
        write_moe_load_balancer(bdir() / "m.yaml", [[2, 0, 1, 1], [0, 1, 2, 2]], layer_ids=[7, 9])
    )
)
case(BW, "moe yaml: an empty slot -1")(
    lambda: write_moe_load_balancer(bdir() / "m.yaml", [[0, 1, -1, 2]])
)
case(BW, "moe yaml: expert 1 without a slot ([0, 2, 2, 0])")(
    lambda: write_moe_load_balancer(bdir() / "m.yaml", [[0, 2, 2, 0]])
)
case(BW, "moe yaml: layer id twice")(
    lambda: write_moe_load_balancer(bdir() / "m.yaml", [[0, 1], [1, 0]], layer_ids=[2, 2])
)
case(BW, "moe yaml: layer id negative")(
    lambda: write_moe_load_balancer(bdir() / "m.yaml", [[0, 1]], layer_ids=[-1])
)
case(BW, "moe yaml: layer_updates_per_iter -1")(
    lambda: write_moe_load_balancer(bdir() / "m.yaml", [[0, 1]], layer_updates_per_iter=-1)
)
case(BW, "moe yaml: ragged rows")(
    lambda: write_moe_load_balancer(bdir() / "m.yaml", [[0, 1], [0, 1, 1]])
)


def trt_rt():
    d = bdir()
    one = np.arange(12).reshape(2, 1, 6)
    write_trtllm_statistics(d, np.stack([one, one, one]), layer_ids=[4], top_k=2)
    return read_trtllm_statistics(d)


case(
    BW,
    "trtllm stats: round trip (3 ranks summed)",
    "value",
    lambda v: (
        v.n_ranks == 3
        and same(v.counts, 3 * np.arange(12).reshape(2, 1, 6))
        and same(v.layer_ids, [4])
    ),
)(trt_rt)
case(BW, "trtllm stats: counts 1.5")(
    lambda: write_trtllm_statistics(bdir(), [[[[1.5, 1]]]], layer_ids=[0], top_k=1)
)
case(BW, "trtllm stats: counts negative")(
    lambda: write_trtllm_statistics(bdir(), [[[[-1, 1]]]], layer_ids=[0], top_k=1)
)
case(BW, "trtllm stats: top_k 0")(
    lambda: write_trtllm_statistics(bdir(), [[[[1, 1]]]], layer_ids=[0], top_k=0)
)
case(BW, "trtllm stats: layer id twice")(
    lambda: write_trtllm_statistics(bdir(), np.ones((1, 1, 2, 2), int), layer_ids=[1, 1], top_k=1)
)
case(BW, "trtllm stats: iteration id twice")(
    lambda: write_trtllm_statistics(
        bdir(), np.ones((1, 2, 1, 2), int), layer_ids=[1], iter_ids=[5, 5], top_k=1
    )
)
case(BW, "trtllm stats: iter_ids shorter than the iterations")(
    lambda: write_trtllm_statistics(
        bdir(), np.ones((1, 2, 1, 2), int), layer_ids=[1], iter_ids=[5], top_k=1
    )
)
case(BW, "trtllm stats: rank sum past 2**53")(
    lambda: write_trtllm_statistics(
        bdir(), np.full((4, 1, 1, 2), 2**51 + 3), layer_ids=[0], top_k=1
    )
)
case(BW, "trtllm stats: zero ranks")(
    lambda: write_trtllm_statistics(bdir(), np.ones((0, 1, 1, 2), int), layer_ids=[0], top_k=1)
)

VST = dict(
    _vmaps(MAP4, 3),
    expert_load_pass=[[1, 2, 3, 4]],
    expert_load_window=[[[1, 2, 3, 4]], [[2, 2, 2, 2]]],
    rank=0,
)


def rt_vllm(suffix, **over):
    d = bdir()
    write_vllm_state(d / f"s_rank0{suffix}", dict(VST, **over))
    return read_vllm_state(d)


for _sfx in (".json", ".safetensors", ".pt") if HAS_TORCH else (".json",):
    case(
        BW,
        f"vllm {_sfx}: round trip",
        "value",
        lambda v: same(v.counts, [[[5, 2, 3]], [[4, 2, 2]]]) and same(v.physical_to_logical, MAP4),
    )(lambda s=_sfx: rt_vllm(s))
case(BW, "vllm: window load negative")(
    lambda: rt_vllm(".json", expert_load_window=[[[1, -2, 3, 4]]])
)
case(BW, "vllm: load 2**31 (int32 is vLLM's dtype)")(
    lambda: rt_vllm(".json", expert_load_pass=[[2**31, 0, 0, 0]])
)
case(BW, "vllm: replica count disagrees with the map")(
    lambda: rt_vllm(".json", logical_replica_count=[[1, 1, 1]])
)
case(BW, "vllm: rank -1")(lambda: rt_vllm(".json", rank=-1))
case(BW, "vllm: rank in the state differs from the file name")(lambda: rt_vllm(".json", rank=3))
case(BW, "vllm: window step NaN")(lambda: rt_vllm(".json", expert_load_window_step=float("nan")))

# runtime: the sweep table is written and read back as CSV


def csv_rt(rows):
    p = bdir() / "t.csv"
    SweepTable(rows, settings=["a"]).to_csv(p)
    return SweepTable.read_csv(p)


case(
    BW,
    "SweepTable csv: awkward strings round trip",
    "value",
    lambda v: v.column("a").tolist() == ['x,"y"\nz', " lead", "1e5"],
)(lambda: csv_rt([{"a": 'x,"y"\nz', "r": 1.0}, {"a": " lead", "r": 2.0}, {"a": "1e5", "r": 3.0}]))
case(
    BW,
    "SweepTable csv: results nan, -0.0, 1e308, 2**60 round trip",
    "value",
    lambda v: (
        str(v.column("r").tolist()) == str([float("nan"), -0.0, 1e308])
        and v.column("q").tolist() == [2**60, 1, 2]
    ),
)(
    lambda: csv_rt(
        [
            {"a": 1, "r": float("nan"), "q": 2**60},
            {"a": 2, "r": -0.0, "q": 1},
            {"a": 3, "r": 1e308, "q": 2},
        ]
    )
)
case(BW, "SweepTable csv: a result that is a list (CSV cannot hold it)")(
    lambda: csv_rt([{"a": 1, "r": [1, 2]}])
)


# --- (2) multi-file sets ---------------------------------------------------------------------


def trt_write(d, n_ranks, value=1, n_iters=1):
    return write_trtllm_statistics(
        d, np.full((n_ranks, n_iters, 1, 4), value), layer_ids=[0], top_k=1
    )


def trt_over(first, second):
    d = bdir()
    trt_write(d, first, 1)
    trt_write(d, second, 10)
    return read_trtllm_statistics(d)


case(
    BS,
    "trtllm: 4 ranks then 2 ranks",
    "value",
    lambda v: v.n_ranks == 2 and same(v.counts, [[[20, 20, 20, 20]]]),
)(lambda: trt_over(4, 2))
case(
    BS,
    "trtllm: 2 ranks then 4 ranks",
    "value",
    lambda v: v.n_ranks == 4 and same(v.counts, [[[40, 40, 40, 40]]]),
)(lambda: trt_over(2, 4))
case(
    BS,
    "trtllm: 3 ranks then 1 rank",
    "value",
    lambda v: v.n_ranks == 1 and same(v.counts, [[[10, 10, 10, 10]]]),
)(lambda: trt_over(3, 1))


def trt_stale_copy():
    d = bdir()
    trt_write(d, 2, 1)
    shutil.copy(d / "rank0.safetensors", d / "rank2.safetensors")  # a rank file nobody wrote now
    return read_trtllm_statistics(d)


case(
    BS,
    "trtllm: a copied rank2 beside a 2-rank write (never summed in)",
    "either",
    lambda v: v.n_ranks == 2 and same(v.counts, [[[2, 2, 2, 2]]]),
)(trt_stale_copy)


def trt_failed_rewrite():
    d = bdir()
    trt_write(d, 2, 1)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    try:
        write_trtllm_statistics(
            d, [np.ones((1, 1, 4)), -np.ones((1, 1, 4))], layer_ids=[0], top_k=1
        )
    except InvalidInputError:
        pass
    after = {p.name: p.read_bytes() for p in d.iterdir()}
    return before == after, read_trtllm_statistics(d)


case(
    BS,
    "trtllm: a refused rewrite leaves the earlier set byte for byte",
    "value",
    lambda v: v[0] and same(v[1].counts, [[[2, 2, 2, 2]]]),
)(trt_failed_rewrite)


def trt_keep_yaml():
    d = bdir()
    write_moe_load_balancer(d / "moe_load_balancer.yaml", [[0, 1, 2, 3]], layer_ids=[0])
    trt_write(d, 2, 1)
    trt_write(d, 1, 5)
    return read_trtllm_statistics(d)


case(
    BS,
    "trtllm: rewrite keeps the placement yaml beside it",
    "value",
    lambda v: v.n_ranks == 1 and same(v.physical_to_logical, [[0, 1, 2, 3]]),
)(trt_keep_yaml)


def trt_iters_shrink():
    d = bdir()
    trt_write(d, 1, 1, n_iters=5)
    trt_write(d, 1, 3, n_iters=2)
    return read_trtllm_statistics(d)


case(
    BS,
    "trtllm: 5 iterations then 2 (old keys gone)",
    "value",
    lambda v: same(v.batch_ids, [0, 1]) and same(v.counts, [[[3] * 4]] * 2),
)(trt_iters_shrink)


def trt_dir_is_file():
    p = bdir() / "stats"
    p.write_text("keep")
    try:
        trt_write(p, 1)
    finally:
        if p.read_text() != "keep":
            raise AssertionError("the file in the directory's place was changed")


case(BS, "trtllm: directory is a regular file")(trt_dir_is_file)


if HAS_TORCH:

    def sg_ranks_then_fewer():
        d = bdir()
        m = [[0, 1, 2, 1]]
        for r in (0, 1):
            write_sglang_detail_dump(
                d,
                [{"forward_pass_id": 0, "global_physical_count": [[1, 1, 1, 1]]}],
                m,
                rank=r,
                timestamp=1.0,
            )
        write_sglang_detail_dump(
            d,
            [{"forward_pass_id": 0, "global_physical_count": [[5, 0, 0, 0]]}],
            m,
            rank=0,
            timestamp=2.0,
        )
        return _read_rec(d)

    case(BS, "sglang: two recordings' rank files in one folder (mixed set)")(sg_ranks_then_fewer)

    def sg_two_stat():
        d = bdir()
        write_sglang_stat_dump(d, [[[1, 2]]], timestamp=1.0)
        write_sglang_stat_dump(d, [[[1, 2, 3]]], timestamp=2.0)
        return _read_rec(d)

    case(BS, "sglang: two stat dumps of different expert counts in one folder")(sg_two_stat)


def vllm_two_files_one_rank():
    d = bdir()
    write_vllm_state(d / "s_rank0.json", VST)
    write_vllm_state(d / "s_rank1.json", dict(VST, rank=1))
    write_vllm_state(d / "old_rank1.json", dict(VST, rank=1))
    return read_vllm_state(d)


case(BS, "vllm: two files claim rank 1")(vllm_two_files_one_rank)


def vllm_mixed_formats():
    d = bdir()
    write_vllm_state(d / "s_rank0.json", VST)
    write_vllm_state(d / "s_rank0.safetensors", VST)
    return read_vllm_state(d)


case(BS, "vllm: rank 0 as .json and .safetensors")(vllm_mixed_formats)


def stale_before_write():
    d = bdir()
    trt_write(d, 1, 1)
    shutil.copy(d / "rank0.safetensors", d / "rank2.safetensors")  # left by an earlier tool
    shutil.copy(d / "rank0.safetensors", d / "rank5.safetensors")
    trt_write(d, 2, 3)
    return read_trtllm_statistics(d)


case(
    BS,
    "trtllm: rank2/rank5 files present before a 2-rank write",
    "value",
    lambda v: v.n_ranks == 2 and same(v.counts, [[[6, 6, 6, 6]]]),
)(stale_before_write)


def killed_write(write_old, write_new, read, delays=(0.002, 0.01, 0.03, 0.08, 0.2)):
    """``write_new`` killed (SIGKILL) part way over ``write_old``'s output, at each delay: the
    reader must then see the old output or the new one, whole."""
    import signal

    d = bdir()
    write_old(d)
    old = read(d)
    ref = bdir()
    write_new(ref)
    new = read(ref)
    got = []
    for delay in delays:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                write_new(d)
            finally:
                os._exit(0)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            v = read(d)
            got.append(
                "old"
                if same(v.counts, old.counts)
                else "new"
                if same(v.counts, new.counts)
                else "mixed"
            )
        except InvalidInputError as exc:
            got.append(f"error: {str(exc)[:80]}")
    return got


def whole(got):
    return all(g in ("old", "new") for g in got)


BIG = np.random.default_rng(1).integers(0, 1000, (4, 64, 8, 256))
case(BS, "trtllm: a 4-rank write killed part way over a 2-rank set", "value", whole)(
    lambda: killed_write(
        lambda d: trt_write(d, 2, 1, n_iters=64),
        lambda d: write_trtllm_statistics(d, BIG, layer_ids=list(range(8)), top_k=8),
        read_trtllm_statistics,
    )
)
case(BS, "trtllm: a 1-rank write killed part way over a 4-rank set", "value", whole)(
    lambda: killed_write(
        lambda d: write_trtllm_statistics(d, BIG, layer_ids=list(range(8)), top_k=8),
        lambda d: write_trtllm_statistics(d, BIG[:1] + 1, layer_ids=list(range(8)), top_k=8),
        read_trtllm_statistics,
    )
)
VBIG = dict(
    _vmaps([list(range(256)) * 2], 256),
    expert_load_pass=[list(range(512))],
    expert_load_window=np.random.default_rng(2).integers(0, 10**6, (2000, 1, 512)).tolist(),
    rank=0,
)
for _sfx in (".json", ".safetensors"):
    case(BS, f"vllm {_sfx}: a rewrite killed part way", "value", whole)(
        lambda s=_sfx: killed_write(
            lambda d: write_vllm_state(d / f"s_rank0{s}", VST),
            lambda d: write_vllm_state(d / f"s_rank0{s}", VBIG),
            lambda d: read_vllm_state(d),
        )
    )
case(BS, "eplb .json: a rewrite killed part way", "value", whole)(
    lambda: killed_write(
        lambda d: write_eplb_maps(d / "e.json", MAP4, L2P4, CNT4, weight=[[5, 1, 2]]),
        lambda d: write_eplb_maps(
            d / "e.json",
            [list(range(256)) * 2] * 40,
            [[[e, e + 256] for e in range(256)]] * 40,
            [[2] * 256] * 40,
            weight=np.random.default_rng(3).integers(0, 10**9, (40, 256)),
        ),
        lambda d: read_eplb_maps(d / "e.json"),
    )
)
if HAS_TORCH:
    case(BS, "sglang stat dump: a second dump killed part way (folder)", "value", whole)(
        lambda: killed_write(
            lambda d: write_sglang_stat_dump(d, [[[1, 2, 3]]], timestamp=1.0),
            lambda d: write_sglang_stat_dump(
                d, np.random.default_rng(4).integers(0, 9, (3000, 4, 3)), timestamp=1.0
            ),
            _read_rec,
        )
    )


# --- (3) damaged binaries --------------------------------------------------------------------


def damaged(write, read, how, pos=0.5, bit=7):
    """Write a valid file, damage a copy, read the copy: an error, or exactly the original."""
    src = Path(write(bdir()))
    orig = read(src)
    d = bdir()
    dst = d / src.name
    shutil.copy(src, dst)
    b = bytearray(dst.read_bytes())
    if how == "flip":
        i = min(len(b) - 1, int(pos * len(b))) if isinstance(pos, float) else pos % len(b)
        b[i] ^= 1 << bit
    elif how == "trunc":
        b = b[: int(len(b) * pos)]
    elif how == "zero":
        b = bytearray()
    elif how == "magic":
        b[:4] = b"XXXX"
    elif how == "append":
        b += b"\x00junk"
    dst.write_bytes(bytes(b))
    return orig, read(dst)


def same_log(v):
    o, n = v
    return same(o.counts, n.counts) and (
        (o.physical_to_logical is None and n.physical_to_logical is None)
        or same(o.physical_to_logical, n.physical_to_logical)
    )


def sg_w(d):
    return write_sglang_stat_dump(d, [[[1000, 2000, 3000, 42]]] * 3, timestamp=1.0)


def trt_w(d):
    write_trtllm_statistics(d, np.full((1, 2, 1, 8), 1000), layer_ids=[0], top_k=1)
    return d / "rank0.safetensors"


def trt_r(p):
    return read_trtllm_statistics(Path(p).parent)


def trt_dmg(how, pos=0.5, bit=7):
    """Damage rank0.safetensors in a copy of the whole set."""
    src = trt_w(bdir())
    orig = trt_r(src)
    d = bdir()
    for f in src.parent.iterdir():
        shutil.copy(f, d / f.name)
    b = bytearray((d / "rank0.safetensors").read_bytes())
    if how == "flip":
        b[pos % len(b)] ^= 1 << bit
    elif how == "trunc":
        b = b[: int(len(b) * pos)]
    elif how == "zero":
        b = bytearray()
    (d / "rank0.safetensors").write_bytes(bytes(b))
    return orig, trt_r(d)


def vjson_w(d):
    return write_vllm_state(d / "s_rank0.json", VST)


def vst_w(d):
    return write_vllm_state(d / "s_rank0.safetensors", VST)


def vpt_w(d):
    return write_vllm_state(d / "s_rank0.pt", VST)


def eplb_w(d):
    return write_eplb_maps(d / "e.json", MAP4, L2P4, CNT4, weight=[[5, 1, 2]])


def eplbpt_w(d):
    return write_eplb_maps(d / "e.pt", MAP4, L2P4, CNT4, weight=[[5, 1, 2]])


if HAS_TORCH:
    for _how, _pos, _bit in [
        ("flip", 0.3, 0),
        ("flip", 0.5, 7),
        ("flip", 0.7, 3),
        ("flip", 0.9, 1),
        ("flip", -1, 0),
        ("trunc", 0.5, 0),
        ("trunc", 0.98, 0),
        ("zero", 0, 0),
        ("magic", 0, 0),
        ("append", 0, 0),
    ]:
        case(BD, f"sglang stat .pt: {_how} at {_pos} bit {_bit}", "either", same_log)(
            lambda h=_how, p=_pos, b=_bit: damaged(sg_w, _read_rec, h, p, b)
        )
    for _how, _pos in [("flip", 0.5), ("trunc", 0.6), ("zero", 0), ("magic", 0)]:
        case(BD, f"vllm .pt: {_how} at {_pos}", "either", same_log)(
            lambda h=_how, p=_pos: damaged(vpt_w, lambda f: read_vllm_state(f), h, p, 6)
        )
        case(BD, f"eplb .pt: {_how} at {_pos}", "either", same_log)(
            lambda h=_how, p=_pos: damaged(eplbpt_w, read_eplb_maps, h, p, 6)
        )
# safetensors: 8-byte header length, JSON header, then the int64 payload (little-endian): the
# last byte of the file is the top byte of the last count (bit 7: the count turns negative,
# bit 6: it passes 2**53), both detectable.
for _how, _pos, _bit in [
    ("flip", -1, 7),
    ("flip", -1, 6),
    ("flip", 0, 6),
    ("flip", 7, 7),
    ("flip", 12, 1),
    ("trunc", 0.5, 0),
    ("trunc", 0.99, 0),
    ("zero", 0, 0),
]:
    case(BD, f"trtllm rank .safetensors: {_how} at {_pos} bit {_bit}", "either", same_log)(
        lambda h=_how, p=_pos, b=_bit: trt_dmg(h, p, b)
    )
for _how, _pos, _bit in [("flip", -1, 7), ("flip", 0, 6), ("trunc", 0.5, 0), ("zero", 0, 0)]:
    case(BD, f"vllm .safetensors: {_how} at {_pos} bit {_bit}", "either", same_log)(
        lambda h=_how, p=_pos, b=_bit: damaged(vst_w, lambda f: read_vllm_state(f), h, p, b)
    )
for _how, _pos, _bit in [("flip", 0.5, 4), ("trunc", 0.5, 0), ("zero", 0, 0), ("magic", 0, 0)]:
    case(BD, f"vllm .json: {_how}", "either", same_log)(
        lambda h=_how, p=_pos, b=_bit: damaged(vjson_w, lambda f: read_vllm_state(f), h, p, b)
    )
    case(BD, f"eplb .json: {_how}", "either", same_log)(
        lambda h=_how, p=_pos, b=_bit: damaged(eplb_w, read_eplb_maps, h, p, b)
    )


def xz_trace(how):
    import lzma

    d = bdir()
    rows = "".join(
        f'{{"timestamp": {i * 10}, "input_length": {100 + i}, "output_length": 5}}\n'
        for i in range(50)
    )
    good = d / "t.jsonl.xz"
    good.write_bytes(lzma.compress(rows.encode()))
    b = bytearray(good.read_bytes())
    if how == "flip":
        b[len(b) // 2] ^= 0x10
    elif how == "trunc":
        b = b[: len(b) // 2]
    elif how == "zero":
        b = bytearray()
    bad = d / "bad.jsonl.xz"
    bad.write_bytes(bytes(b))
    from straggler.sim import load_trace

    return load_trace(bad)


for _how in ("flip", "trunc", "zero"):
    case(BD, f"trace .jsonl.xz: {_how}")(lambda h=_how: xz_trace(h))

# --- (4) special paths -----------------------------------------------------------------------


def eplb_at(p):
    return write_eplb_maps(p, MAP4, L2P4, CNT4)


def link_to_file():
    d = bdir()
    real = Path(eplb_at(d / "real.json"))
    (d / "link.json").symlink_to(real)
    return read_eplb_maps(d / "link.json")


case(BP, "read: symlink to a file", "value", lambda v: same(v.physical_to_logical, MAP4))(
    link_to_file
)


def link_to_dir():
    d = bdir()
    trt_write(d / "real", 2, 1)
    (d / "link").symlink_to(d / "real", target_is_directory=True)
    return read_engine_log(d / "link")


case(BP, "read: symlink to a statistics folder", "value", lambda v: v.n_ranks == 2)(link_to_dir)


def write_through_link():
    d = bdir()
    eplb_at(d / "real.json")
    (d / "link.json").symlink_to(d / "real.json")
    write_eplb_maps(d / "link.json", [[1, 0, 2, 1]], [[[1, -1], [0, 3], [2, -1]]], [[1, 2, 1]])
    return (d / "link.json").is_symlink(), read_eplb_maps(d / "real.json")


case(
    BP,
    "write: through a symlink (link kept, target rewritten)",
    "either",
    lambda v: v[0] and same(v[1].physical_to_logical, [[1, 0, 2, 1]]),
)(write_through_link)


def dangling():
    d = bdir()
    (d / "x.json").symlink_to(d / "missing.json")
    return read_eplb_maps(d / "x.json")


case(BP, "read: a dangling symlink")(dangling)


def loop_link():
    d = bdir()
    (d / "a.json").symlink_to(d / "b.json")
    (d / "b.json").symlink_to(d / "a.json")
    return read_engine_log(d / "a.json")


case(BP, "read_engine_log: a symlink loop")(loop_link)

isolated(BP, "read_eplb_maps: a FIFO named .json")(
    lambda: read_eplb_maps(
        (lambda p: (os.rename(p, p.parent / "m.json"), p.parent / "m.json")[1])(fifo())
    )
)
isolated(BP, "read_vllm_state: a FIFO rank file in the folder")(
    lambda: read_vllm_state(
        (lambda p: (os.rename(p, p.parent / "s_rank0.json"), p.parent)[1])(fifo())
    )
)
isolated(BP, "read_trtllm_statistics: meta_info.json a FIFO")(
    lambda: read_trtllm_statistics(
        (lambda p: (os.rename(p, p.parent / "meta_info.json"), p.parent)[1])(fifo())
    )
)
if HAS_TORCH:
    isolated(BP, "read_sglang_recorder: a FIFO dump in the folder")(
        lambda: _read_rec(
            (lambda p: (os.rename(p, p.parent / "expert_distribution_recorder_1.pt"), p.parent)[1])(
                fifo()
            )
        )
    )


def write_to_fifo():
    p = fifo()
    q = p.parent / "m.json"
    os.rename(p, q)
    try:
        eplb_at(q)
    finally:
        if not _stat.S_ISFIFO(os.lstat(q).st_mode):
            raise AssertionError("the FIFO was replaced by the writer")


isolated(BP, "write_eplb_maps: onto a FIFO (refused, FIFO kept)")(write_to_fifo)
isolated(BP, "write_moe_load_balancer: onto a FIFO")(
    lambda: write_moe_load_balancer(fifo(), [[0, 1]])
)
isolated(BP, "load_trace: a FIFO")(
    lambda: __import__("straggler.sim", fromlist=["x"]).load_trace(fifo())
)
isolated(BP, "SweepTable.read_csv: a FIFO")(lambda: SweepTable.read_csv(fifo()))
isolated(BP, "read_sglang_init_location: a FIFO named .json")(
    lambda: read_sglang_init_location(
        str((lambda p: (os.rename(p, p.parent / "i.json"), p.parent / "i.json")[1])(fifo()))
    )
)
case(BP, "read_eplb_maps: a directory named e.json")(
    lambda: read_eplb_maps((lambda d: (d / "e.json").mkdir() or d / "e.json")(bdir()))
)
case(BP, "write_eplb_maps: path is a directory")(
    lambda: eplb_at((lambda d: (d / "e.json").mkdir() or d / "e.json")(bdir()))
)
case(BP, "write_vllm_state: path is a directory")(
    lambda: write_vllm_state(
        (lambda d: (d / "s_rank0.json").mkdir() or d / "s_rank0.json")(bdir()), VST
    )
)
case(BP, "read_eplb_maps: an int (a file descriptor)")(lambda: read_eplb_maps(0))
case(BP, "read_moe_load_balancer: an int")(lambda: read_moe_load_balancer(1))
case(BP, "read_vllm_state: an int")(lambda: read_vllm_state(2))
case(BP, "write_moe_load_balancer: an int path")(lambda: write_moe_load_balancer(3, [[0, 1]]))
case(BP, "write_trtllm_statistics: an int directory")(
    lambda: write_trtllm_statistics(4, np.ones((1, 1, 1, 2), int), layer_ids=[0], top_k=1)
)
case(BP, "read_trtllm_statistics: a bytes path", "either", lambda v: v.n_ranks == 2)(
    lambda: read_trtllm_statistics(os.fsencode((lambda d: (trt_write(d, 2), d)[1])(bdir())))
)
case(
    BP,
    "read_moe_load_balancer: a bytes path",
    "either",
    lambda v: same(v.physical_to_logical, [[0, 1]]),
)(lambda: read_moe_load_balancer(os.fsencode(write_moe_load_balancer(bdir() / "m.yaml", [[0, 1]]))))
case(
    BP,
    "eplb: a file name with a newline round-trips",
    "value",
    lambda v: same(v.physical_to_logical, MAP4),
)(lambda: read_eplb_maps(eplb_at(bdir() / "a\nb.json")))
case(BP, "trtllm: a folder name with a newline round-trips", "value", lambda v: v.n_ranks == 1)(
    lambda: read_trtllm_statistics((lambda d: (trt_write(d, 1), d)[1])(bdir() / "x\ny"))
)
case(BP, "read_engine_log: a path with a NUL byte")(
    lambda: read_engine_log(str(TMP) + "/a\0b.json")
)
case(BP, "write_eplb_maps: a path with a NUL byte")(lambda: eplb_at(str(TMP) + "/a\0b.json"))
case(BP, "load_prefix_blocks: a bytes path to a missing file")(
    lambda: __import__("straggler.sim", fromlist=["x"]).load_prefix_blocks(b"/nonexistent/x.jsonl")
)
case(BP, "write_sglang_init_location: under a regular file")(
    lambda: write_sglang_init_location(A_FILE + "/i.json", logical_count=[[1, 2]])
)

# --- (5) certificates ------------------------------------------------------------------------
from straggler.proofs import certify  # noqa: E402
from straggler.solvers import certified_lower_bound, solve_dispatch  # noqa: E402

P0 = DispatchProblem(counts=[7, 3, 1], replicas=[[1, 1], [1, 0], [1, 0]])
C0 = CostModel(a=0, b=1, c=0, beta=0.5)

case(BC, "bound: problem a list")(lambda: certified_lower_bound([7, 3, 1], C0))
case(BC, "bound: cost None")(lambda: certified_lower_bound(P0, None))
case(BC, "bound: cost a dict")(lambda: certified_lower_bound(P0, dict(a=0, b=1, c=0, beta=0.5)))
case(BC, "bound: arguments swapped")(lambda: certified_lower_bound(C0, P0))
case(BC, "bound: cost a preset name")(lambda: certified_lower_bound(P0, "dsv3_a_offline"))


def random_instance(seed):
    rng = np.random.default_rng(seed)
    E, G = int(rng.integers(3, 6)), int(rng.integers(2, 4))
    R = rng.random((E, G)) < 0.6
    R[np.arange(E), rng.integers(0, G, E)] = True
    counts = rng.integers(0, 40, E) * (rng.random(E) < 0.85)
    kw = dict(
        a=float(rng.integers(0, 5)),
        b=float(rng.integers(0, 6)),
        c=float(rng.integers(0, 4)),
        beta=float(rng.choice([0.1, 0.5, 1.0])),
    )
    if seed % 3 == 1:
        kw.update(b2=float(rng.integers(1, 4)), tile=int(rng.integers(2, 9)))
    if seed % 3 == 2:
        kw.update(c2=float(rng.integers(0, 6)), gamma=float(rng.choice([0.2, 0.7])))
    return DispatchProblem(counts=counts, replicas=R), CostModel(**kw)


def bound_vs_milp(seed):
    p, c = random_instance(seed)
    lb = float(certified_lower_bound(p, c))
    r = solve_dispatch(p, c, method="milp", time_limit=30)
    return lb, float(r.makespan), str(r.status)


for _s in range(14):
    case(
        BC,
        f"bound <= MILP optimum, random instance seed {_s}",
        "value",
        lambda v: "OPTIMAL" in v[2].upper() and v[0] <= v[1] * (1 + 1e-9) + 1e-9,
    )(lambda s=_s: bound_vs_milp(s))


def bound_stack():
    ps = [random_instance(s) for s in (20, 21)]
    c = ps[0][1]
    R = ps[0][0].replicas
    counts = np.stack([ps[0][0].counts, np.roll(ps[0][0].counts, 1)])
    R2 = np.ones_like(R)
    p = DispatchProblem(counts=counts, replicas=R2)
    lb = np.asarray(certified_lower_bound(p, c), float)
    opt = [float(solve_dispatch(p.layer(i), c, method="milp").makespan) for i in range(2)]
    return lb, opt


case(
    BC,
    "bound of a stack <= each layer's MILP optimum",
    "value",
    lambda v: v[0].shape == (2,) and all(a <= b + 1e-9 for a, b in zip(v[0], v[1])),
)(bound_stack)

R_STATIC = None


def static_res():
    return solve_dispatch(P0, C0, method="static")


case(BC, "certify: result of another problem")(
    lambda: certify(
        DispatchProblem(counts=[7, 3, 1, 4], replicas=np.ones((4, 2), bool)), C0, static_res()
    )
)
case(BC, "certify: problem a list")(lambda: certify([7, 3, 1], C0, static_res()))
case(BC, "certify: result None")(lambda: certify(P0, C0, None))
case(BC, "certify: tau -1")(lambda: certify(P0, C0, static_res(), tau=-1))
case(BC, "certify: tau NaN")(lambda: certify(P0, C0, static_res(), tau=float("nan")))
case(BC, "certify: opt NaN")(lambda: certify(P0, C0, static_res(), opt=float("nan")))
case(BC, "certify: opt negative")(lambda: certify(P0, C0, static_res(), opt=-1.0))


def cert_pair(opt_claim):
    r = static_res()
    true = certify(P0, C0, r, opt=float(solve_dispatch(P0, C0, method="milp").makespan))
    claimed = certify(P0, C0, r, opt=opt_claim)
    return true, claimed


case(
    BC,
    "certify: opt 1000x the optimum (above the result's own makespan)",
    "either",
    lambda v: v[1].holds <= v[0].holds,
)(lambda: cert_pair(3000.0))
case(
    BC,
    "certify: opt below the certified bound (0.001)",
    "either",
    lambda v: v[1].holds <= v[0].holds,
)(lambda: cert_pair(0.001))


def cert_tampered(**over):
    import dataclasses

    r = static_res()
    good = certify(P0, C0, r)
    bad = certify(P0, C0, dataclasses.replace(r, **over))
    return good, bad


case(
    BC,
    "certify: result's makespan replaced by 1/100",
    "either",
    lambda v: not v[1].holds or (v[1].lhs, v[1].rhs) == (v[0].lhs, v[0].rhs),
)(lambda: cert_tampered(makespan=static_res().makespan / 100))
case(
    BC,
    "certify: result's lower_bound replaced by 10**6",
    "either",
    lambda v: not v[1].holds or (v[1].lhs, v[1].rhs) == (v[0].lhs, v[0].rhs),
)(lambda: cert_tampered(lower_bound=1e6))
case(
    BC,
    "certify: result's shares off the replica mask",
    "either",
    lambda v: not v[1].holds or v[1].lhs == v[0].lhs,
)(lambda: cert_tampered(shares=np.array([[0.0, 7.0], [0.0, 3.0], [0.0, 1.0]])))


def cert_other_cost():
    r = solve_dispatch(P0, C0, method="static")
    c2 = CostModel(a=0, b=100, c=0, beta=0.5)
    return certify(P0, c2, r), certify(P0, c2, solve_dispatch(P0, c2, method="static"))


case(
    BC,
    "certify: cost differs from the result's",
    "either",
    lambda v: not v[0].holds or (v[0].lhs, v[0].rhs) == (v[1].lhs, v[1].rhs),
)(cert_other_cost)


def cert_forged(p, **over):
    import dataclasses

    return certify(p, C0, dataclasses.replace(static_res(), **over))


case(
    BC,
    "certify: all-zero shares, makespan 0, lower bound 0 (infeasible)",
    "either",
    lambda c: not c.holds,
)(
    lambda: cert_forged(
        P0, shares=np.zeros((3, 2)), makespan=0.0, lower_bound=0.0, gpu_time=np.zeros(2)
    )
)
case(
    BC,
    "certify: a result of a same-shaped problem with other counts",
    "either",
    lambda c: not c.holds,
)(lambda: cert_forged(DispatchProblem(counts=[1, 30, 1], replicas=[[1, 1], [1, 0], [1, 0]])))
case(
    BC,
    "certify: negative shares summing right",
    "either",
    lambda c: not c.holds,
)(lambda: cert_forged(P0, shares=np.array([[9.0, -2.0], [3.0, 0.0], [1.0, 0.0]])))

# --- (6) extreme numbers ---------------------------------------------------------------------


def ok_result(r):
    ms = np.asarray(r.makespan, float)
    lb = np.asarray(r.lower_bound, float)
    return bool(np.isfinite(ms).all() and np.isfinite(lb).all() and (lb <= ms * (1 + 1e-9)).all())


case(BN, "CostModel a=1e308")(lambda: CostModel(a=1e308, b=1, c=0, beta=1))
case(BN, "CostModel beta=-0.0 solves", "value", lambda r: ok_result(r) and r.makespan >= 0)(
    lambda: solve_dispatch(P0, CostModel(a=0, b=1, c=0, beta=-0.0), method="tempo")
)
case(BN, "CostModel tile=0")(lambda: CostModel(a=0, b=1, c=0, beta=1, tile=0))
case(BN, "CostModel tile=2.5")(lambda: CostModel(a=0, b=1, c=0, beta=1, tile=2.5))
case(BN, "CostModel tile=True")(lambda: CostModel(a=0, b=1, c=0, beta=1, tile=True))
case(BN, "CostModel b='1'")(lambda: CostModel(a=0, b="1", c=0, beta=1))
case(BN, "CostModel gamma=inf")(lambda: CostModel(a=0, b=1, c=0, beta=1, c2=0, gamma=float("inf")))
case(BN, "DispatchProblem counts 2**63")(
    lambda: DispatchProblem(counts=[2**63, 1], replicas=np.ones((2, 2), bool))
)
case(BN, "DispatchProblem counts 1e308")(
    lambda: DispatchProblem(counts=[1e308, 1], replicas=np.ones((2, 2), bool))
)
case(BN, "DispatchProblem counts -0.0 (a zero)", "either", lambda p: p.n_experts == 2)(
    lambda: DispatchProblem(counts=[-0.0, 1], replicas=np.ones((2, 2), bool))
)
case(BN, "DispatchProblem replicas of 2.0")(
    lambda: DispatchProblem(counts=[1, 1], replicas=np.full((2, 2), 2.0))
)

BIGP = lambda: DispatchProblem(counts=[2**52, 2**51, 3], replicas=np.ones((3, 2), bool))  # noqa: E731
HUGEC = CostModel(a=1, b=2**899, c=0, beta=2**899)
for _m in (
    "uniform",
    "static",
    "metro",
    "llep",
    "round_robin",
    "tempo",
    "token_lp",
    "milp",
    "sglang_lp",
    "vllm_ep",
    "lplb",
    "moonep",
):
    isolated(BN, f"solve {_m}: counts 2**52 (refused or solved in memory)", "either", ok_result)(
        lambda m=_m: solve_dispatch(BIGP(), C0, method=m, time_limit=5)
    )
for _m in ("tempo", "milp", "uniform"):
    isolated(
        BN, f"solve {_m}: b=beta=2**899 with counts 2**52 (no inf OPTIMAL)", "either", ok_result
    )(lambda m=_m: solve_dispatch(BIGP(), HUGEC, method=m, time_limit=5))
case(BN, "solve time_limit inf", "either", ok_result)(
    lambda: solve_dispatch(P0, C0, method="milp", time_limit=float("inf"))
)
case(BN, "solve time_limit 1e308", "either", ok_result)(
    lambda: solve_dispatch(P0, C0, method="milp", time_limit=1e308)
)
case(BN, "solve time_limit -0.0")(lambda: solve_dispatch(P0, C0, method="milp", time_limit=-0.0))
case(BN, "solve rng 2**70", "either", ok_result)(
    lambda: solve_dispatch(P0, C0, method="metro", rng=2**70)
)
isolated(BN, "vllm_maps: width 2**40")(lambda: _vmaps(MAP4, 3, width=2**40))
isolated(BN, "DeploymentConfig: n_gpus 2**40")(
    lambda: __import__("straggler.sim", fromlist=["x"]).DeploymentConfig(
        preset="dsv3", n_gpus=2**40
    )
)
case(BN, "DeploymentConfig: replication inf")(
    lambda: __import__("straggler.sim", fromlist=["x"]).DeploymentConfig(
        preset="dsv3", n_gpus=8, replication=float("inf")
    )
)
isolated(BN, "place_experts: num_replicas 2**40")(
    lambda: __import__("straggler.solvers", fromlist=["x"]).place_experts(
        np.ones((2, 1, 4), int), 2**40, 1, 1, 2
    )
)
case(BN, "route_batch: loads 1e308 and inf")(
    lambda: __import__("straggler.solvers", fromlist=["x"]).route_batch(
        [5], [1e308, float("inf")], [1, 1]
    )
)
case(BN, "route_batch: prefill length 2**63")(
    lambda: __import__("straggler.solvers", fromlist=["x"]).route_batch([2**63], [1.0, 2.0], [1, 1])
)
case(BN, "fit_cost_model: t with 1e308")(
    lambda: __import__("straggler.solvers", fromlist=["x"]).fit_cost_model(
        [1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60], [1, 2, 3, 4, 5, 1e308], bootstrap=2
    )
)
case(BN, "window_delta: int64 max minus -1")(
    lambda: window_delta(np.array([2**63 - 1]), np.array([-1]))
)

# --- (7) error names ------------------------------------------------------------------------
_S = __import__("straggler.solvers", fromlist=["x"])
_SIM = __import__("straggler.sim", fromlist=["x"])
H = np.ones((3, 1, 4), int)


FIT = (
    [1, 2, 3, 4, 5, 6, 7, 8],
    [10, 200, 30, 400, 50, 600, 70, 800],
    [3.1, 4.0, 5.2, 7.9, 8.1, 10.3, 11.0, 13.8],
)


def named(area, name, param, fn):
    CASES.append((area, name, "error", fn, param))


named(
    BE,
    "route_batch(loads=[nan, 1])",
    "loads",
    lambda: _S.route_batch([5], [float("nan"), 1.0], [1, 1]),
)
named(
    BE,
    "route_batch(free_slots=[-1, 1])",
    "free_slots",
    lambda: _S.route_batch([5], [1.0, 1.0], [-1, 1]),
)
named(
    BE,
    "route_batch(kv_usage=[-5, 0])",
    "kv_usage",
    lambda: _S.route_batch([5], [1.0, 1.0], [1, 1], kv_usage=[-5, 0], kv_capacity=[100, 100]),
)
named(
    BE,
    "route_batch(kv_capacity=[-1, 1])",
    "kv_capacity",
    lambda: _S.route_batch([5], [1.0, 1.0], [1, 1], kv_usage=[0, 0], kv_capacity=[-1, 1]),
)
named(
    BE,
    "route_batch(n_waiting=[1.5, 0])",
    "n_waiting",
    lambda: _S.route_batch([5], [1.0, 1.0], [1, 1], n_waiting=[1.5, 0]),
)
named(
    BE,
    "route_batch(prefill_lengths=[-3])",
    "prefill_lengths",
    lambda: _S.route_batch([-3], [1.0, 1.0], [1, 1]),
)
named(
    BE,
    "route_batch(policy='nope')",
    "policy",
    lambda: _S.route_batch([5], [1.0, 1.0], [1, 1], policy="nope"),
)
named(
    BE,
    "solve_dispatch(method='milp', time_limit=nan)",
    "time_limit",
    lambda: solve_dispatch(P0, C0, method="milp", time_limit=float("nan")),
)
named(BE, "solve_dispatch(method='nope')", "method", lambda: solve_dispatch(P0, C0, method="nope"))
named(BE, "solve_dispatch(rng='x')", "rng", lambda: solve_dispatch(P0, C0, method="metro", rng="x"))
named(
    BE,
    "solve_dispatch(method='tempo', bogus=1)",
    "bogus",
    lambda: solve_dispatch(P0, C0, method="tempo", bogus=1),
)
named(
    BE,
    "fit_cost_model(pieces=0)",
    "pieces",
    lambda: _S.fit_cost_model(*FIT, pieces=0),
)
named(
    BE,
    "fit_cost_model(level=1.5)",
    "level",
    lambda: _S.fit_cost_model(*FIT, level=1.5),
)
named(
    BE,
    "fit_cost_model(bootstrap=-1)",
    "bootstrap",
    lambda: _S.fit_cost_model(*FIT, bootstrap=-1),
)
named(
    BE,
    "fit_cost_model(meta='x')",
    "meta",
    lambda: _S.fit_cost_model(*FIT, meta="x"),
)
named(
    BE,
    "fit_cost_model(T=[0, 0, 0]) (T < G)",
    "T",
    lambda: _S.fit_cost_model(*FIT, T=[0, 0, 0]),
)
named(
    BE,
    "rebalance_frontier(budgets=[-1])",
    "budgets",
    lambda: _SIM.rebalance_frontier(H, [[0, 1, 2, 3]], 4, 1, 1, 2, budgets=[-1]),
)
named(
    BE,
    "rebalance_frontier(n_samples=0)",
    "n_samples",
    lambda: _SIM.rebalance_frontier(H, [[0, 1, 2, 3]], 4, 1, 1, 2, n_samples=0),
)
named(
    BE,
    "rebalance_frontier(previous 3 slots for 4)",
    "previous",
    lambda: _SIM.rebalance_frontier(H, [[0, 1, 2]], 4, 1, 1, 2),
)
named(
    BE,
    "rebalance_frontier(cost='nope')",
    "cost",
    lambda: _SIM.rebalance_frontier(H, [[0, 1, 2, 3]], 4, 1, 1, 2, cost="nope"),
)
named(
    BE,
    "place_experts(max_moves=-1)",
    "max_moves",
    lambda: _S.place_experts(H, 4, 1, 1, 2, previous=[[0, 1, 2, 3]], max_moves=-1),
)
named(
    BE,
    "place_experts(move_cost=nan)",
    "move_cost",
    lambda: _S.place_experts(H, 4, 1, 1, 2, previous=[[0, 1, 2, 3]], move_cost=float("nan")),
)
named(
    BE,
    "place_experts(n_samples=0)",
    "n_samples",
    lambda: _S.place_experts(H, 4, 1, 1, 2, n_samples=0),
)
named(
    BE,
    "place_experts(history 4-D)",
    "history",
    lambda: _S.place_experts(np.ones((3, 1, 1, 4), int), 4, 1, 1, 2),
)
named(
    BE,
    "DeploymentConfig(n_gpus=0)",
    "n_gpus",
    lambda: _SIM.DeploymentConfig(preset="dsv3", n_gpus=0),
)
named(
    BE,
    "DeploymentConfig(kappa=-1)",
    "kappa",
    lambda: _SIM.DeploymentConfig(preset="dsv3", n_gpus=8, kappa=-1),
)
named(
    BE,
    "DeploymentConfig(drift=nan)",
    "drift",
    lambda: _SIM.DeploymentConfig(preset="dsv3", n_gpus=8, drift=float("nan")),
)
named(
    BE,
    "DeploymentConfig(placement_period=0)",
    "placement_period",
    lambda: _SIM.DeploymentConfig(preset="dsv3", n_gpus=8, placement_period=0),
)
named(BE, "CostModel(c2=1) without gamma", "gamma", lambda: CostModel(a=0, b=1, c=0, beta=1, c2=1))
named(
    BE,
    "DispatchProblem(gpu_node of 1 for 2 GPUs)",
    "gpu_node",
    lambda: DispatchProblem(counts=[1, 1], replicas=np.ones((2, 2), bool), gpu_node=[0]),
)
named(BE, "sweep(func=5)", "func", lambda: sweep(5, {"x": [1]}, backend="serial", progress=False))
named(
    BE,
    "load_trace(rate=-1) on a lengths file",
    "rate",
    lambda: _SIM.load_trace(jfile("len.csv", "input_length,output_length\n10,2\n"), rate=-1),
)
named(
    BE,
    "load_prefix_blocks(block_tokens=0)",
    "block_tokens",
    lambda: _SIM.load_prefix_blocks(
        jfile("mc.jsonl", '{"timestamp": 0, "hash_ids": [1]}\n'), block_tokens=0
    ),
)
named(
    BE,
    "read_trtllm_statistics(n_experts=0)",
    "n_experts",
    lambda: read_trtllm_statistics((lambda d: (trt_write(d, 1), d)[1])(bdir()), n_experts=0),
)
named(
    BE,
    "read_trtllm_statistics(iter_start='a')",
    "iter_start",
    lambda: read_trtllm_statistics((lambda d: (trt_write(d, 1), d)[1])(bdir()), iter_start="a"),
)
named(BE, "vllm_maps(width=0)", "width", lambda: _vmaps(MAP4, 3, width=0))
named(
    BE,
    "write_moe_load_balancer(layer_updates_per_iter=1.5)",
    "layer_updates_per_iter",
    lambda: write_moe_load_balancer(bdir() / "m.yaml", [[0, 1]], layer_updates_per_iter=1.5),
)
named(
    BE,
    "write_trtllm_statistics(top_k='2')",
    "top_k",
    lambda: write_trtllm_statistics(bdir(), np.ones((1, 1, 1, 2), int), layer_ids=[0], top_k="2"),
)
named(
    BE,
    "warmup(methods=['nope'])",
    "methods",
    lambda: __import__("straggler.runtime", fromlist=["x"]).warmup(
        methods=["nope"], routing=False, simulator=False
    ),
)
named(
    BE,
    "warmup(jobs=0)",
    "jobs",
    lambda: __import__("straggler.runtime", fromlist=["x"]).warmup(
        jobs=0, dispatch=False, routing=False, simulator=False
    ),
)
named(BE, "read_engine_log(format='nope')", "format", lambda: read_engine_log(LOG, format="nope"))

# --- (8) commands, each run as a subprocess -----------------------------------------------
XLOG = jfile("bstat.json", {"logical_count": [[[5, 1, 0, 2]], [[3, 3, 1, 0]]], "rank": 0})
WD = TMP / "b" / "cwd"
WD.mkdir(parents=True, exist_ok=True)
XDIR = TMP / "b" / "outdir"
XDIR.mkdir(parents=True, exist_ok=True)
XFIFO = TMP / "b" / "out.fifo"
os.mkfifo(XFIFO)
BX_CMDS = [
    ("simulate", ["bursty", "--requests", "5", "--policies", ""]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq,jsq"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--replicas", "0"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--replicas", "nan"]),
    ("simulate", ["bursty", "--requests", "-1", "--policies", "jsq"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--max-slots", "0"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--ctx-cost", "nan"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--json", str(XDIR)]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--json", "/proc/nope/x.json"]),
    ("simulate", ["bursty", "--requests", "5", "--policies", "jsq", "--plot", str(XDIR)]),
    ("simulate", [str(XFIFO), "--requests", "5", "--policies", "jsq"]),
    ("simulate", ["bursty", "--moe", "dsv3", "--ep", "8", "--dispatches", ","]),
    ("simulate", ["bursty", "--moe", "dsv3", "--ep", "8", "--placements", ""]),
    ("simulate", ["bursty", "--moe", "dsv3", "--ep", "0"]),
    ("simulate", ["bursty", "--moe", "dsv3", "--ep", "8", "--layers", "-2"]),
    ("simulate", ["bursty", "--moe", "dsv3", "--ep", "8", "--table-period", "nan"]),
    ("simulate", ["bursty", "--moe", "nope"]),
    ("plan", [XLOG, "--gpus", "0"]),
    ("plan", [XLOG, "--gpus", "nan"]),
    ("plan", [XLOG, "--gpus", "2", "--slots", "0"]),
    ("plan", [XLOG, "--gpus", "2", "--groups", "0"]),
    ("plan", [XLOG, "--gpus", "2", "--worst", "-1"]),
    ("plan", [XLOG, "--gpus", "2", "--max-moves", "-1"]),
    ("plan", [XLOG, "--gpus", "2", "--previous", "/nonexistent/p.json"]),
    ("plan", [XLOG, "--gpus", "2", "--holdout", "1"]),
    ("plan", [XLOG, "--gpus", "2", "--out", str(XFIFO)]),
    ("plan", [str(XFIFO), "--gpus", "2"]),
    ("plan", ["sample:nope", "--gpus", "2"]),
    ("compare", ["--methods", ""]),
    ("compare", ["--methods", ","]),
    ("compare", ["--methods", "uniform,uniform"]),
    ("compare", ["--gpus", "0", "--methods", "uniform"]),
    ("compare", ["--gpus", "-8", "--methods", "uniform"]),
    ("compare", ["--nodes", "0", "--methods", "uniform"]),
    ("compare", ["--replication", "nan", "--methods", "uniform"]),
    ("compare", ["--layers", "1000000000", "--methods", "uniform"]),
    ("compare", ["--tokens-per-gpu", "1e308", "--methods", "uniform"]),
    ("warmup", ["--methods", "", "--no-routing", "--no-simulator"]),
    ("warmup", ["--methods", ",", "--no-routing", "--no-simulator"]),
    ("warmup", ["--methods", "static,static", "--no-routing", "--no-simulator"]),
    ("warmup", ["--methods", "nope", "--no-routing", "--no-simulator"]),
    ("warmup", ["--policies", "", "--no-dispatch", "--no-simulator"]),
    ("warmup", ["--jobs", "0", "--no-dispatch", "--no-routing", "--no-simulator"]),
    ("warmup", ["--jobs", "-1", "--no-dispatch", "--no-routing", "--no-simulator"]),
    ("warmup", ["--jobs", "auto,", "--no-dispatch", "--no-routing", "--no-simulator"]),
    ("warmup", ["--child-steps", "foo", "--no-dispatch", "--no-routing", "--no-simulator"]),
    ("warmup", ["--parent", "-5", "--no-dispatch", "--no-routing", "--no-simulator"]),
]


def shown(a):
    return repr(a) if a in ("", ",") else a.replace(str(TMP), "$TMP")


for _cmd, _argv in BX_CMDS:
    CASES.append(
        (
            BX,
            f"straggler-{_cmd} {' '.join(shown(a) for a in _argv)}",
            "cmd",
            (_cmd, _argv),
            None,
        )
    )


class Hang(BaseException):
    """Raised by the alarm: not an ``Exception``, so no library ``except`` swallows it."""


def _alarm(signum, frame):
    raise Hang


def judge(want, fn, check):
    """(outcome, detail) of a library call."""
    try:
        value = fn()
    except InvalidInputError as exc:
        if want in ("error", "either"):
            if isinstance(check, str) and want == "error" and check not in str(exc):
                return "misnamed", f"does not name {check!r}: {str(exc)[:200]}"
            return "ok", str(exc)[:200]
        return "refused", str(exc)[:200]
    except Exception as exc:  # noqa: BLE001 - a raw error is what this counts
        return "raw", f"{type(exc).__name__}: {str(exc)[:200]}"
    if want == "error":
        return "silent", repr(value)[:200]
    try:
        good = check(value) if callable(check) else True
    except Exception as exc:  # noqa: BLE001 - a value the check cannot read is wrong
        good = False
        return "silent", f"check failed ({type(exc).__name__}: {exc}) on {repr(value)[:120]}"
    return ("ok" if good else "silent"), repr(value)[:200]


def judge_forked(want, fn, check):
    """judge in a forked child with a memory limit; killed (``hang``) at ``TIMEOUT``."""
    import resource
    import select
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
            res = judge(want, fn, check)
        except BaseException as exc:  # noqa: BLE001
            res = ("raw", f"{type(exc).__name__}: {str(exc)[:200]}")
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], TIMEOUT)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        return "hang", f"no answer in {TIMEOUT:g} s (child killed)"
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not data:
        return "raw", f"the child died (wait status {status}): out of memory or a signal"
    return tuple(json.loads(data))


def snapshot(paths):
    out = []
    for p in paths:
        for root, _dirs, files in os.walk(p):
            for n in sorted(files):
                q = os.path.join(root, n)
                st = os.lstat(q)
                out.append((q, st.st_size, st.st_mtime_ns))
    return out


def judge_command(cmd, argv):
    """Run ``straggler-<cmd> argv`` as a subprocess in an empty folder: exit 2, one
    ``error:`` line, no traceback, nothing written (the folder and ``$TMP/b`` unchanged)."""
    import subprocess

    code = (
        f"import sys; from straggler.runtime.commands.{cmd} import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    watch = [str(WD), str(TMP / "b" / "outdir")]
    before = snapshot(watch)
    try:
        p = subprocess.run(
            [sys.executable, "-c", code, *argv],
            cwd=WD,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return "hang", f"no exit in {TIMEOUT:g} s"
    err = p.stderr
    lines = [x for x in err.splitlines() if x.strip()]
    errors = [x for x in lines if "error:" in x]
    if "Traceback" in err or p.returncode not in (0, 2):
        return "traceback", f"exit {p.returncode}: {err[-300:]!r}"
    if p.returncode == 0:
        return "silent", "exit 0 for an invalid invocation"
    if snapshot(watch) != before:
        return "silent", f"exit 2 but wrote files: {errors[:1]}"
    if len(errors) != 1 or len([x for x in lines if not x.startswith("usage:")]) > 1:
        return "noisy", f"exit 2 but {len(lines)} stderr lines: {err[-300:]!r}"
    return "ok", errors[0][:200]


def run_one(area, name, want, fn, check):
    import signal

    if want == "cmd":
        return judge_command(*fn)
    if id(fn) in ISOLATED:
        return judge_forked(want, fn, check)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT)
    try:
        if want != "exit2":
            return judge(want, fn, check)
        cmd, argv = fn
        out_before = sorted(os.listdir(TMP / "files"))
        try:
            rc, err = run_cli(cmd, argv)
        except Hang:
            raise
        except BaseException as exc:  # noqa: BLE001 - anything escaping is a traceback
            rc, err = None, "".join(traceback.format_exception(exc))
        errors = [x for x in err.splitlines() if "error:" in x]
        if "Traceback" in err or rc not in (0, 2):
            return "traceback", err[-300:]
        if rc == 2 and len(errors) == 1 and sorted(os.listdir(TMP / "files")) == out_before:
            return "ok", errors[0][:200]
        if rc == 0:
            return "silent", "exit 0 for an invalid invocation"
        return "traceback", err[-300:]
    except Hang:
        return "hang", f"no answer in {TIMEOUT:g} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run(only=None):
    results = []
    for area, name, want, fn, check in CASES:
        if only and not area.startswith(only):
            continue
        t0 = time.perf_counter()
        outcome, detail = run_one(area, name, want, fn, check)
        results.append(
            dict(
                area=area,
                case=name,
                want=want,
                outcome=outcome,
                detail=detail,
                seconds=round(time.perf_counter() - t0, 3),
            )
        )
    return results


def main():
    import warnings

    warnings.simplefilter("ignore")  # torch's prototype and deprecation notices
    results = run(os.environ.get("ADVERSARIAL_ONLY"))
    areas = sorted({r["area"] for r in results})
    kinds = ("ok", "silent", "traceback", "raw", "refused", "hang", "misnamed", "noisy")
    print(f"{'area':10s} " + " ".join(f"{k:>9s}" for k in kinds) + "    total")
    for a in areas + ["all"]:
        rs = [r for r in results if a in ("all", r["area"])]
        print(
            f"{a:10s} "
            + " ".join(f"{sum(r['outcome'] == k for r in rs):9d}" for k in kinds)
            + f" {len(rs):8d}"
        )
    for r in results:
        if r["outcome"] != "ok":
            print(f"  {r['outcome']:9s} {r['area']}: {r['case']}: {r['detail']}")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"cases": results, "python": sys.version.split()[0]}, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
