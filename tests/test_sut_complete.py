"""What each adapter's ``complete`` lists as finished, on roots laid out the way its framework leaves them
mid-save and after (files only: no framework runs). The history judge holds every listed name to loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sut.paddle_dcp import PaddleDcpSut
from harness.sut.paddle_save import PaddleSaveSut
from harness.sut.paddleformers_uc import PaddleFormersUcSut
from harness.sut.reference import ReferenceSut
from harness.sut.torch_dcp import TorchDcpSut
from reference.dtypes import dtype
from reference.engine import save
from reference.tensor import Tensor

NAMES = ("step-0", "step-1", "step-2")


def _touch(root: Path, *paths: str) -> None:
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_bytes(b"")


def test_reference_lists_committed_checkpoints_only(tmp_path: Path) -> None:
    save(tmp_path, {"w": Tensor.empty(dtype("F32"), (2,))}, name="step-0")
    _touch(tmp_path, ".staging-step-1-abc/rank-00000.safetensors", "step-2/rank-00000.safetensors")
    assert ReferenceSut.complete(tmp_path, NAMES, {}) == ["step-0"]


@pytest.mark.parametrize("options, files, listed", [
    ({}, ["step-0/0.metadata", "step-0/0_0.distcp", "step-1/0_0.distcp"], ["step-0"]),
    ({"same_dir": True}, ["dcp/0.metadata", "dcp/0_0.distcp", "dcp/1_0.distcp", "dcp/2.metadata"],
     ["step-0", "step-2"]),
], ids=["own-dir", "same-dir"])
def test_paddle_dcp_lists_names_whose_metadata_exists(tmp_path: Path, options: dict, files: list[str],
                                                      listed: list[str]) -> None:
    _touch(tmp_path, *files)
    assert PaddleDcpSut.complete(tmp_path, NAMES, options) == listed


@pytest.mark.parametrize("options, older, newer, listed", [
    ({}, "model.safetensors", "model.safetensors", ["step-0", "step-1"]),  # stock code off PDC marks none: any
    ({"pdc": True}, ".checkpoint_done", "model.safetensors", ["step-0"]),
    ({}, ".checkpoint_done", "model.safetensors", ["step-0"]),  # a folder of marked saves (the crashed-save fix)
    ({}, ".checkpoint_done", ".model_weight.done.0", ["step-0", "step-1"]),  # ... or an async writer's done signal
], ids=["any-dir", "pdc-done-file", "marked-folder", "marked-folder-async-signal"])
def test_uc_lists_what_get_last_checkpoint_takes(tmp_path: Path, options: dict, older: str, newer: str,
                                                 listed: list[str]) -> None:
    _touch(tmp_path, f"checkpoint-0/{older}", f"checkpoint-1/{newer}")
    assert PaddleFormersUcSut.complete(tmp_path, (*NAMES, "no-step"), options) == listed


def test_torch_dcp_lists_names_with_metadata(tmp_path: Path) -> None:
    _touch(tmp_path, "step-0/.metadata", "step-0/__0_0.distcp", "step-1/__0_0.distcp")
    assert TorchDcpSut.complete(tmp_path, NAMES, {}) == ["step-0"]


@pytest.mark.parametrize("options", [{}, {"format": "safetensors"}])
def test_paddle_save_cannot_tell_a_finished_checkpoint(tmp_path: Path, options: dict) -> None:
    """paddle.save writes in place with no marker: a rank file exists from its first byte, torn or not, so the
    adapter lists nothing rather than holding Paddle to a claim it never makes."""
    _touch(tmp_path, "step-0/rank-00000.pdparams", "step-1/rank-00001.safetensors")
    assert PaddleSaveSut.complete(tmp_path, NAMES, options) is None
