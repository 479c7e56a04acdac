"""TensorRT-LLM expert statistics, written exactly as TensorRT-LLM writes them.

TensorRT-LLM does not import without CUDA, so :class:`ExpertStatisticMirror` below
reproduces ``tensorrt_llm/_torch/expert_statistic.py`` (commit
``0fccc5b97dd7b23c438e740b3bf4dcde607266c4``) statement for statement: ``torch.bincount``
of the routed ids per ``"{iter}_{layer}"`` key (int64), ``meta_info.json`` from the first
record, ``safetensors.torch.save_file`` when the iteration reaches ``stop``. The MoE
modules call ``maybe_add_info(self.num_slots, token_selected_slots)`` after the load
balancer's routing, so with the balancer on the ids are slot ids.
"""

import json
import os

import numpy as np
import pytest
from straggler.formulations import InvalidInputError
from straggler.runtime.engines import (
    read_engine_log,
    read_trtllm_statistics,
    write_moe_load_balancer,
)

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
import safetensors.torch  # noqa: E402


class ExpertStatisticMirror:
    """``ExpertStatistic`` of ``tensorrt_llm/_torch/expert_statistic.py``, line by line
    (``envs.get_env`` replaced by the two values it reads)."""

    def __init__(self, rank_id: int, start: int, stop: int, path: str) -> None:
        self.current_iter_id = None
        self.current_layer = None
        self.rank_id = rank_id
        self.start = start
        self.stop = stop
        self._meta_info = None
        self._records = {}
        self.path = path  # EXPERT_STATISTIC_PATH

    @property
    def _should_record(self) -> bool:
        return self.current_iter_id is not None and self.start <= self.current_iter_id < self.stop

    def _set_iter(self, iter_id: int) -> None:
        self.current_iter_id = iter_id
        if iter_id == self.stop:
            path = self.path
            if not os.path.exists(path):
                os.makedirs(path, exist_ok=True)
            if self.rank_id == 0:
                with open(f"{path}/meta_info.json", "w") as f:
                    json.dump(self._meta_info, f)
            safetensors.torch.save_file(self._records, f"{path}/rank{self.rank_id}.safetensors")

    def _set_layer(self, layer: int) -> None:
        self.current_layer = layer

    def _maybe_add_info(self, expert_count: int, token_selected_experts) -> None:
        if not self._should_record:
            return
        if self._meta_info is None:
            self._meta_info = {
                "num_experts": expert_count,
                "num_experts_per_token": token_selected_experts.size(-1),
            }
        counts = torch.bincount(token_selected_experts.flatten(), minlength=expert_count)
        key = f"{self.current_iter_id}_{self.current_layer}"
        if key not in self._records:
            self._records[key] = counts.cpu()
        else:
            self._records[key] += counts.cpu()


N_EXPERTS, N_SLOTS, TOP_K, EP = 16, 24, 2, 4
LAYERS = [3, 4, 5]


def _placement(seed):
    """A static placement (every expert once, 8 hot ones twice), slots contiguous per rank."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in LAYERS:
        row = np.concatenate(
            [np.arange(N_EXPERTS), rng.choice(N_EXPERTS, N_SLOTS - N_EXPERTS, False)]
        )
        rows.append(rng.permutation(row))
    return np.array(rows)


def _record(path, assign, *, balancer: bool, seed=0, start=10, stop=14, n_ranks=EP):
    """Run the mirror on every rank over iterations [start, stop] as the MoE forward does;
    return the true per-(iteration, layer) expert counts summed over ranks."""
    rng = np.random.default_rng(seed)
    stats = [ExpertStatisticMirror(r, start, stop, str(path)) for r in range(n_ranks)]
    truth = np.zeros((stop - start, len(LAYERS), N_EXPERTS), np.int64)
    for it in range(start, stop + 1):
        for s in stats:
            s._set_iter(it)
        if it == stop:
            break
        for r, s in enumerate(stats):
            for j, layer in enumerate(LAYERS):
                n_tok = int(rng.integers(1, 40))
                experts = torch.from_numpy(
                    np.stack([rng.choice(N_EXPERTS, TOP_K, False) for _ in range(n_tok)])
                ).to(torch.int32)
                truth[it - start, j] += np.bincount(experts.flatten().numpy(), minlength=N_EXPERTS)
                if balancer:  # route each (token, expert) to one of the expert's slots
                    slots_of = [np.flatnonzero(assign[j] == e) for e in range(N_EXPERTS)]
                    ids = torch.tensor(
                        [
                            [int(slots_of[e][(t + r) % len(slots_of[e])]) for e in row]
                            for t, row in enumerate(experts.tolist())
                        ],
                        dtype=torch.int32,
                    )
                    s._set_layer(layer)
                    s._maybe_add_info(N_SLOTS, ids)
                else:
                    s._set_layer(layer)
                    s._maybe_add_info(N_EXPERTS, experts)
    return truth


def test_mirror_writes_int64_bincounts(tmp_path):
    _record(tmp_path, _placement(0), balancer=True)
    data = safetensors.torch.load_file(str(tmp_path / "rank0.safetensors"))
    assert {t.dtype for t in data.values()} == {torch.int64}
    assert json.loads((tmp_path / "meta_info.json").read_text()) == {
        "num_experts": N_SLOTS,
        "num_experts_per_token": TOP_K,
    }


def test_balancer_off_expert_ids(tmp_path):
    truth = _record(tmp_path, None, balancer=False)
    log = read_trtllm_statistics(tmp_path, n_experts=N_EXPERTS)
    np.testing.assert_array_equal(log.counts, truth)
    assert log.extras["recorded_ids"] == "experts" and log.physical_to_logical is None


def test_slot_ids_folded_through_the_yaml_in_the_directory(tmp_path):
    assign = _placement(1)
    truth = _record(tmp_path, assign, balancer=True)
    write_moe_load_balancer(tmp_path / "moe_load_balancer.yaml", assign, layer_ids=LAYERS)
    log = read_engine_log(tmp_path)
    assert log.n_experts == N_EXPERTS and log.extras["recorded_ids"] == "slots"
    np.testing.assert_array_equal(log.counts, truth)
    np.testing.assert_array_equal(log.physical_to_logical, assign)


def test_slot_ids_folded_through_a_placement_file(tmp_path):
    assign = _placement(2)
    truth = _record(tmp_path / "stats", assign, balancer=True)
    cfg = write_moe_load_balancer(tmp_path / "plan.yaml", assign, layer_ids=LAYERS)
    log = read_engine_log(tmp_path / "stats", placement=cfg)
    np.testing.assert_array_equal(log.counts, truth)


def test_slot_ids_without_a_placement_refused(tmp_path):
    _record(tmp_path, _placement(3), balancer=True)
    with pytest.raises(InvalidInputError, match="num_experts.*16 experts.*slot ids.*24"):
        read_trtllm_statistics(tmp_path, n_experts=N_EXPERTS)
    with pytest.raises(InvalidInputError, match="slot ids"):
        read_engine_log(tmp_path, n_experts=N_EXPERTS)


def test_placement_mismatches_refused(tmp_path):
    assign = _placement(4)
    _record(tmp_path / "stats", assign, balancer=True)
    twenty = np.tile(np.arange(20) % N_EXPERTS, (len(LAYERS), 1))
    other = write_moe_load_balancer(tmp_path / "a.yaml", twenty, layer_ids=LAYERS)
    with pytest.raises(InvalidInputError, match="num_slots=20"):
        read_trtllm_statistics(tmp_path / "stats", placement=other)
    short = write_moe_load_balancer(tmp_path / "b.yaml", assign[:2], layer_ids=LAYERS[:2])
    with pytest.raises(InvalidInputError, match="no row for layer 5"):
        read_trtllm_statistics(tmp_path / "stats", placement=short)
    online = write_moe_load_balancer(
        tmp_path / "c.yaml", assign, layer_ids=LAYERS, layer_updates_per_iter=1
    )
    with pytest.raises(InvalidInputError, match="layer_updates_per_iter"):
        read_trtllm_statistics(tmp_path / "stats", placement=online)
    write_moe_load_balancer(tmp_path / "stats" / "x.yaml", assign, layer_ids=LAYERS)
    write_moe_load_balancer(tmp_path / "stats" / "y.yaml", assign, layer_ids=LAYERS)
    with pytest.raises(InvalidInputError, match="several placements"):
        read_trtllm_statistics(tmp_path / "stats")
