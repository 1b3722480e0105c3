"""deltamirror.core: the Delta Lake protocol, with no Kafka and no Spark in it."""
