"""A Trainer job that lives across a case's ops: ``Trainer.train`` in a thread, paused at every step boundary.

Zero-Cost Checkpointing saves from inside the loop (its callback's ``on_step_end``) and writes while the next steps
train, so its saves cannot be made from outside a finished ``train`` call. The job runs ``Trainer.train`` in a
thread of the rank process; a callback placed before the Trainer's own ones stops it at each step's begin and end
until the harness says what comes next: train on, save this step (``control.should_save``, which the loop's
callbacks then act on), or stop. The harness thread touches the job only while it is stopped, so the two never run
Paddle or a collective at the same time.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

BEGIN, END = "begin", "end"


class JobStopped(Exception):
    """Raised inside the loop, at a pause, to end the job where it stands."""


class TrainerJob:
    """One ``Trainer.train(resume_from_checkpoint=...)`` run, paused at ``(BEGIN, step)`` and ``(END, step)``."""

    def __init__(self, trainer: Any, resume: str | None,
                 scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> None:
        """``scope``: a context the whole run stays in (e.g. Paddle's name scope, which a run in a thread does
        not inherit from the code that built the trainer)."""
        self.trainer = trainer
        self._scope = scope
        self._commands: queue.Queue[str] = queue.Queue()
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.at: tuple[str, int] | None = None
        self.finished = False
        trainer.callback_handler.callbacks.insert(1, _gate(self))  # after the default flow, before the rest
        self._thread = threading.Thread(target=self._run, args=(resume,), name="trainer-job", daemon=True)
        self._thread.start()
        self._next()

    def go(self) -> tuple[str, int]:
        """Run to the next pause."""
        return self._send("go")

    def save_here(self) -> tuple[str, int]:
        """At a step's end: have the loop save this step, then run to the next step's begin."""
        if self.at is None or self.at[0] != END:
            raise RuntimeError(f"the loop saves at a step's end; the job is at {self.at}")
        return self._send("save")

    def stop(self) -> None:
        """End the loop where it stands (the thread unwinds out of ``train``)."""
        if not self.finished:
            self._commands.put("stop")
            self._thread.join()
            self.finished = True

    def _send(self, command: str) -> tuple[str, int]:
        if self.finished:
            raise RuntimeError("the Trainer job has ended")
        self._commands.put(command)
        return self._next()

    def _next(self) -> tuple[str, int]:
        kind, value = self._events.get()
        if kind == "error":
            self.finished = True
            self._thread.join()
            raise value
        if kind == "done":
            self.finished = True
            self._thread.join()
            raise RuntimeError(f"the Trainer job ended by itself after step {value}")
        self.at = (kind, value)
        return self.at

    def _run(self, resume: str | None) -> None:
        try:
            with self._scope():
                self.trainer.train(resume_from_checkpoint=resume)
        except JobStopped:
            self._events.put(("stopped", -1))
        except BaseException as exc:  # handed to the harness thread, which raises it
            self._events.put(("error", exc))
        else:
            self._events.put(("done", self.trainer.state.global_step))

    def pause(self, kind: str, step: int) -> str:
        """Called in the job's thread: report where the loop stands, wait for the harness's command."""
        self._events.put((kind, step))
        command = self._commands.get()
        if command == "stop":
            raise JobStopped()
        return command


def _gate(job: TrainerJob) -> Any:
    from paddleformers.trainer import TrainerCallback

    class Gate(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            job.pause(BEGIN, state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # the harness decides, not the loop's schedule (the default flow may have set it from save_steps)
            control.should_save = job.pause(END, state.global_step) == "save"

    return Gate()
