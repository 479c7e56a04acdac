"""Execute every notebook in this folder in place of a reader (CI: ``python notebooks/run.py``).

Each notebook runs top to bottom with nbclient in a fresh kernel; a failing cell fails the run.
The kernel talks over IPC sockets in a private temporary folder (a TCP kernel without
encryption keys makes IPKernel warn on every run). Outputs are not written back (the committed
notebooks stay clean); ``--figures DIR`` saves each notebook's pictures there as
``<notebook>-<n>.png`` (the documentation shows them: ``docs/notebooks.md``)."""

import argparse
import base64
import os
import pathlib
import sys
import tempfile
import time

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).resolve().parent


def _ipc_manager(folder: str):
    class IPCKernelManager(AsyncKernelManager):
        """A kernel reached over IPC sockets in ``folder`` (no TCP port, no warning)."""

        def __init__(self, **kw):
            kw.setdefault("transport", "ipc")
            kw.setdefault("ip", os.path.join(folder, "kernel"))
            super().__init__(**kw)

    return IPCKernelManager


def figures(nb) -> list[bytes]:
    """The PNG pictures of an executed notebook, in order."""
    return [
        base64.b64decode(out["data"]["image/png"])
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--figures", default=None, help="folder to save the notebooks' pictures in")
    ap.add_argument("names", nargs="*", help="notebooks to run (default: all)")
    args = ap.parse_args(argv)
    paths = [HERE / n for n in args.names] or sorted(HERE.glob("*.ipynb"))
    failed = 0
    with tempfile.TemporaryDirectory(prefix="straggler-nb-") as sockets:
        manager = _ipc_manager(sockets)
        for path in paths:
            nb = nbformat.read(path, as_version=4)
            t0 = time.perf_counter()
            try:
                NotebookClient(
                    nb, timeout=600, kernel_name="python3", kernel_manager_class=manager,
                    resources={"metadata": {"path": str(HERE)}},
                ).execute()  # fmt: skip
            except Exception as exc:  # report every notebook, then fail
                failed += 1
                print(f"FAILED {path.name}: {type(exc).__name__}: {str(exc)[-2000:]}")
                continue
            print(f"ok {path.name} ({time.perf_counter() - t0:.1f} s)")
            if args.figures:
                out = pathlib.Path(args.figures)
                out.mkdir(parents=True, exist_ok=True)
                for k, png in enumerate(figures(nb), 1):
                    (out / f"{path.stem}-{k}.png").write_bytes(png)
    print(f"{len(paths) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
