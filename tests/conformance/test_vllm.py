"""vLLM CPU 0.32.0: its replica rule, its map builder and a real ``EplbState`` on the CPU.

vLLM's replica choice is a Triton kernel (``_eplb_map_and_record_i32_kernel`` in
``vllm/model_executor/layers/fused_moe/router/base_router.py``) that the module defines
only on CUDA-like platforms, and ``vllm.triton_utils`` disables Triton on the CPU. The test
executes that file's own source with ``current_platform.is_cuda_alike`` answering True and
the real ``triton`` in place, under ``TRITON_INTERPRET=1``, so vLLM's kernel runs on CPU
tensors unchanged. ``ParallelConfig`` refuses ``enable_eplb`` on the CPU, so the
``EplbState`` is built from a config without it and given its model states as
``EplbState.add_model`` lays them out (``compute_logical_maps``, 1024-wide maps).
"""

import importlib.util
import os
import sys

import numpy as np
import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from straggler.baselines.dispatch.vllm_ep import vllm_replica_choice  # noqa: E402
from straggler.runtime.engines import (  # noqa: E402
    VLLM_DUMP_FORMAT,
    VLLM_MAP_WIDTH,
    dump_vllm_eplb_state,
    read_vllm_state,
    vllm_maps,
    write_vllm_state,
)
from vllm.config import ParallelConfig  # noqa: E402
from vllm.distributed.eplb import eplb_state as es  # noqa: E402

L, E, P, TOP_K = 3, 8, 12, 2


@pytest.fixture(scope="module")
def vllm_kernel():
    """``eplb_map_to_physical_and_record`` of vLLM's base_router.py, defined as on CUDA."""
    import triton
    import triton.language as tl
    import vllm.model_executor.layers.fused_moe.router.base_router as br
    import vllm.triton_utils as tu
    from triton.runtime import interpreter
    from vllm.platforms import current_platform

    # Triton's interpreter (3.9) hands atomic_rmw the int32 of a scalar comparison as the
    # mask and then refuses it; the mask's truth values are what the GPU uses
    rmw = interpreter.InterpreterBuilder.create_atomic_rmw

    def bool_mask_rmw(self, op, ptr, val, mask, sem, scope):
        mask = interpreter.TensorHandle(mask.data.astype(bool), tl.int1)
        return rmw(self, op, ptr, val, mask, sem, scope)

    interpreter.InterpreterBuilder.create_atomic_rmw = bool_mask_rmw
    saved = (os.environ.get("TRITON_INTERPRET"), tu.triton, tu.tl)
    os.environ["TRITON_INTERPRET"] = "1"
    tu.triton, tu.tl = triton, tl
    current_platform.is_cuda_alike = lambda: True
    try:
        spec = importlib.util.spec_from_file_location("_vllm_base_router_cuda", br.__file__)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    finally:
        del current_platform.is_cuda_alike
        tu.triton, tu.tl = saved[1], saved[2]
    yield mod.eplb_map_to_physical_and_record
    interpreter.InterpreterBuilder.create_atomic_rmw = rmw
    if saved[0] is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = saved[0]


def _p2l(rng):
    return np.stack(
        [
            rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, P - E)]))
            for _ in range(L)
        ]
    )


def test_vllm_maps_equal_compute_logical_maps():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p2l = _p2l(rng)
        l2p, cnt = es.compute_logical_maps(torch.tensor(p2l), E)
        ours = vllm_maps(p2l, E)
        assert ours["logical_to_physical_map"].shape == (L, E, VLLM_MAP_WIDTH)
        np.testing.assert_array_equal(ours["logical_to_physical_map"][..., : l2p.shape[-1]], l2p)
        np.testing.assert_array_equal(ours["logical_replica_count"], cnt)


def test_hash_rule_equals_vllms_kernel(vllm_kernel):
    rng = np.random.default_rng(1)
    for case in range(30):
        p2l = _p2l(rng)[0]
        maps = vllm_maps(p2l[None], E)
        l2p = torch.tensor(maps["logical_to_physical_map"][0])
        cnt = torch.tensor(maps["logical_replica_count"][0])
        n_tok = int(rng.integers(1, 200))
        topk = np.stack([rng.choice(E, TOP_K, replace=False) for _ in range(n_tok)])
        load = torch.zeros(P, dtype=torch.int32)
        got = vllm_kernel(
            torch.tensor(topk, dtype=torch.int32),
            load,
            l2p,
            cnt,
            torch.tensor(True),
            torch.tensor(n_tok, dtype=torch.int32),  # what the router passes (no padding)
        )
        want = vllm_replica_choice(topk, np.zeros(n_tok, int), l2p.numpy(), version="hash")
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"case {case}")
        np.testing.assert_array_equal(load.numpy(), np.bincount(want.ravel(), minlength=P))


def _model_state(p2l, window, name):
    maps = vllm_maps(p2l, E)
    t = {k: torch.tensor(v) for k, v in maps.items()}
    return es.EplbModelState(
        physical_to_logical_map=t["physical_to_logical_map"],
        physical_to_logical_map_buffer=t["physical_to_logical_map"],
        logical_to_physical_map=t["logical_to_physical_map"],
        logical_replica_count=t["logical_replica_count"],
        expert_load_pass=torch.zeros((L, P), dtype=torch.int32),
        expert_load_pass_buffer=torch.zeros((L, P), dtype=torch.int32),
        expert_load_window=torch.zeros((window, L, P), dtype=torch.int32),
        last_expert_load=torch.ones((L, E), dtype=torch.int64),
        model_name=name,
        model=None,
        expert_buffer=[],
        rebalanced=False,
        eplb_stats=None,
        device_index=None,
        communicator=None,
    )


def test_dump_hook_on_a_live_eplb_state(tmp_path, vllm_kernel):
    """Two DP ranks with the default (gathering) all-to-all: each routes every token, so
    the summed window is dp_size times the truth; a drafter is a second model state."""
    rng = np.random.default_rng(2)
    pc = ParallelConfig(data_parallel_size=2)
    assert pc.all2all_backend == "allgather_reducescatter"
    window, steps = 8, 11  # the window wraps
    truth = {0: np.zeros((steps, L, E), np.int64), 1: np.zeros((steps, L, E), np.int64)}
    p2l = {0: _p2l(rng), 1: _p2l(rng)}
    states = []
    for _rank in range(2):
        st = es.EplbState(pc, torch.device("cpu"))
        st.expert_load_window_size = window
        st.model_states = {
            f"h{m}": _model_state(p2l[m], window, ["main", "drafter"][m]) for m in (0, 1)
        }
        states.append(st)
    for step in range(steps):
        batch = {
            m: [np.stack([rng.choice(E, TOP_K, False) for _ in range(9)]) for _ in range(L)]
            for m in (0, 1)
        }
        for st in states:  # every rank routes the gathered batch (vLLM's router, recording)
            for m, ms in enumerate(st.model_states.values()):
                for layer in range(L):
                    vllm_kernel(
                        torch.tensor(batch[m][layer], dtype=torch.int32),
                        ms.expert_load_pass[layer],
                        ms.logical_to_physical_map[layer],
                        ms.logical_replica_count[layer],
                        torch.tensor(True),
                        torch.tensor(9, dtype=torch.int32),
                    )
            # EplbState.step's window update (the part that needs no process group)
            for ms in st.model_states.values():
                ms.expert_load_window[st.expert_load_window_step].copy_(ms.expert_load_pass)
                ms.expert_load_pass.zero_()
            st.expert_load_window_step = (st.expert_load_window_step + 1) % window
        for m in (0, 1):
            for layer in range(L):
                truth[m][step, layer] = np.bincount(batch[m][layer].ravel(), minlength=E)
    files = []
    for rank, st in enumerate(states):
        files += dump_vllm_eplb_state(st, tmp_path, rank=rank)
    assert sorted(os.path.basename(f) for f in files) == [
        "eplb_m0_rank0.pt",
        "eplb_m0_rank1.pt",
        "eplb_m1_rank0.pt",
        "eplb_m1_rank1.pt",
    ]
    for m in (0, 1):
        log = read_vllm_state(tmp_path, model=m)
        assert log.n_ranks == 2 and log.extras["load_divisor"] == 2
        np.testing.assert_array_equal(log.counts, truth[m][steps - window :])
        np.testing.assert_array_equal(log.physical_to_logical, p2l[m])
    assert torch.load(files[0], weights_only=True)["format"] == VLLM_DUMP_FORMAT


def test_our_placement_loaded_by_vllms_commit(tmp_path):
    """A placement file we write, committed into a model state by vLLM's own code
    (``_commit_eplb_maps``, what a rearrangement runs), gives vLLM the maps we expect."""
    rng = np.random.default_rng(3)
    p2l = _p2l(rng)
    path = write_vllm_state(tmp_path / "eplb_state.json", vllm_maps(p2l, E, width=None))
    loaded = read_vllm_state(path)
    ms = _model_state(np.tile(np.arange(P) % E, (L, 1)), 4, "main")
    es._commit_eplb_maps(ms, torch.tensor(loaded.physical_to_logical))
    want = vllm_maps(p2l, E)
    for k, v in want.items():
        np.testing.assert_array_equal(getattr(ms, k).numpy(), v, err_msg=k)
