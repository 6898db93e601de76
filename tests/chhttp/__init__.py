"""A chdb-backed stand-in for a ClickHouse server's HTTP interface.

Test fixture, not a product part: it lets the tests drive clickhouse-connect's real HTTP
path (the production backend) on a machine where no modern ClickHouse server can be
installed. Run it as ``python -m tests.chhttp --host 127.0.0.1 --port P --path DIR``;
it is ready when ``GET /ping`` answers ``Ok.``. See :mod:`tests.chhttp.server` for what
of the HTTP interface it implements.
"""
