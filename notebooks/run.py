"""Execute every notebook in this folder in place of a reader (CI: ``python notebooks/run.py``).

Each notebook runs top to bottom with nbclient in a fresh kernel; a failing cell fails the run.
Outputs are not written back (the committed notebooks stay clean)."""

import pathlib
import sys
import time

import nbformat
from nbclient import NotebookClient

here = pathlib.Path(__file__).parent
failed = 0
for path in sorted(here.glob("*.ipynb")):
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    except Exception as exc:  # report every notebook, then fail
        failed += 1
        print(f"FAILED {path.name}: {type(exc).__name__}: {str(exc)[-2000:]}")
    else:
        print(f"ok {path.name} ({time.perf_counter() - t0:.1f} s)")
print(f"{len(list(here.glob('*.ipynb'))) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
