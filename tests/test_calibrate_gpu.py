"""benchmarks/calibrate_gpu.py: exits 0 without CUDA; its pipeline (timing, log, fit) runs
on the CPU with tiny shapes; its expert computation is the FFN it claims to time."""

import importlib.util
import pathlib
import runpy

import numpy as np
import pytest
from straggler.solvers import CalibrationResult
from straggler.solvers.dispatch.calibration import read_calibration_log

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "calibrate_gpu.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _module():
    return runpy.run_path(str(SCRIPT), run_name="calibrate_gpu")


def test_without_cuda_it_says_so_and_exits_0(capsys):
    mod = _module()
    if HAS_TORCH:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    assert mod["main"]([]) == 0
    out = capsys.readouterr().out
    assert "nothing to time" in out


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_cpu_pipeline_writes_a_log_fit_cost_model_reads(tmp_path, capsys):
    mod = _module()
    out = tmp_path / "log.csv"
    args = ["--device", "cpu", "--dtype", "fp32", "--hidden", "32", "--ffn", "16",
            "--experts", "1,2,4", "--tokens", "1,16,128,256", "--reps", "2", "--repeats", "2",
            "--bootstrap", "5", "--out", str(out)]  # fmt: skip
    assert mod["main"](args) == 0
    log = read_calibration_log(out)
    assert log["G"].tolist() == [1] * 4 + [2] * 4 + [4] * 4
    np.testing.assert_array_equal(log["N"], log["G"] * np.tile([1, 16, 128, 256], 3))
    np.testing.assert_array_equal(log["T"], log["G"] * np.tile([1, 1, 1, 2], 3))
    assert (log["t"] > 0).all() and log["meta"]["gpu"] == "cpu"
    fit = CalibrationResult.load(out.with_suffix(".fit.json"))
    assert fit.n_samples == 12 and fit.meta["kernel"] == "bmm"
    assert "preset for straggler.formulations.cost.PRESETS" in capsys.readouterr().out


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_expert_ffn_kernels_agree_with_a_plain_reference():
    import torch

    mod = _module()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    w13 = torch.randn(3, 8, 12, generator=g, dtype=torch.float64)
    w2 = torch.randn(3, 6, 8, generator=g, dtype=torch.float64)
    ref = []
    for e in range(3):
        h = x[e] @ w13[e]
        ref.append((torch.nn.functional.silu(h[:, :6]) * h[:, 6:]) @ w2[e])
    ref = torch.stack(ref)
    for kernel in ("bmm", "loop"):
        got = mod["expert_ffn"](x, w13, w2, kernel=kernel, part="ffn")
        torch.testing.assert_close(got, ref)
    torch.testing.assert_close(
        mod["expert_ffn"](x, w13, w2, kernel="bmm", part="w13"), torch.bmm(x, w13)
    )
