"""authpipe: an event-sourced auth-abuse analytics pipeline.

Data flows top to bottom through the subpackages:
contracts (wire models) -> core (pure policy) -> stream (faust workers)
-> sinks (ClickHouse) / edge (gateways) ; sim (simulate, score, backtest).
"""

__version__ = "0.1.0"
