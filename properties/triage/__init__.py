"""What a failure is: root-cause buckets and the known findings that explain anomalies.
Imports properties.check and properties.model.
"""
