"""Deliberately broken SUTs: the harness must catch each bug, shrink it small, and replay it.

They wrap the reference and break one thing, the way real checkpoint bugs do.
"""

from __future__ import annotations

import numpy as np

from harness.sut.reference import ReferenceSut


class FlipsLastElementSut(ReferenceSut):
    """Loads return data whose last element has its lowest bit flipped (silent corruption)."""

    name = "flips-last-element"

    def load_rank(self, root, name, specs, layouts, rank):
        out = super().load_rank(root, name, specs, layouts, rank)
        for tensor in out.values():
            if tensor.bits.size:
                flat = tensor.bits.reshape(-1)
                flat[-1] ^= np.array(1, dtype=flat.dtype)
        return out


class LoadsLatestAlwaysSut(ReferenceSut):
    """Ignores the version asked for and loads the latest (a P-REPEAT bug)."""

    name = "loads-latest-always"

    def load_rank(self, root, name, specs, layouts, rank):
        return super().load_rank(root, None, specs, layouts, rank)


class NoSnapshotAsyncSut(ReferenceSut):
    """Async save that does not snapshot: it waits until the caller's mutation lands, then writes."""

    name = "no-snapshot-async"

    def save_world(self, root, name, state, layouts, *, use_async):
        if not use_async:
            return super().save_world(root, name, state, layouts, use_async=False)
        sut = self

        class Deferred:
            def wait(self):
                return ReferenceSut.save_world(sut, root, name, state, layouts, use_async=False)

        return Deferred()
