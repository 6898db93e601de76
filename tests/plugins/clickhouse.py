"""ClickHouse fixtures (filled in by the ClickHouse work)."""
