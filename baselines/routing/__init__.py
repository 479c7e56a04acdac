"""The DP routers engines deploy, one module per system (SGLang, vLLM, TensorRT-LLM,
Dynamo, uniform random), and their wrapper objects."""

__all__: list[str] = []
