"""Every single-bit flip of a valid checkpoint's index.json, each followed by a full ``load_global``: none may load.

The test suite samples these flips (tests/test_hostile_metadata_fuzz.py); this runs all of them. Prints the outcome
counts (error type → flips) and exits 1 if any flip loaded.

Run from the repo root: ``python bench/index_bitflips.py [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # works without installing the package

from tests.hostile_cases import build_valid
from tests.test_hostile_metadata_fuzz import flip_outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where to build the checkpoint (default: a fresh temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="bitflips-"))
    try:
        root = work / "root"
        build_valid(root)
        size = (root / "new" / "index.json").stat().st_size
        start = time.perf_counter()
        counts = flip_outcomes(root, list(range(size * 8)))
        elapsed = time.perf_counter() - start
    finally:
        shutil.rmtree(work)
    print(json.dumps({"index_bytes": size, "flips": size * 8, "outcomes": counts, "seconds": round(elapsed, 1)}))
    return 1 if "loaded" in counts else 0


if __name__ == "__main__":
    sys.exit(main())
