"""Sinks: where authpipe writes its audit rows, decisions and alerts (ClickHouse)."""
