"""The EP dispatch baselines, one module per system (SGLang, vLLM, LPLB, METRO, LLEP,
MoonEP, EPLB's even split, the token LP)."""

__all__: list[str] = []
