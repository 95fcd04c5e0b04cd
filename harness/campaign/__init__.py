"""The fuzz campaign: the time-bounded Hypothesis loop over properties, its corpus, reduction past Hypothesis
and bounded-exhaustive crash exploration. Imports harness.judging and below.
"""
