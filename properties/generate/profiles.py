"""Hypothesis profiles of the project: ``dev`` (quick, local), ``ci`` (bounded, deterministic), ``nightly`` (long).

Hypothesis loads a built-in profile named "ci" when CI=true; registering our own under that name replaces it, so
CI gets our bounds. ``CKPT_HARNESS_PROFILE`` picks a profile explicitly.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


def register() -> str:
    settings.register_profile("dev", max_examples=40, **_COMMON)
    settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_COMMON)
    settings.register_profile("nightly", max_examples=3000, print_blob=True, **_COMMON)
    name = os.environ.get("CKPT_HARNESS_PROFILE") or ("ci" if os.environ.get("CI", "").lower() == "true" else "dev")
    settings.load_profile(name)
    return name
