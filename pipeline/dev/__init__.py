"""Development tooling: the local single-node Kafka broker (`authpipe stack`). Not imported by
the runtime packages (contracts, core, stream, sinks, edge, sim)."""
