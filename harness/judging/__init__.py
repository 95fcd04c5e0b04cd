"""Running one case and judging it: its ops across the ranks, a fault armed around one op, fault scenarios,
virtual against real. Imports harness.ranks, harness.sut and properties/.
"""
