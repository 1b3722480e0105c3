"""Which tables exist (private): found under a prefix, named at start, asked for by signals.

scan.py (discovery), table_check.py (the named tables exist), topic_claims.py (no two tables on one
topic), signals.py (operators' on-demand snapshots).
"""
