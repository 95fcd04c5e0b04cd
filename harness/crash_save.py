"""One reference save in its own process, so a crash-point run can kill it (or its async writer) mid-save.

``python -m harness.crash_save --case CASE.json --root ROOT --name NAME --version V [--async]``. The save id is
derived from the destination, so every replay issues the same syscalls on the same paths.
"""

from __future__ import annotations

import argparse
import sys

from harness.sut.reference import agreed_save_id
from properties.case import read_case_file
from reference import AsyncSaver, save


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", type=int, required=True)
    parser.add_argument("--async", dest="use_async", action="store_true")
    args = parser.parse_args(argv)
    case, _ = read_case_file(args.case)
    state, layouts = case.state(args.version), case.layouts("save")
    save_id = agreed_save_id(args.root, args.name)
    if args.use_async:
        with AsyncSaver() as saver:
            saver.save(args.root, state, layouts, name=args.name, save_id=save_id).wait()
    else:
        save(args.root, state, layouts, name=args.name, save_id=save_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
