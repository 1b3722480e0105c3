"""Following one table's log (private): what to publish next, from where the last publish stopped.

watcher.py, work.py (units of work), snapshot_events.py (a state as events), waker.py + inotify.py
(woken by the file system), retention.py. Knows nothing of Kafka.
"""
