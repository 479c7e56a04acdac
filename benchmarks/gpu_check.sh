#!/usr/bin/env bash
# The runtime adapter's GPU checks, in one short run, for a machine with a CUDA GPU:
#   1. the dispatch tests on CUDA: the compiled Triton kernel == the torch reference (random,
#      adversarial, 4k-64k tokens x top-8, replayed in a CUDA graph), torn tables;
#   2. benchmarks/runtime_speed.py's dispatch part on the GPU (fused kernel, eager and in a
#      graph, vs a bare torch.bincount and the torch reference).
# Results (environment, pytest log and junit XML, benchmark JSON and table) go to one folder:
#   bash benchmarks/gpu_check.sh [OUT_DIR]      (default: benchmarks/results/gpu)
# Needs torch with CUDA and triton already installed for $PYTHON (default python3): the
# machine may have no network. Typical wall time: 2-4 minutes (Triton compiles once).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-benchmarks/results/gpu}}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$OUT/numba-cache}
unset TRITON_INTERPRET

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" - <<'PY'
import platform
print("python", platform.python_version())
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          "available", torch.cuda.is_available(),
          "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
except Exception as exc:  # noqa: BLE001
    print("torch missing:", exc)
try:
    import triton
    print("triton", triton.__version__)
except Exception as exc:  # noqa: BLE001
    print("triton missing:", exc)
PY
} | tee "$OUT/env.txt"

if ! "$PY" -c "import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: needs torch with a CUDA device and triton for $PY; see $OUT/env.txt" >&2
  exit 2
fi
# The library itself, without touching the network (its dependencies must be installed:
# numpy, numba, highspy, scipy, networkx, hypothesis, pytest).
if ! "$PY" -c "import straggler.runtime" 2>/dev/null; then
  if ! "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.txt" 2>&1; then
    echo "gpu_check: cannot install the package offline; see $OUT/pip.txt" >&2
    exit 2
  fi
fi

status=0
echo "== 1. dispatch tests on CUDA"
timeout 900 "$PY" -m pytest -q -p no:cacheprovider -rs \
  tests/test_runtime_dispatch.py tests/test_runtime_publisher.py \
  --junitxml="$OUT/pytest_cuda.xml" 2>&1 | tee "$OUT/pytest_cuda.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== 2. dispatch speed on the GPU"
timeout 900 "$PY" benchmarks/runtime_speed.py --skip-worker --repeats 50 \
  --out "$OUT/runtime_speed_gpu.json" 2>&1 | tee "$OUT/runtime_speed_gpu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "gpu_check: status $status, results in $OUT"
exit $status
