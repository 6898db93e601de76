"""The edge: what gateways run to enforce decisions in near real time.

* ``pipeline.edge.view``: ``DecisionView`` (the decisions in memory and the in-process
  ``check``, no I/O) and ``DecisionFeed`` (follows the compacted decisions topic into a
  view without a consumer group; readiness, lag, staleness).
* ``pipeline.edge.blocklist``: the source block-list rendered as JSON, text or nginx.
* ``pipeline.edge.service``: ``authpipe edge serve``, the aiohttp service on a view.
"""

from pipeline.edge.view import CheckInputError, DecisionFeed, DecisionView, EdgeError

__all__ = ["CheckInputError", "DecisionFeed", "DecisionView", "EdgeError"]
