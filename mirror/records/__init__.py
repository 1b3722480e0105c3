"""The records of the topics (private): one encoder per topic, the one decoder, headers, fragments, the boundary.

Encoders, each returning finished records (record.py): actions.py, commits.py, progress.py,
signals.py, dead_letters.py; row changes: row_changes.py, row_records.py, row_formats.py (one class
per format: its bytes, its values, its Spark DDL), connect_types.py, row_pairing.py. events.py (the
models, the envelope, the one decoder), event_batches.py, boundary.py, headers.py, fragments.py;
spark_ddl.py (the values' Spark DDL), spark_types.py (Delta types as Spark DDL).
"""
