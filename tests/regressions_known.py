"""Known findings that broad fault tests steer around (each is kept as a regression case and listed in
FINDINGS.md), so that a test meant to find new bugs does not stop at an old one."""

from __future__ import annotations

from faults.spec import KillWhenFault
from properties.model.case import Case


def survivable(case: Case) -> bool:
    """An async fault case whose faulted save torch-dcp can survive: not a process-executor writer killed under a
    living rank (torch-dcp-killed-process-writer-hangs.json: every future then hangs)."""
    if not case.ops[1].use_async:
        return False
    writer_killed = isinstance(case.fault, KillWhenFault) and case.fault.target == "children"
    return not (case.options.get("async_executor") == "process" and writer_killed)
