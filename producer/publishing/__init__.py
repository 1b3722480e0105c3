"""Publishing (private): a table's units of work as records in Kafka transactions, and its progress.

transactions.py, progress.py, session.py, shared_clients.py, row_events.py (row_transform.py: their
filters and masks), offline_events.py, tails.py (what the topics hold past the progress), hanging.py
(transactions nobody ends).
"""
