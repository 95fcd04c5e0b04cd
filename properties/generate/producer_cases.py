"""P-MODEL cases: a model and its optimizer whose ``sharded_state_dict`` gives the state (reference/producers.py),
saved under one producer's parallelism of one degree (tensor parallelism, sharding stage 1 V2) and loaded into the
same model under the same producer of the same or another degree. The tensors and layouts are the producer's,
drawn by the model's sizes and layers; the values are the case's."""

from __future__ import annotations

import math
from collections.abc import Iterable

from hypothesis import strategies as st

from properties.generate.cases import Caps, load_world_of, options
from properties.model.case import Case, Op, TensorCase
from reference import producers
from reference.producers import LAYERS, PARAM_DTYPES, PRODUCER, PRODUCERS

# What a producer case leaves to the producer: how tensors are wrapped and named, and the loads of other APIs.
_LEFT_OUT = ("tensor_kind", "nested", "empty_dicts", "mw_names", "load_api", "full_param_groups",
             "full_param_splits", "split_families", "same_dir")


@st.composite
def producer_cases(draw, prop: str, sut: str, ranks: int, capabilities: Iterable[str]) -> Case:
    caps = Caps(capabilities)
    opts = {k: v for k, v in draw(options(caps)).items() if k not in _LEFT_OUT}
    producer = draw(st.sampled_from([p for p in PRODUCERS if f"producer:{p}" in caps.caps]))
    save_world = draw(st.integers(1, ranks))
    load_world = draw(load_world_of(caps, opts, ranks)) if caps.reshard else save_world
    layers = tuple(draw(st.lists(st.sampled_from(LAYERS), min_size=1, max_size=len(LAYERS), unique=True)))
    dtype = draw(st.sampled_from([d for d in PARAM_DTYPES if d in caps.dtypes] or list(PARAM_DTYPES)))
    if producer == "tp":  # tensor parallelism splits vocab and ffn evenly on both sides
        unit = math.lcm(save_world, load_world)
        vocab, ffn = (unit * draw(st.integers(1, 2)) for _ in range(2))
    else:  # sizes about a fused buffer's slots (reference.producers.ALIGN_BYTES): parameters that straddle ranks
        vocab, ffn = (draw(st.integers(1, 200)) for _ in range(2))
    hidden = draw(st.integers(1, 3))
    given = producers.tensors(tuple(sorted(layers, key=LAYERS.index)), vocab, hidden, ffn, dtype,
                              optimizer=draw(st.booleans()))
    tensors = tuple(TensorCase(name, dt, shape, draw(st.integers(0, 2**16)))
                    for name, (dt, shape) in sorted(given.items()))
    opts[PRODUCER] = producer
    save, load = (producers.layouts(producer, given, world) for world in (save_world, load_world))
    return Case(prop, sut, tensors, {n: save[n].to_json() for n in sorted(given)},
                {n: load[n].to_json() for n in sorted(given)},
                (Op("save", "step-1", 0), Op("load", "step-1", 0)), opts, draw(st.integers(0, 2**16)))
