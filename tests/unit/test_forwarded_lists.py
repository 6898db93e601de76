"""X-Forwarded-For handed over as a list whose entries hold comma-joined header values
(issue 26 item 13): each entry is split on its commas, in the worker and at the edge, so
the client is found as in the one joined header, never the trusted proxy."""

from __future__ import annotations

import pytest

from pipeline.core.normalise import NetworkSet, SourceRules
from pipeline.edge.inputs import split_forwarded
from tests.unit.test_edge_support import T0, message, new_view, source_key

RULES = SourceRules(trusted_proxies=NetworkSet(["10.0.0.0/8"]))


@pytest.mark.parametrize(
    ("hops", "source"),
    [
        (["6.6.6.6, 198.51.100.2"], "198.51.100.2"),  # the example
        (["6.6.6.6,198.51.100.2", "10.0.0.7"], "198.51.100.2"),
        (["6.6.6.6", "198.51.100.2, 10.0.0.7"], "198.51.100.2"),
        (["198.51.100.2, unknown"], "10.0.0.1"),  # a bad hop still stops the walk
        (["6.6.6.6, , 198.51.100.2,"], "198.51.100.2"),  # empty parts are no hops
    ],
)
def test_a_list_entry_with_commas_is_split_into_hops(hops: list[str], source: str) -> None:
    """The source of a list equals the source of the same hops as one joined header."""
    assert RULES.source_of("10.0.0.1", hops) == source
    assert RULES.source_of("10.0.0.1", [", ".join(hops)]) == source


def test_the_edge_splits_list_entries_like_the_header_string() -> None:
    """split_forwarded gives a list of header lines the hops of the joined header."""
    lines = ("6.6.6.6, 198.51.100.2", "10.0.0.7")
    assert split_forwarded(lines) == split_forwarded(", ".join(lines))
    assert split_forwarded(lines) == ("6.6.6.6", "198.51.100.2", "10.0.0.7")
    line = ", ".join(f"10.0.0.{i}" for i in range(1, 14))  # 129 characters, 13 hops
    assert split_forwarded((line,)) == tuple(f"10.0.0.{i}" for i in range(1, 14))


def test_a_block_on_the_client_refuses_its_list_shaped_check() -> None:
    """With a block on 198.51.100.2, a check through proxy 10.0.0.1 whose forwarded_for is
    ['6.6.6.6, 198.51.100.2'] is refused (the proxy is not taken for the client)."""
    view = new_view()
    view.apply(*message(source_key("198.51.100.2"), T0 + 60_000))
    verdict = view.check("default", "alice", "10.0.0.1", ("6.6.6.6, 198.51.100.2",))
    assert verdict.allowed is False
    assert view.check("default", "alice", "10.0.0.1", ("6.6.6.6",)).allowed is True
