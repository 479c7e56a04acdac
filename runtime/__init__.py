"""Reserved for the deployment adapter of DESIGN.md (Triton/CUDA dispatch kernel with a
torch reference, table publishing, solver worker). No issue has built it yet, so the package
holds nothing; it exists so the layout and the wheel are complete."""

__all__: list[str] = []
