"""The data model every stage shares: a case (what happens), its recorded outcome and the verdicts.
Imports only reference/ (and faults/ for the fault spec); nothing else of properties/.
"""
