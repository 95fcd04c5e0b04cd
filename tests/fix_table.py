"""The fix table: for every regression case, which fixes its stock run reaches and what each of them, applied alone
(with what it requires), does to it. A fix is a set of recompiled functions, so a fix a case never calls is not
replayed there: it cannot change the outcome (harness.fixes.reach). A fix may change only its own rows; the golden
table (tests/golden/fix_table.json) is what the nightly run compares with, so a fix that starts masking another
row's bug, a row that starts reaching a fix, or an outcome that moves all show.

``python -m tests.fix_table [--update] [STEM ...]`` rewrites the rows whose framework is installed here (all of
them by default; the PaddleFormers rows in its own environment): do that only where a change is intended, and say
so in the commit. ``--update`` keeps the outcomes a row has and runs only fixes it newly reaches.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.fixes import FIXES, own_fixes, resolve, stack
from harness.fixes.reach import reached
from harness.judging.judge import Judge, Unreplayable, fault_fired
from harness.ranks.forkserver import ForkServer
from harness.ranks.runners import Runners
from harness.sut import REGISTRY, adapter_class, framework_available
from properties.model.case import Case, read_case_file

REGRESSIONS = Path(__file__).parent / "regressions"
GOLDEN = Path(__file__).parent / "golden" / "fix_table.json"
# What a run shows: no failure; the row's own bug (one of its recorded ways); another failure; or, for a fault case,
# no fault (the fix changed the IO the fault targets, or the recorded power-loss state no longer exists).
OUTCOMES = ("pass", "own", "other", "unfired")
FIRE_ATTEMPTS = 3  # a fault a watcher triggers (kill-when) may miss its moment: a run that did not fire is retried


def rows() -> list[str]:
    return sorted(p.stem for p in REGRESSIONS.glob("*.json"))


def runnable(stem: str) -> bool:
    """The row's system under test is installed here."""
    return framework_available(REGISTRY[json.loads((REGRESSIONS / f"{stem}.json").read_text())["sut"]])


def watched(sut: str) -> list[str]:
    """The fixes a run of ``sut`` can reach: every fix of its framework and of the frameworks beneath it."""
    return [i for i, f in FIXES.items() if f.framework in stack(adapter_class(sut).framework)]


def mine(fix_id: str, stem: str) -> bool:
    """The fix (with what it requires) holds one of the row's own fixes: changing the row is its job."""
    return bool(set(resolve(fix_id)) & set(own_fixes(stem)))


def excused(fix_id: str, what: str) -> bool:
    """Changes no row need explain: a fault that no longer fires (the fix changed the IO a recorded crash point or
    power-loss state names: the run says nothing either way), and a detector's own typed error where another bug
    leaves targets uncovered (detecting that is its job)."""
    return what == "unfired" or (what == "other" and FIXES[fix_id].kind == "detector")


def violations(table: dict) -> list[str]:
    """Every fix that, applied alone, changes a row it does not own and the row does not say why (``why``: fix
    id -> reason, written by hand in the golden table), every reason for a change that is not there, and every
    row its own fix leaves unreached."""
    found = []
    for stem, line in table.items():
        changed = {f for f, what in line["alone"].items() if what != line["stock"] and not mine(f, stem)
                   and not excused(f, what)}
        why = line.get("why", {})
        found += [f"{f} changes {stem}: {line['alone'][f]} (stock: {line['stock']}), and the row does not say why"
                  for f in sorted(changed - why.keys())]
        found += [f"{stem} says why {f} changes it, but it does not" for f in sorted(why.keys() - changed)]
        found += [f"{stem}: its own fix {f} is not reached by its stock run" for f in own_fixes(stem)
                  if f not in line["reached"]]
    return found


class Tables:
    """Runner sets for one table build: one fork server per system under test, so each fix set's ranks are forked
    from a process that has the framework loaded."""

    def __init__(self, log: Callable[[str], None] | None = None) -> None:
        self._forks: dict[str, ForkServer] = {}
        self.log = log or (lambda line: None)

    def close(self) -> None:
        for forks in self._forks.values():
            forks.close()
        self._forks.clear()

    def row(self, stem: str, alone: bool | dict = True) -> dict:
        """The row's line: its stock outcome, the fixes its stock run reaches, each one's outcome alone (unless
        ``alone`` is false: the stock run only; a dict: the outcomes known already, only the others are run). One
        judge runs them all as a campaign's would: a rank left waiting on a peer that raised is not waited out
        (gloo's 30 s), except in the first run of each failure, which tells what the shortcut's failure is."""
        case, finding = read_case_file(REGRESSIONS / f"{stem}.json")
        mode = "virtual" if finding.get("launch", "fresh") == "virtual" else "pool"
        # A bug shown only behind known bugs' fixes (its needs_fixes): "stock" is stock code behind them, and each
        # fix alone joins them; they are applied throughout, so they are no row of their own.
        needs = resolve(",".join(finding.get("needs_fixes") or ())) if finding.get("needs_fixes") else ()
        runners = Runners(case.sut, mode, fixes=needs, forks=self._forks.setdefault(case.sut, ForkServer(case.sut)))
        judge = Judge(runners, exploring=True)
        watch = [f for f in watched(case.sut) if f not in needs]
        try:
            with tempfile.TemporaryDirectory(prefix="ckh-reach-") as where:
                runners.reach = {"dir": where, "fixes": watch}
                stock, core = self._judged(judge, case, finding, "stock")
                runners.reach = None
                hit = reached(where)
            if stock != "own":  # the recorders' timing may move a racy fault (kill-when) off its moment
                stock, core = self._judged(judge, case, finding, "stock, unwatched")
            known = alone if isinstance(alone, dict) else {}
            outcomes = {}
            for fix_id in hit if alone is not False else ():  # {}: none known yet, every one runs
                if fix_id in known:
                    outcomes[fix_id] = known[fix_id]
                    continue
                with runners.patched(resolve(",".join((*needs, fix_id)))):
                    outcomes[fix_id] = self._judged(judge, case, finding, fix_id, core)[0]
        finally:
            judge.close()
        return {"stock": stock, "reached": list(hit), "alone": outcomes}

    def _judged(self, judge: Judge, case: Case, finding: dict, label: str, core: str | None = None
                ) -> tuple[str, str | None]:
        """What one run of the case shows (``OUTCOMES``), and its failure's bucket core. A run cut short shows
        the row's own bug where its bucket is the stock run's."""
        for attempt in range(FIRE_ATTEMPTS):
            began = time.monotonic()
            try:
                judgement, outcome = judge(case)
            except Unreplayable:
                return "unfired", None
            finally:
                self.log(f"  {label}: {time.monotonic() - began:.1f} s")
            if fault_fired(case, outcome):
                break
            if attempt == FIRE_ATTEMPTS - 1:
                return "unfired", None
        if judgement.ok:
            return "pass", None
        bucket = judge.bucket(case, judgement, outcome).core
        details = "\n".join(judgement.details)
        own = any(w["expect"] in details for w in (finding, *finding.get("or", []))) or bucket == core
        if not own or label == "stock":
            self.log(f"  {label}: {'own' if own else 'other'}: {judgement.details[0][:300]}")
        return ("own" if own else "other"), bucket


def read_golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}


def main(argv: list[str]) -> int:
    """``--update``: keep the outcomes of fixes a row reached before, run only the newly reached ones (after a change
    of what counts as reached). A row whose case file is gone (a case renamed or removed) is dropped. Exit 2 on a
    stem with no case file."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.fix_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="run only the fixes a row newly reaches")
    parser.add_argument("stems", nargs="*", help="regression case stems (default: every row runnable here)")
    args = parser.parse_args(argv)
    unknown = [s for s in args.stems if s not in rows()]
    if unknown:
        print(f"python -m tests.fix_table: no regression case {', '.join(unknown)} in {REGRESSIONS}", file=sys.stderr)
        return 2
    stale = sorted(set(read_golden()) - set(rows()))
    if stale:
        print("dropped rows with no case file:", ", ".join(stale), flush=True)
        _write({k: v for k, v in read_golden().items() if k not in stale})
    wanted = args.stems or [s for s in rows() if runnable(s)]
    tables = Tables(log=lambda line: print(line, flush=True))
    try:
        for stem in wanted:
            print(stem, flush=True)
            line = tables.row(stem, read_golden().get(stem, {}).get("alone", {}) if args.update else True)
            table = read_golden()  # read again: another environment may be writing its rows meanwhile
            why = table.get(stem, {}).get("why")
            table[stem] = line | ({"why": why} if why else {})
            print(" ", json.dumps(line), flush=True)
            _write(table)
    finally:
        tables.close()
    for problem in violations(read_golden()):
        print("VIOLATION:", problem)
    return 0


def _write(table: dict) -> None:
    GOLDEN.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
