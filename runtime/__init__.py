"""Reserved for the deployment adapter of DESIGN.md (Triton/CUDA dispatch kernel with a
torch reference, table publishing, solver worker). No issue has built it yet, so the package
holds nothing; it exists so the layout and the wheel are complete."""

from .engines import EngineLog, detect_format, read_engine_log

__all__: list[str] = ["EngineLog", "detect_format", "read_engine_log"]
