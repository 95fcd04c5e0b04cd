"""What a rank process's garbage collector walks: only what the running case made.

A rank process (harness.ranks.worker, harness.ranks.virtual_host) keeps the framework, the SUT's set-up and whatever
its first cases imported or cached for as long as it lives, and Paddle calls ``gc.collect()`` after every load: a full
collection walking all of that was up to a sixth of a small virtual case. So what outlives a case is frozen
(``gc.freeze``: never walked, still freed by reference counting) once the case has ended; every ``THAW_EVERY``
cases it is thawed and collected once, so a reference cycle that died after being frozen is freed within that many
cases rather than never. A case still starts after its predecessor's garbage is collected.
"""

from __future__ import annotations

import gc

THAW_EVERY = 256


class GcFreezer:
    """Collects a rank process's garbage and freezes what survives, thawing every ``THAW_EVERY`` calls."""

    def __init__(self) -> None:
        self.collections = 0

    def collect_and_freeze(self) -> None:
        """After set-up or a case: collect what died, freeze what is left."""
        self.collections += 1
        if self.collections % THAW_EVERY == 0:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
