"""Repro scripts for ``paddle.save`` / ``paddle.load`` (and ``paddle.async_save``): each rank writes its own pieces
to one file per checkpoint name and reads the same file back, as harness/sut/paddle_save.py does."""

from __future__ import annotations

from harness.repro.emitters import paddle_text
from harness.repro.render import HOLD_THREADS
from harness.repro.scripted_case import ReproUnsupported, ScriptedCase

FRAMEWORK = "paddle"
TEXT = paddle_text  # the framework's part of the script (set-up, tensors, launcher)
INERT = frozenset({"commit_timeout", "op_timeout"})
RENDERED = frozenset({"format"})


def settings(scripted: ScriptedCase) -> str:
    unknown = sorted(set(scripted.options) - INERT - RENDERED)
    if unknown:
        raise ReproUnsupported(f"option(s) {unknown} (the script does not render them yet)")
    return f"SAFETENSORS = {scripted.options.get('format') == 'safetensors'}  # the safetensors= of save and load\n"


def helpers(scripted: ScriptedCase) -> str:
    return HELPERS


HELPERS = '''from paddle.framework import io as paddle_io  # noqa: E402 (where paddle.async_save keeps its threads)


def path_of(name):
    return os.path.join(ROOT, name, f"rank-{RANK:05d}." + ("safetensors" if SAFETENSORS else "pdparams"))


def save(name, pieces, async_save=False, mutate_after=False, detach=False):
    state = {key: tensor(p) for key, p in pieces.items()}
    path = path_of(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not async_save:
        paddle.save(state, path, safetensors=SAFETENSORS)
        return
    paddle.async_save(state, path, safetensors=SAFETENSORS)
    returned(paddle_io.async_save_queue[-1], state.values(), mutate_after, detach)


def wait():
    writers, PENDING[:] = list(PENDING), []
    for writer in writers:
        writer.join()


def load(name, pieces):
    if not pieces:
        return {}
    loaded = paddle.load(path_of(name), safetensors=SAFETENSORS)
    return {key: loaded[key] for key in pieces}
'''


HOLD = HOLD_THREADS  # paddle.async_save writes in a thread of the caller's process: the script can gate it
