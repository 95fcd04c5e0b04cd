"""One emitter per system under test: the framework's set-up, tensors, steps and launcher as script text, which
harness.repro.render assembles into ``repro.py`` and ``run.sh`` (an emitter is looked up by SUT name, render.EMITTERS).
Emitters of one framework share its text module (``paddle_text``, ``torch_text``). Imports harness.repro's script
model and render, and the adapters' dtype tables (harness.sut): the script speaks the adapter's language."""
