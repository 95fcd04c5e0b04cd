"""Lines of the frameworks' checkpoint code that a CPU build cannot run: the branches taken only on a device build
(CUDA, ROCm, XPU, a custom device) or a device place. A CPU campaign lists them with that reason instead of
counting them as missed, and never hides them: the report names each line and the condition that guards it.

Read from the source (``ast``), not measured: a guard is an ``if`` whose condition asks for a device (compiled
with one, a place of one, one available); the branch that needs the device is its body, or its ``else`` where the
condition is negated (``if not paddle.is_compiled_with_cuda():``).
"""

from __future__ import annotations

import ast
import re

# What a condition asks when it asks for a device build or place.
DEVICE = re.compile(
    r"is_compiled_with_(cuda|rocm|xpu|custom_device|ipu)\b|is_(gpu|xpu|custom|cuda_pinned)_place\b"
    r"|cuda\.is_available\b|\.is_cuda\b|get_cudnn_version\b|device_count\(\)\s*>|"
    r"==\s*['\"](gpu|cuda|xpu|npu)['\"]|['\"](gpu|cuda|xpu|npu)['\"]\s*==|['\"](gpu|cuda|xpu)['\"]\s+in\b")


def cpu_only_lines(source: str) -> dict[int, str]:
    """Line -> why it needs a device: every line of a branch guarded by a device condition (a file that does not
    parse has none: coverage.py reports it as it can)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[int, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        text = ast.unparse(test.operand if negated else test)
        if not DEVICE.search(text) or _mixed(test.operand if negated else test):
            continue
        branch = node.orelse if negated else node.body
        why = f"needs a device build: {'not ' if negated else ''}{text}"
        for stmt in branch:
            for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1):
                out.setdefault(line, why)
    return out


def _mixed(test: ast.expr) -> bool:
    """``a or is_compiled_with_cuda()`` can hold on CPU: a disjunction with a part that asks for no device."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(not DEVICE.search(ast.unparse(v)) for v in test.values)
    return False
