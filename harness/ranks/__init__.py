"""Hosting the ranks of a world: the Runner interface and its runners (in-process, warm pool, virtual host), the
rank process and its rank-side execution, launching and reaping. Imports harness.sut and harness.ranks.virtual.
"""
