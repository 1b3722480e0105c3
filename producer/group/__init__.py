"""The group (private): which tables run on this member, and one producer per shard.

sharing.py (the membership, talking to the service through :class:`~.sharing.GroupHost`),
shard_producers.py.
"""
