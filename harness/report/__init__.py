"""What a run leaves behind: finding JSON, summary.json, report.md and report.html, the crash-point map and the
console tables. Imports the campaign's result types and below; runs nothing.
"""
