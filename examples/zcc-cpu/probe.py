"""Probe: PaddleFormers' Zero-Cost Checkpointing (ZCC) in a tiny Trainer job on 2 CPU ranks.

Launched by run.sh (one rank per process, paddle.distributed.launch). Environment knobs:
  ZCC_OUT           output_dir (run.sh sets it); checkpoints land in ZCC_OUT/checkpoint-N, and after every step the
                    probe saves the rank's live state to ZCC_OUT/live-N.rank<r>.npz for compare.py
  ZCC_FORMAT        flex_checkpoint (default, the Trainer's default) | sharding_io
  ZCC_SHIMS         comma list of harness.sut.zcc_shims names, "all" (default) or "none"
  ZCC_STEPS         max_steps (default 4);  ZCC_SAVE_STEPS save_steps (default 2)
  ZCC_RESUME        a checkpoint dir; a run's output dir (the probe resumes from what PaddleFormers'
                    get_last_checkpoint picks in it, as a job restarted on its own output_dir would); or "latest"
                    (train(resume_from_checkpoint=True)). Default: no resume
  ZCC_EMA           zcc_save_ema_coef (default 0.5; "none" turns EMA off)
  ZCC_EMA_INTERVAL  zcc_ema_interval (default 1);  ZCC_ACCUM gradient_accumulation_steps (default 2)
  ZCC_DTYPE         dtype of the parameters w, v (default bfloat16; float32 leaves no master weights)
  ZCC_ON=0          ZCC off: the Trainer's non-ZCC EMA (NonZCCEMACallback, EMABuffer*Based) instead
  ZCC_SLOW_OFFLOAD  seconds each offload copy sleeps first (a long device->host copy), default 0
  ZCC_FIX_BARRIER=1 applies the later upstream fix of the offload barrier (zcc_shims.install_barrier_fix)
  ZCC_KILL_AT       global step at whose save rank 0 SIGKILLs its ZCC worker once the worker reports DUMPING;
                    ZCC_KILL_AFTER a file (relative to checkpoint-N) to wait for first, ZCC_KILL_DELAY seconds to
                    wait after that, ZCC_SLOW_DUMP seconds the worker sleeps before each paddle.save (widens the
                    window between two files of the dump)
The model: BF16 parameters under AMP O2 (FP32 master weights: ZCC's EMA reads master weights) and one FP32
parameter; loss 0.5 * sum(p^2) in FP32, so every step changes weights, moments and master weights.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository

import numpy as np

from harness.sut import zcc_shims

RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def log(*a: object) -> None:
    """Prints one line tagged with the rank, so that run.sh and a reader can pick the probe's lines from the log."""
    print(f"[probe rank{RANK}]", *a, flush=True)


def listing(path: str) -> list[str]:
    """What a checkpoint dir holds, one level deep (folders end in /): short enough to read in one log line."""
    if not os.path.isdir(path):
        return []
    return sorted(d + "/" if os.path.isdir(os.path.join(path, d)) else d for d in os.listdir(path))


def resolve_resume(spec: str | None) -> str | bool | None:
    """ZCC_RESUME -> train()'s resume_from_checkpoint (see the module docstring)."""
    if not spec:
        return None
    if spec == "latest":
        return True
    if os.path.isdir(spec) and any(d.startswith("checkpoint-") for d in os.listdir(spec)):
        from paddleformers.trainer.trainer_utils import get_last_checkpoint

        picked = get_last_checkpoint(spec)
        log(f"get_last_checkpoint({spec}) -> {picked}; files there: {listing(picked) if picked else []}")
        return picked
    return spec


def main() -> int:
    import paddle

    paddle.set_device("cpu")
    log(f"pid={os.getpid()}")
    names = os.environ.get("ZCC_SHIMS", "all")
    shims = [] if names == "none" else ("all" if names == "all" else [n for n in names.split(",") if n])
    os.environ.setdefault("FLAGS_selected_gpus", os.environ.get("PADDLE_LOCAL_RANK", "0"))
    log("shims:", zcc_shims.install(shims))
    if os.environ.get("ZCC_FIX_BARRIER") == "1":
        zcc_shims.install_barrier_fix()
        log("applied the upstream barrier fix (manager.global_step = state.global_step)")

    from paddleformers.trainer import Trainer, TrainerCallback, TrainingArguments
    from paddleformers.transformers import PretrainedConfig, PretrainedModel

    fmt = os.environ.get("ZCC_FORMAT", "flex_checkpoint")
    out = os.environ["ZCC_OUT"]
    resume = resolve_resume(os.environ.get("ZCC_RESUME"))
    ema = os.environ.get("ZCC_EMA", "0.5")
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    args = TrainingArguments(
        output_dir=out, max_steps=int(os.environ.get("ZCC_STEPS", "4")), save_strategy="steps",
        save_steps=int(os.environ.get("ZCC_SAVE_STEPS", "2")), report_to="none", disable_tqdm=True, logging_steps=1,
        per_device_train_batch_size=1, seed=7, learning_rate=0.1, warmup_steps=0, lr_scheduler_type="constant",
        max_grad_norm=0.0, save_checkpoint_format=fmt, load_checkpoint_format=fmt,
        bf16=True, fp16_opt_level="O2", amp_master_grad=True,
        sharding="stage1", sharding_parallel_size=world, split_param=True,
        enable_zero_cost_checkpoint=os.environ.get("ZCC_ON", "1") == "1", fuse_optimizer_states=True,
        zcc_workers_num=1, zcc_save_ema_coef=None if ema == "none" else float(ema),
        zcc_ema_interval=int(os.environ.get("ZCC_EMA_INTERVAL", "1")), save_tokenizer=False,
        gradient_accumulation_steps=int(os.environ.get("ZCC_ACCUM", "2")),
        **({"save_sharded_model": True, "load_sharded_model": True} if fmt == "sharding_io" else {}),
    )

    class ProbeConfig(PretrainedConfig):
        model_type = "zcc_probe"

    class ProbeModel(PretrainedModel):
        """Two low-precision parameters (w, v) and one FP32 one (g): ZCC's EMA keeps a separate buffer for FP32
        model weights ("aka moe gates")."""

        config_class = ProbeConfig
        base_model_prefix = "probe"

        def __init__(self, config: ProbeConfig) -> None:
            super().__init__(config)
            rng = np.random.default_rng(0)
            low = os.environ.get("ZCC_DTYPE", "bfloat16")
            for name, shape, dt in (("w", [200], low), ("v", [6, 10], low), ("g", [5], "float32")):
                p = self.create_parameter(shape, dtype=dt)
                p.set_value(paddle.to_tensor(rng.standard_normal(shape).astype(np.float32)).astype(dt))
                setattr(self, name, p)

        def forward(self, x: object = None, labels: object = None) -> tuple:
            loss = paddle.zeros([], dtype="float32")
            for p in self.parameters():
                q = p.astype("float32")
                loss = loss + 0.5 * (q * q).sum()
            return (loss,)

    class Steps:
        """An endless dataset: the loss does not read the batch."""

        def __len__(self) -> int:
            return 1000

        def __getitem__(self, i: int) -> dict:
            return {"x": np.zeros(1, np.float32), "labels": np.zeros(1, np.float32)}

    kill_at = int(os.environ.get("ZCC_KILL_AT", "0"))

    class KillWorker(TrainerCallback):
        """At step kill_at's save, rank 0 SIGKILLs its ZCC worker once the worker reports DUMPING (and, with
        ZCC_KILL_AFTER, once that file of the dump exists), from a thread, so the kill lands while the dump runs."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == kill_at and RANK == 0:
                threading.Thread(target=self.kill, daemon=True).start()

        def kill(self) -> None:
            import psutil

            ck = os.path.join(out, f"checkpoint-{kill_at}")
            after = os.environ.get("ZCC_KILL_AFTER")
            deadline = time.time() + 60
            while time.time() < deadline:
                mgr = getattr(trainer, "zcc_manager", None)
                workers = {p.pid for p in mgr.processes} if mgr else set()
                kids = [c for c in psutil.Process().children(recursive=True) if c.pid in workers]
                status = [w.status.value for w in mgr.workers] if mgr else []
                dumping = 2 in status  # ZCCWorkerStatus.DUMPING
                if kids and dumping and (not after or os.path.exists(os.path.join(ck, after))):
                    time.sleep(float(os.environ.get("ZCC_KILL_DELAY", "0")))
                    log(f"files in checkpoint-{kill_at} at the kill: {listing(ck)}")
                    for c in kids:
                        log(f"KILL ZCC worker pid={c.pid} status={status}")
                        os.kill(c.pid, signal.SIGKILL)
                    return
                time.sleep(0.001)
            log("killer: no worker seen DUMPING within 60 s")

    def live_state() -> dict[str, np.ndarray]:
        """This rank's live state: parameters, and the inner AdamW's master weights and accumulators, by name."""
        opt = trainer.optimizer
        while hasattr(opt, "_inner_opt"):
            opt = opt._inner_opt
        state = {"param/" + k: (v.astype("float32") if v.dtype == paddle.bfloat16 else v).numpy()
                 for k, v in trainer.model.state_dict().items()}
        state.update({"master/" + k: v.numpy() for k, v in getattr(opt, "_master_weights", {}).items()})
        for slot, accs in getattr(opt, "_accumulators", {}).items():
            state.update({f"acc/{slot}/{k}": v.numpy() for k, v in accs.items()})
        return state

    class Capture(TrainerCallback):
        """Saves the live state after every optimizer step (live-<step>.rank<r>.npz) and, in a resumed job, as its
        first step begins (live-resumed-<step>.rank<r>.npz: what the resume loaded)."""

        first = True

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.first and resume:
                np.savez(os.path.join(out, f"live-resumed-{state.global_step}.rank{RANK}.npz"), **live_state())
                log(f"resumed job's first step begins at global_step {state.global_step}")
            self.first = False

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            np.savez(os.path.join(out, f"live-{state.global_step}.rank{RANK}.npz"), **live_state())

    model = ProbeModel(ProbeConfig())
    trainer = Trainer(model=model, args=args, train_dataset=Steps())
    os.makedirs(out, exist_ok=True)
    trainer.add_callback(Capture())
    if kill_at:
        trainer.add_callback(KillWorker())
    t0 = time.time()
    try:
        trainer.train(resume_from_checkpoint=resume)
    except BaseException:
        log(f"TRAIN FAILED after {time.time() - t0:.1f} s")
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        return 3  # a normal exit: atexit runs ZeroCostCheckpointManager.terminate_workers, as in a failed job
    log(f"trained to step {trainer.state.global_step} in {time.time() - t0:.1f} s")
    head = {k: [float(x) for x in v.astype("float32").numpy().reshape(-1)[:4]] for k, v in model.state_dict().items()}
    log("params[:4]", json.dumps(head))
    for d in sorted(os.listdir(out)):
        if os.path.isdir(os.path.join(out, d)):
            log(d, listing(os.path.join(out, d)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
