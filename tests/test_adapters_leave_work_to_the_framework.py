"""Adapters call a framework as a training script does: what the framework does for its users (making a checkpoint's
directories, resolving "latest", handling dtypes and devices) is left to it, so its bugs there stay in reach. Where
an adapter must help, a comment says why and a test here shows the framework alone would not run the case."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import harness.sut

SUT_DIR = Path(harness.sut.__file__).parent
# Modules of harness/sut that are the harness's own bookkeeping, not calls into a framework.
BOOKKEEPING = {"shm.py"}  # the pool's list of shared-memory segments a killed rank cannot unlink


def _calls(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in names:
                found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_no_adapter_makes_a_checkpoints_directories() -> None:
    """Every framework here makes the directories it writes into (paddle.save, save_state_dict, torch DCP, the
    Trainer); an adapter that made them first would hide a framework that stopped doing so, or raced doing it."""
    made = [c for p in sorted(SUT_DIR.glob("*.py")) if p.name not in BOOKKEEPING
            for c in _calls(p, {"mkdir", "makedirs"})]
    assert made == []


def test_paddle_save_makes_the_directory_it_writes_into(tmp_path: Path) -> None:
    """What the paddle-save adapter relies on, leaving the directory to the framework: both formats."""
    pytest.importorskip("paddle")
    script = ("import sys, paddle\n"
              "paddle.save({'w': paddle.ones([2])}, sys.argv[1] + '/a/b/rank-00000.pdparams')\n"
              "paddle.save({'w': paddle.ones([2])}, sys.argv[1] + '/c/rank-00000.safetensors', safetensors=True)\n")
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120, capture_output=True)
    assert (tmp_path / "a" / "b" / "rank-00000.pdparams").is_file()
    assert (tmp_path / "c" / "rank-00000.safetensors").is_file()


@pytest.mark.parametrize("call", ["cuda", "pin_memory"])
def test_the_cpu_shims_are_help_a_cpu_only_paddle_needs(call: str) -> None:
    """The one help the Paddle adapters give (docs/design.md §9): the checkpoint code calls Tensor.cuda() (its
    reshard) and Tensor.pin_memory() (parallel_broadcast's offload), which a CPU-only Paddle refuses; the shims turn
    them into CPU copies. Without them the framework alone cannot run those loads."""
    paddle = pytest.importorskip("paddle")
    if paddle.is_compiled_with_cuda():
        pytest.skip("a CUDA build runs them itself")
    script = f"import paddle\npaddle.to_tensor([1.0]).{call}()\n"
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True, text=True)
    assert done.returncode != 0, f"Tensor.{call}() ran on a CPU-only Paddle: the shim is no longer needed"


def test_sharding_stage1_v2_refuses_a_cpu_without_the_alignment_shim() -> None:
    """The fused buffers of sharding stage 1 V2 (P-MODEL's ``stage1v2`` producer) know a slot alignment only for
    gpu, npu and xpu and assert one of them; the shim gives the CPU the GPU's. Without it the optimizer cannot be
    built on a CPU-only Paddle."""
    paddle = pytest.importorskip("paddle")
    if paddle.is_compiled_with_cuda():
        pytest.skip("a CUDA build has the GPU's alignment")
    script = ("from paddle.distributed.fleet.utils import tensor_fusion_helper as t\n"
              "t.get_current_device_type()\n")
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True, text=True)
    assert done.returncode != 0 and "tensor fusion helper now only support" in done.stderr, done.stderr[-500:]


def test_sharding_stage2_has_no_cpu_path() -> None:
    """Why P-MODEL draws no sharding stage 2: GroupShardedOptimizerStage2 asserts a CUDA, XPU or custom-device build
    before anything else, so no shim short of pretending to be such a build gets it to run on a CPU-only Paddle."""
    paddle = pytest.importorskip("paddle")
    if paddle.is_compiled_with_cuda():
        pytest.skip("a CUDA build runs stage 2")
    script = ("import paddle\n"
              "from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2 import (\n"
              "    GroupShardedOptimizerStage2)\n"
              "params = paddle.nn.Linear(2, 2).parameters()\n"
              "GroupShardedOptimizerStage2(params, paddle.optimizer.AdamW(parameters=params))\n")
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True, text=True)
    assert done.returncode != 0 and "Only GPU and XPU and CustomDevice is supported now" in done.stderr, \
        done.stderr[-500:]
