"""The edge: what gateways run to enforce decisions in near real time.

One module, one job, in the order a decision travels:

* ``decode``: a message of the decisions topic as the view keeps it (no I/O).
* ``view``: ``DecisionView``, the decisions in memory and the in-process ``check``
  (no I/O); ``inputs``: the one validator of each check argument; ``changes``: the
  signals it bumps when its decisions or its block-list change.
* ``feed``: ``DecisionFeed``, follows the compacted topic into a view (aiokafka, no
  consumer group; readiness, lag, staleness); ``health``: what the service asks of it.
* ``blocklist``: the source block-list rendered as JSON, text or nginx.
* ``http_input``: HTTP query parameters and JSON bodies as checks and feed queries.
* ``handlers``: the aiohttp app (``create_app``) and its handlers, the block-list's in
  ``blocklist_http``; ``metrics``: its Prometheus registry; ``loglimit``: the refusal
  log's budget.
* ``fastpath``: plain ``GET /v1/check`` answered on the connection, for the request
  heads ``check_head`` reads exactly as aiohttp would; ``slowclients``:
  the limits on slow heads and connection counts shared by both HTTP paths.
* ``service``: ``authpipe edge serve``, the process (listen, follow, stop on a signal).
* ``errors``: ``EdgeError``, the base of the edge's errors, and ``CheckInputError``.
"""

from pipeline.edge.errors import CheckInputError, EdgeError
from pipeline.edge.feed import DecisionFeed
from pipeline.edge.view import DecisionView

__all__ = ["CheckInputError", "DecisionFeed", "DecisionView", "EdgeError"]
