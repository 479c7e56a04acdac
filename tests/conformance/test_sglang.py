"""SGLang 0.5.23 on the CPU: its ``ExpertLocationMetadata`` decides the columns of our ``lp``
tables, and its own solver registry serves them through :class:`TableSolver`.

SGLang is configured as a server would be (``ServerArgs`` for a DeepSeek-V3-shaped model
directory holding only ``config.json``, ``publish``, ``ModelConfig``), then its metadata is
built with ``init_by_mapping`` and ``init_by_eplb``.
"""

import json

import numpy as np
import pytest
from straggler.formulations import DispatchProblem, InvalidInputError

pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from sglang.srt import runtime_context as rc  # noqa: E402
from sglang.srt.eplb import expert_location as el  # noqa: E402
from sglang.srt.eplb.expert_location_dispatch import (  # noqa: E402
    ExpertLocationDispatchInfo,
    topk_ids_logical_to_physical,
)
from sglang.srt.eplb.lplb_solver import get_global_lplb_solver  # noqa: E402
from straggler.runtime import TablePublisher, TableSolver, install_table_solvers  # noqa: E402
from straggler.runtime.converters import (  # noqa: E402
    sglang_logical_to_all_physical,
    to_sglang_lp,
)

N_LAYERS, N_EXPERTS, N_REDUNDANT, EP = 4, 16, 8, 4
P = N_EXPERTS + N_REDUNDANT
CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": N_LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": N_EXPERTS,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-6,
    "routed_scaling_factor": 1.0,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def model_config(tmp_path_factory):
    """SGLang configured for lp dispatch on 4 EP ranks with an all-to-all backend."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    d = tmp_path_factory.mktemp("dsv3_shape")
    (d / "config.json").write_text(json.dumps(CONFIG))
    sa = ServerArgs(
        model_path=str(d),
        device="cpu",
        tp_size=EP,
        ep_size=EP,
        ep_num_redundant_experts=N_REDUNDANT,
        ep_dispatch_algorithm="lp",
        moe_a2a_backend="deepep",
        skip_tokenizer_init=True,
    )
    rc.publish(sa, role="scheduler")
    yield ModelConfig.from_server_args(sa)
    rc.reset_context()


def _placement(seed):
    rng = np.random.default_rng(seed)
    rows = [
        rng.permutation(np.concatenate([np.arange(N_EXPERTS), rng.integers(0, N_EXPERTS, 8)]))
        for _ in range(N_LAYERS)
    ]
    return np.array(rows)


def _tables(p2l, seed):
    """Our (log2phy, probs) for a placement: random shares through to_tables."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 50, size=(N_LAYERS, N_EXPERTS))
    problem = DispatchProblem.from_placement(counts, p2l, n_gpus=EP)
    shares = rng.random((N_LAYERS, N_EXPERTS, EP)) * problem.replicas
    l2p, _, probs = problem.to_tables(shares, p2l)
    return l2p, probs


def _check_columns(out, engine_map, l2p, probs):
    """Every probability sits on the slot the engine's map names in that column."""
    assert out.shape == engine_map.shape == (N_LAYERS, N_EXPERTS, P) and out.dtype == np.float32
    for layer in range(N_LAYERS):
        for e in range(N_EXPERTS):
            ours = l2p[layer, e] >= 0
            total = probs[layer, e, ours].sum()
            for c, slot in enumerate(engine_map[layer, e]):
                if slot < 0:
                    assert out[layer, e, c] == 0
                    continue
                j = int(np.flatnonzero(l2p[layer, e] == slot)[0])
                assert out[layer, e, c] == pytest.approx(probs[layer, e, j] / total, abs=1e-6)


def test_rebuilt_map_equals_init_by_mapping(model_config):
    for seed in range(3):
        p2l = _placement(seed)
        md = el.ExpertLocationMetadata.init_by_mapping(model_config, torch.tensor(p2l))
        engine_map = md.logical_to_all_physical_map.numpy()
        assert np.array_equal(sglang_logical_to_all_physical(p2l, N_EXPERTS), engine_map)
        l2p, probs = _tables(p2l, seed)
        out = to_sglang_lp(l2p, probs, physical_to_logical=p2l)
        _check_columns(out, engine_map, l2p, probs)
        assert np.array_equal(out, to_sglang_lp(l2p, probs, md.logical_to_all_physical_map))


def test_tables_follow_the_replica_rank_order_of_init_by_eplb(model_config):
    rng = np.random.default_rng(7)
    counts = rng.zipf(1.5, size=(3, N_LAYERS, N_EXPERTS)).clip(max=500)
    md = el.ExpertLocationMetadata.init_by_eplb(model_config, logical_count=torch.tensor(counts))
    engine_map = md.logical_to_all_physical_map.numpy()
    p2l = md.physical_to_logical_map.numpy()
    # EPLB lists replicas by replica rank: the sorted (init_by_mapping) order differs somewhere
    assert not np.array_equal(engine_map, sglang_logical_to_all_physical(p2l, N_EXPERTS))
    l2p, probs = _tables(p2l, 1)
    _check_columns(to_sglang_lp(l2p, probs, md.logical_to_all_physical_map), engine_map, l2p, probs)


def test_rank_local_rewrite_needs_the_engine_map(model_config):
    p2l = _placement(5)
    md = el.ExpertLocationMetadata.init_by_mapping(model_config, torch.tensor(p2l), moe_ep_rank=1)
    engine_map = md.logical_to_all_physical_map.numpy()
    local = (engine_map >= 0).sum(axis=-1) == 1
    assert local.any()  # experts with a replica on rank 1 keep only that slot
    l2p, probs = _tables(p2l, 5)
    # mass on a replica the rank's map dropped cannot be placed
    with pytest.raises(InvalidInputError, match="missing"):
        to_sglang_lp(l2p, probs, md.logical_to_all_physical_map)
    # a table with all mass on the listed slot converts, in the engine's columns
    keep = np.zeros_like(probs)
    for layer, e in zip(*np.nonzero(local)):
        keep[layer, e, l2p[layer, e] == engine_map[layer, e, 0]] = 1.0
    for layer, e in zip(*np.nonzero(~local)):
        keep[layer, e] = probs[layer, e]
    _check_columns(to_sglang_lp(l2p, keep, md.logical_to_all_physical_map), engine_map, l2p, keep)


def test_table_solver_installed_with_sglangs_setter(model_config):
    p2l = _placement(9)
    md = el.ExpertLocationMetadata.init_by_mapping(model_config, torch.tensor(p2l))
    el.set_global_expert_location_metadata(md, allow_overwrite=True)
    publisher = TablePublisher(md.logical_to_all_physical_map, device="cpu")
    solvers = install_table_solvers(publisher)
    l2p, probs = _tables(p2l, 9)
    publisher.publish(to_sglang_lp(l2p, probs, md.logical_to_all_physical_map))
    topk = torch.randint(0, N_EXPERTS, (5, 4), dtype=torch.int32)
    for layer in range(N_LAYERS):
        solver = get_global_lplb_solver(layer)
        assert solver is solvers[layer] and isinstance(solver, TableSolver)
        table = solver.solve(topk)
        assert table.data_ptr() == publisher.probs[layer].data_ptr()  # the live tensor
        assert table.shape == (solver.num_logical, solver.max_copies) == (N_EXPERTS, P)
        # an idle rank's call (TopK.empty_topk_output) gets the same table
        empty = torch.empty((0, 4), dtype=torch.int32)
        assert torch.equal(solver.solve(empty), table)
        # the dispatch info SGLang builds for the layer reads the same columns
        info = ExpertLocationDispatchInfo.init_new(layer)
        assert info.ep_dispatch_algorithm == "lp"
        assert torch.equal(info.partial_logical_to_all_physical_map, publisher.log2phy[layer])
        # SGLang's lp dispatch itself is a CUDA kernel: on the CPU it stops there
        with pytest.raises(RuntimeError, match="CUDA"):
            topk_ids_logical_to_physical(topk, info, table)
    _check_columns(publisher.snapshot(), md.logical_to_all_physical_map.numpy(), l2p, probs)
    # a publisher on other columns is refused
    other = TablePublisher(sglang_logical_to_all_physical(_placement(10), N_EXPERTS), device="cpu")
    with pytest.raises(InvalidInputError, match="logical_to_all_physical_map"):
        install_table_solvers(other)


def test_our_init_location_files_loaded_by_sglang(model_config, tmp_path):
    """``--init-expert-location`` files we write, read by SGLang's
    ``compute_initial_expert_location_metadata`` (mapping: as is; logical_count: placed by
    SGLang's EPLB)."""
    from straggler.runtime.engines import write_sglang_init_location, write_sglang_stat_dump

    p2l = _placement(11)
    for name in ("init.json", "init.pt"):
        path = write_sglang_init_location(tmp_path / name, physical_to_logical=p2l)
        with rc.get_exec().moe.override(init_expert_location=str(path)):
            md = el.compute_initial_expert_location_metadata(model_config, moe_ep_rank=0)
        np.testing.assert_array_equal(md.physical_to_logical_map.numpy(), p2l)
    counts = np.random.default_rng(12).integers(0, 90, size=(5, N_LAYERS, N_EXPERTS))
    stat = write_sglang_stat_dump(tmp_path / "rec", counts, timestamp=1.0)
    with rc.get_exec().moe.override(init_expert_location=stat):
        md = el.compute_initial_expert_location_metadata(model_config, moe_ep_rank=0)
    want = el.ExpertLocationMetadata.init_by_eplb(model_config, logical_count=torch.tensor(counts))
    assert torch.equal(md.physical_to_logical_map, want.physical_to_logical_map)


def test_our_reader_equals_sglangs_simulator_reader(tmp_path):
    """Per-pass dumps of 4 ranks: our reader's counts equal SGLang's
    ``eplb_simulator/reader.read_mode_per_pass`` folded by its
    ``_convert_global_physical_count_to_logical_count``."""
    from sglang.srt.eplb.eplb_simulator import reader
    from straggler.proofs.engine_strategies import synthetic_recording
    from straggler.runtime.engines import read_sglang_recorder, write_sglang_detail_dump

    rec = synthetic_recording(n_passes=7, seed=13)
    p2l = rec["maps"][0][1]
    for rank in range(rec["physical_counts"].shape[0]):
        records = [
            {"forward_pass_id": i, "global_physical_count": rec["physical_counts"][rank, i]}
            for i in range(7)
        ]
        write_sglang_detail_dump(tmp_path, records, p2l, rank=rank, timestamp=2.0)
    theirs = reader.read_mode_per_pass(tmp_path)
    logical = reader.convert_global_physical_count_to_logical_count(
        theirs["global_physical_count_of_forward_pass"],
        num_layers=p2l.shape[0],
        num_logical_experts=rec["n_experts"],
        physical_to_logical_map=theirs["last_physical_to_logical_map"],
    )
    ours = read_sglang_recorder(tmp_path, n_experts=rec["n_experts"])
    np.testing.assert_array_equal(ours.counts, logical.numpy())
    assert ours.batch_ids.tolist() == theirs["forward_pass_ids"]
    np.testing.assert_array_equal(ours.counts, rec["logical_counts"])
