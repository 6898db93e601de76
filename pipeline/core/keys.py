"""One function per kind of key, each with its namespace prefix.

Accounts, devices and sessions are identified by a keyed BLAKE2b-128 digest (32 hex
characters) of the tenant and the identifier, so no plain identifier leaves the worker
and gateways holding the same key compute the same digest. Sources are canonical
address text (at most 43 characters), tenants at most 64: every key has a bounded size
whatever identifiers attackers send.
"""

from __future__ import annotations

import hashlib

from pipeline.contracts.models import TENANT_RULE, valid_tenant

DIGEST_BYTES = 16
NONE = "-"


class Digester:
    """Keyed BLAKE2b-128 digests with one namespace per identifier kind."""

    __slots__ = ("_key",)

    def __init__(self, key: str | bytes) -> None:
        raw = key.encode() if isinstance(key, str) else key
        # BLAKE2b keys are at most 64 bytes; longer secrets are hashed down first.
        self._key = raw if len(raw) <= 64 else hashlib.blake2b(raw).digest()

    def _digest(self, namespace: bytes, tenant: str, value: str) -> str:
        h = hashlib.blake2b(digest_size=DIGEST_BYTES, key=self._key)
        h.update(namespace)
        # surrogatepass: a lone surrogate must give a digest, never an exception.
        h.update(tenant.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
        h.update(value.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def account(self, tenant: str, normalised_account: str) -> str:
        """Digest of a normalised account within its tenant."""
        return self._digest(b"acct\x00", tenant, normalised_account)

    def device(self, tenant: str, device_id: str) -> str:
        """Digest of a device cookie id within its tenant."""
        return self._digest(b"dev\x00", tenant, device_id)

    def session(self, tenant: str, session_id: str) -> str:
        """Digest of a session id within its tenant."""
        return self._digest(b"sess\x00", tenant, session_id)


Key = tuple[str, str, str | None, str | None, str | None]
"""(scope, tenant, account_digest, source, device): a key inside the core. Tuples, not
strings, on the hot path: building one costs a third of formatting a string, and the
digests inside them keep their cached hashes."""


def decision_key(
    scope: str, tenant: str, account_digest: str | None, source: str | None, device: str | None
) -> Key:
    """The key of a decision (and of the counter that issues it)."""
    return (scope, tenant, account_digest, source, device)


def format_key(key: Key) -> str:
    """``<scope>|<tenant>|<account_digest or ->|<source or ->|<device or ->``: the Kafka key."""
    scope, tenant, account, source, device = key
    return f"{scope}|{tenant}|{account or NONE}|{source or NONE}|{device or NONE}"


def parse_key(text: str) -> Key:
    """The inverse of format_key; raises ValueError for a malformed key."""
    parts = text.split("|")
    if len(parts) != 5:
        raise ValueError(f"decision key {text[:200]!r} does not have 5 |-separated parts")
    scope, tenant, account, source, device = (None if p == NONE else p for p in parts)
    if not scope or not tenant:
        raise ValueError(f"decision key {text[:200]!r} lacks a scope or tenant")
    return (scope, tenant, account, source, device)


def parse_wire_key(text: str) -> Key:
    """``parse_key`` for a key read off the decisions topic (the edge, the sink, ``authpipe
    decisions``): its tenant must also pass the one tenant validator
    (``pipeline.contracts.models.valid_tenant``), so a key that no worker or operator can
    have written (``Acme``, control characters) is refused, never applied or stored.
    Raises ValueError saying what is wrong."""
    key = parse_key(text)
    if not valid_tenant(key[1]):
        raise ValueError(f"decision key {text[:200]!r}: {TENANT_RULE}")
    return key


def stable_id(*parts: str | int) -> str:
    """A deterministic 128-bit id of its parts (decision and alert ids are replayable)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(str(part).encode())
        h.update(b"\x1f")
    return h.hexdigest()
