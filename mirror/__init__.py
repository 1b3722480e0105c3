"""The mirror's wire: what deltamirror writes to Kafka and reads back, written once.

The event records and their one encoder and decoder, headers, fragments, topic names and the
partitioner, the Kafka settings every command shares, and one typed wrapper over confluent-kafka
(the read-to-the-end loop lives there). ``deltamirror.core`` never imports this package;
``deltamirror.producer`` and ``deltamirror.consumer`` both do.
"""
