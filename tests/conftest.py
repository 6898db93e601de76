"""Root test configuration: fixtures live in tests/plugins, one module per real service."""

pytest_plugins = ["tests.plugins.kafka", "tests.plugins.clickhouse", "tests.plugins.worker"]
