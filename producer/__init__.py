"""deltamirror.producer: tail a table's _delta_log and publish every commit to Kafka."""
