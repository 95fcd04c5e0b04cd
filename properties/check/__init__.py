"""Pure checkers over a recorded outcome: the oracle, the tensor-state checks and the history checker with its
facts and typed anomalies. Imports properties.model and reference/; never a process or a file.
"""
