"""The typed confluent-kafka wrappers (private): the one producer, the one read loop, the connection.

producer.py, consumer.py, clients.py (every client is made there: librdkafka's logs routed),
connection.py, login_check.py. The only package that imports confluent_kafka (with devkafka's admin
calls).
"""
