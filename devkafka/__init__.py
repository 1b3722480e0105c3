"""deltamirror.devkafka: a real Apache Kafka broker for laptops, tests and the demo (a tool, not the product).

A single-node KRaft broker run from pinned, checksum-verified jars (:mod:`.jars`), plain or with a
SCRAM + TLS listener (:mod:`.security`). Used by ``deltamirror local kafka`` and the test suite;
the producer and the consumers never import it.
"""
