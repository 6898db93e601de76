"""Kafka broker fixtures (filled in by the stack work)."""
