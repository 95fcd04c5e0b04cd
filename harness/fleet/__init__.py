"""`ckpt-harness fleet`: a plan of campaigns as Ray tasks, each shard a bounded `fuzz` process, merged into one
report. Imports harness.report, harness.campaign's corpus and below.
"""
