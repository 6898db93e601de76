"""Keycloak alone against Keycloak with authpipe (issue 47 item 4), small: the side-by-side
bench's scripted attacks (bench/keycloak_side_by_side.py) at a reduced scale through the
session's Keycloak, once with Keycloak's brute-force detection and default flows, once with
authpipe's flows; authpipe's row must be at least as good on every line.

The session has the edge but no worker: authpipe decides here by its default policy alone
(every untrusted sign-in from a new place is verified), not by counting the attacks."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from bench.keycloak_side_by_side import Realm, Scale, run

if TYPE_CHECKING:
    from tests.plugins.keycloak import KeycloakStack

pytestmark = pytest.mark.integration

SMALL = Scale(
    dos_s=6.0,
    owner_every_s=2.0,
    spray_accounts=10,
    stuffing_pairs=6,
    stuffing_valid=(1, 4),
    people=4,
    people_with_otp=2,
    net=110,
)


def lines(row: dict[str, Any]) -> dict[str, int]:
    """The table's lines, each a count where fewer is better."""
    return {
        "owner refused": row["lockout_dos"]["owner_refused"],
        "spray takeovers": row["spray"]["takeovers"],
        "stuffing takeovers": row["stuffing"]["takeovers"],
        "people refused": row["people"]["refused"],
    }


def test_authpipe_is_at_least_as_good_as_keycloak_alone(keycloak_stack: KeycloakStack) -> None:
    """On every line (owner locked out, spray and stuffing takeovers, people refused)
    Keycloak with authpipe does no worse than Keycloak alone; with authpipe all are 0."""
    realm = Realm(keycloak_stack.keycloak)
    scale = Scale(**{**SMALL.__dict__, "tag": uuid.uuid4().hex[:6]})
    try:
        alone = run(keycloak_stack.url, realm, keycloak_stack.mail, alone=True, scale=scale)
        ours = run(keycloak_stack.url, realm, keycloak_stack.mail, alone=False, scale=scale)
    finally:
        realm.mode(alone=False)
    worse = {
        line: (lines(alone)[line], count)
        for line, count in lines(ours).items()
        if count > lines(alone)[line]
    }
    assert worse == {}, (alone, ours)
    assert lines(ours) == dict.fromkeys(lines(ours), 0), ours
    assert (ours["lockout_dos"]["owner_warm_sign_in"], ours["lockout_dos"]["owner_tries"]) == (
        True,
        3,
    )
