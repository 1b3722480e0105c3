"""The mutation framework: real tables broken one way at a time, and what every command must do.

``cases.py`` generates the cases (one class per kind of bad input, its expectation per command);
the mutators by what they break (``lines``, ``commits``, ``checkpoints``, ``dvs``, ``paths``,
``logs``, ``core``); ``runner.py`` runs each command on a case (``exec.py``: one command, bounded),
``summary.py`` reports. ``test_generator.py`` and ``test_mutations.py`` are its tests; ``python
tests/mutation`` (``make fuzz``) is the full campaign.
"""
