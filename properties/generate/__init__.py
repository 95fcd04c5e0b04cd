"""Hypothesis strategies: layouts and bits, cases per property, training, fault and lifecycle cases, swarm
configurations and profiles. Imports properties.model, reference/ and faults/.
"""
