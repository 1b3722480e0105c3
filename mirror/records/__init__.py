"""The records of the topics (private): encoders, the one decoder, headers, fragments, the boundary.

events.py, event_batches.py, boundary.py, headers.py, fragments.py; row changes: row_changes.py,
row_records.py, connect_types.py, row_pairing.py; spark_ddl.py (the values' Spark DDL).
"""
