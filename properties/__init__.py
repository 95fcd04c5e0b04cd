"""Hypothesis strategies (what happens) and pure checkers (what is judged) over recorded outcomes."""
