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
* ``refused``: a valid call was refused.

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


def run():
    results = []
    for area, name, want, fn, check in CASES:
        t0 = time.perf_counter()
        detail = ""
        if want == "exit2":
            cmd, argv = fn
            out_before = sorted(os.listdir(TMP / "files"))
            try:
                rc, err = run_cli(cmd, argv)
            except BaseException as exc:  # noqa: BLE001 - anything escaping is a traceback
                rc, err = None, "".join(traceback.format_exception(exc))
            errors = [x for x in err.splitlines() if "error:" in x]
            if "Traceback" in err or rc not in (0, 2):
                outcome, detail = "traceback", err[-300:]
            elif rc == 2 and len(errors) == 1 and sorted(os.listdir(TMP / "files")) == out_before:
                outcome, detail = "ok", errors[0][:200]
            elif rc == 0:
                outcome, detail = "silent", "exit 0 for an invalid invocation"
            else:
                outcome, detail = "traceback", err[-300:]
        else:
            try:
                value = fn()
            except InvalidInputError as exc:
                outcome = "ok" if want == "error" else "refused"
                detail = str(exc)[:200]
            except Exception as exc:  # noqa: BLE001 - a raw error is what this counts
                outcome, detail = "raw", f"{type(exc).__name__}: {str(exc)[:200]}"
            else:
                if want == "error":
                    outcome, detail = "silent", repr(value)[:200]
                else:
                    good = check(value) if check else True
                    outcome = "ok" if good else "silent"
                    detail = repr(value)[:120]
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
    results = run()
    areas = sorted({r["area"] for r in results})
    kinds = ("ok", "silent", "traceback", "raw", "refused")
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
