"""Coverage of the systems under test: which lines and branches of the frameworks' checkpoint code the cases ran
(``measure``: in every process; ``merge``: per campaign, per label, across nights and shards; ``scope``: which
code; ``reachability``: which lines a CPU build cannot run). docs/coverage.md says how to read it. Imports
nothing of the project: the ranks record with it, the campaign and the reports read what they recorded."""
