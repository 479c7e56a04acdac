"""Sample recordings shipped with the package, one per engine format, so that
``straggler-plan sample:sglang`` (or ``sample:vllm``, ``sample:trtllm``) runs after a plain
install.

The three hold the same real loads: DeepSeek-V2-Lite (64 routed experts, top-6, 26 MoE
layers) on 32 sequences of the ESFT tasks (deepseek-ai/ESFT, MIT), 16 steps of 2
data-parallel ranks. ``runtime/samples/README.md`` (beside the files) gives the source, the
license and how they were made (``tests/engine_samples.py``).
"""

from __future__ import annotations

import pathlib

from ...formulations.errors import InvalidInputError

__all__ = ["SAMPLES", "SAMPLE_PREFIX", "sample_recording"]

#: Engine -> (folder under ``runtime/samples``, what it holds, the extra reading it needs).
SAMPLES = {
    "sglang": ("sglang", "a stat-mode expert distribution recorder dump (.pt)", "runtime"),
    "vllm": ("vllm", "each rank's EplbState load window (JSON)", None),
    "trtllm": ("trtllm", "ExpertStatistic output (meta_info.json, rank*.safetensors)", "runtime"),
}

#: What a command's recording argument starts with to name a sample.
SAMPLE_PREFIX = "sample:"


def sample_recording(engine: str) -> pathlib.Path:
    """The folder of the shipped sample recording in ``engine``'s format.

    Parameters
    ----------
    engine : {"sglang", "vllm", "trtllm"}

    Returns
    -------
    pathlib.Path
        A folder ``read_engine_log`` and ``straggler-plan`` read. The SGLang sample is a
        ``torch.save`` file and the TensorRT-LLM one holds safetensors files: reading them
        needs the ``runtime`` extra (``pip install 'straggler[runtime]'``); the vLLM sample
        is JSON.

    Examples
    --------
    >>> from straggler.runtime.engines import read_engine_log, sample_recording
    >>> log = read_engine_log(sample_recording("vllm"))
    >>> log.engine, log.counts.shape
    ('vllm', (16, 26, 64))
    """
    if engine not in SAMPLES:
        raise InvalidInputError(
            f"There is no sample recording {engine!r}; the samples are "
            f"{', '.join(SAMPLE_PREFIX + e for e in SAMPLES)}."
        )
    return pathlib.Path(__file__).resolve().parents[1] / "samples" / SAMPLES[engine][0]
