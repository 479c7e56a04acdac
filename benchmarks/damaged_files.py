"""Every single-bit flip and every truncation of small torch ``.pt`` engine files, read back:
how many are read as data that differs from what was written (``silent``), how many raise
anything but ``InvalidInputError`` (``raw``).

Files: an SGLang stat dump, an SGLang per-pass dump, a vLLM state (written by the library's
writers). ``--no-checksum`` reads them without the zip CRC check of
``straggler.runtime.engines._common.load_pt`` (what ``torch.load`` alone gives). Writes
``damaged_files.json`` under ``--out`` and prints a table.

    python benchmarks/damaged_files.py [--no-checksum] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings

from straggler.formulations import InvalidInputError
from straggler.runtime.engines import (
    read_sglang_recorder,
    read_vllm_state,
    vllm_maps,
    write_sglang_detail_dump,
    write_sglang_stat_dump,
    write_vllm_state,
)


def files(d):
    stat = write_sglang_stat_dump(os.path.join(d, "a"), [[[42, 7, 3]]], timestamp=1.0)
    detail = write_sglang_detail_dump(
        os.path.join(d, "b"),
        [{"forward_pass_id": 0, "global_physical_count": [[3, 4, 5]]}],
        [[0, 1, 0]],
        rank=0,
        timestamp=1.0,
    )
    state = dict(vllm_maps([[0, 1, 0]], 2, width=None), expert_load_window=[[[3, 4, 5]]])
    vllm = write_vllm_state(os.path.join(d, "c", "s_rank0.pt"), state)
    return [
        ("sglang stat dump", stat, read_sglang_recorder),
        ("sglang per-pass dump", detail, read_sglang_recorder),
        ("vllm state", vllm, read_vllm_state),
    ]


def sweep(path, read) -> dict:
    want = read(path).counts.tolist()
    data = open(path, "rb").read()
    damaged = [data[:k] for k in range(len(data))]
    for i in range(len(data)):
        for bit in range(8):
            b = bytearray(data)
            b[i] ^= 1 << bit
            damaged.append(bytes(b))
    out = {"bytes": len(data), "damaged": len(damaged), "silent": 0, "raw": 0, "refused": 0}
    for b in damaged:
        with open(path, "wb") as f:
            f.write(b)
        try:
            same = read(path).counts.tolist() == want
            out["silent"] += not same
        except InvalidInputError:
            out["refused"] += 1
        except Exception:  # noqa: BLE001 - counted, the point of the sweep
            out["raw"] += 1
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-checksum", action="store_true", help="skip the zip CRC check")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)
    if args.no_checksum:
        import straggler.runtime.engines._common as common

        common.check_zip_members = lambda *a, **k: None
    warnings.simplefilter("ignore")  # torch warns about the damaged pickles it reads
    rows = {}
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        for name, path, read in files(d):
            rows[name] = sweep(path, read)
    wall = time.perf_counter() - t
    print(f"{'file':24}{'bytes':>7}{'damaged':>9}{'silent':>8}{'raw':>6}{'refused':>9}")
    for name, r in rows.items():
        print(
            f"{name:24}{r['bytes']:>7}{r['damaged']:>9}{r['silent']:>8}{r['raw']:>6}"
            f"{r['refused']:>9}"
        )
    os.makedirs(args.out, exist_ok=True)
    name = "damaged_files_no_checksum.json" if args.no_checksum else "damaged_files.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump({"checksum": not args.no_checksum, "files": rows, "wall_s": wall}, f, indent=1)
    print(f"wrote {os.path.join(args.out, name)} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
