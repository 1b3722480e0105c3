"""Shared fixtures: one Kafka broker and one SparkSession per test session (started only if used)."""

pytest_plugins = ["support.kafka", "support.spark"]
