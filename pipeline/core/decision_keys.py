"""Which decision keys an attempt is checked against: one builder per kind of key.

The refusal check (``pipeline.core.decisions``) is shared by the worker (for audit) and
the edge (for enforcement). An attempt ``(tenant, account, source, device, trusted, flow)`` is refused exactly when
an unexpired ``block`` decision applies to it; ``retry_after_ms`` is the longest
remaining block. Which decisions apply is decided by key, so the check is a handful of
dict lookups:

* every flow but ``reset``: ``source|t|-|s|-`` (a rule's source decision), except a
  password flow from a device trusted for the account: a rule-issued source decision
  never refuses or challenges the owner's trusted device;
* password flows from a trusted device: ``device|t|a|-|d`` and the account's bound on
  distinct failing trusted devices ``device|t|a|-|-``, never the
  account_source or account blocks: a stranger cannot lock the owner out of their device;
* other password flows: ``familiar|t|a|s|-`` (the account succeeded from this source:
  an ``exempt`` that lifts the wave's challenge and rule-issued source decisions for the
  pair) and ``familiar|t|a|-|d`` (the account succeeded with this untrusted device
  cookie or app install id: the same exempt for that client), ``passed|t|a|-|d``
  (``passed|t|a|s|-`` without a cookie: the client passed a CAPTCHA for the account, which
  voids CAPTCHAs only), ``account_source|t|a|s|-``, ``account|t|a|-|-``, the
  consecutive-failure lock
  ``lock|t|a|-|-`` (seed 002, and the lifetime bound) and the tenant's wave challenge
  ``tenant|t|-|-|-``;
* ``reset`` (a reset proven through the mailbox): operators' decisions only;
* ``uia``: ``uia|t|a|-|<session or device>`` (or ``uia|t|a|s|-`` with neither), and
  ``uia|t|a|-|<device>`` as well when both a session and a device are given (seed 000:
  a new session per attempt from one device is still counted against that device);
* ``mfa``: ``mfa|t|a|-|<device or session>`` (or ``mfa|t|a|s|-`` with neither), and the
  account's consecutive bound over every device ``mfa|t|a|-|-`` (NIST's 100);
* every flow, operators' decisions (``authpipe decisions add``): ``source|t|-|s|manual``
  and ``account|t|a|-|manual``. The ``manual`` device slot keeps them apart from the
  rules' keys, so a rule's tombstone never lifts an operator's block, nor the reverse.

A ``challenge`` decision refuses nothing: the verdict is allowed and names the
challenge (``captcha`` before the password is checked, ``step_up`` after a correct one);
a block in force wins over it.
"""

from __future__ import annotations

from pipeline.core.attempt import PASSWORD_FLOWS, Attempt
from pipeline.core.keys import Key, decision_key

MANUAL = "manual"
"""The device slot of an operator's decision key."""
VERIFY = "verify"
"""The device slot of ``verify_key``: the name a verification's verdict gives its rule
(``Verdict.challenge_key``), never a decision's key: verification is policy, read by the
worker, the edge and a replay alike from the same file (``VerifyConfig``)."""


def uia_key(tenant: str, account: str, source: str, session: str | None, device: str | None) -> Key:
    """The re-auth bucket: per session, else per device, else per source."""
    handle = session or device
    if handle:
        return decision_key("uia", tenant, account, None, handle)
    return decision_key("uia", tenant, account, source, None)


def uia_device_key(
    tenant: str, account: str, session: str | None, device: str | None
) -> Key | None:
    """The re-auth bucket of the device when the attempt also has a session (else None:
    ``uia_key`` is already the device's bucket or there is no device)."""
    if session and device:
        return decision_key("uia", tenant, account, None, device)
    return None


def lock_key(tenant: str, account: str) -> Key:
    """The account's consecutive-failure lock (seed 002) and lifetime bound."""
    return ("lock", tenant, account, None, None)


def tenant_key(tenant: str) -> Key:
    """The tenant's wave challenge (``pipeline.core.rollup``)."""
    return ("tenant", tenant, None, None, None)


def verify_key(tenant: str) -> Key:
    """What a verdict names as the key of the tenant's verification (``VerifyConfig``)."""
    return ("tenant", tenant, None, None, VERIFY)


def familiar_key(tenant: str, account: str, source: str) -> Key:
    """The account's familiarity with a source (it succeeded from there)."""
    return ("familiar", tenant, account, source, None)


def reset_key(tenant: str, account: str) -> Key:
    """The account's new password (``FamiliarConfig.after_reset_ms``): an entry of the
    familiar table that is never published, so no decision has this key."""
    return ("familiar", tenant, account, None, None)


def mfa_account_key(tenant: str, account: str) -> Key:
    """The account's consecutive second-factor bound, over every device and session."""
    return ("mfa", tenant, account, None, None)


def mfa_key(tenant: str, account: str, source: str, device: str | None, session: str | None) -> Key:
    """The second-factor bucket: per device, else per session, else per source."""
    handle = device or session
    if handle:
        return decision_key("mfa", tenant, account, None, handle)
    return decision_key("mfa", tenant, account, source, None)


_NO_KEY: Key = ("", "", None, None, None)
"""A key no decision has: holds a slot of the check's fixed layout."""


def applicable_keys(
    tenant: str,
    account: str,
    source: str,
    device: str | None,
    session: str | None,
    trusted: bool,
    flow: str,
) -> tuple[Key, ...]:
    """The decision keys that can refuse this attempt (see the module docstring)."""
    # Inlined decision_key tuples: this runs once per event on the hot path.
    source_key: Key = ("source", tenant, None, source, None)
    manual_source: Key = ("source", tenant, None, source, MANUAL)
    manual_account: Key = ("account", tenant, account, None, MANUAL)
    if flow in PASSWORD_FLOWS:
        if trusted and device:
            return (
                ("device", tenant, account, None, device),
                ("device", tenant, account, None, None),  # past the trusted-device bound
                manual_source,
                manual_account,
            )
        return (
            ("familiar", tenant, account, source, None),  # first: they qualify the ones after
            ("familiar", tenant, account, None, device) if device else _NO_KEY,
            ("passed", tenant, account, None, device)
            if device
            else ("passed", tenant, account, source, None),
            source_key,
            ("account_source", tenant, account, source, None),
            ("account", tenant, account, None, None),
            ("lock", tenant, account, None, None),
            ("tenant", tenant, None, None, None),
            manual_source,
            manual_account,
        )
    if flow == "reset":
        return (manual_source, manual_account)
    if flow == "uia":
        uia = uia_key(tenant, account, source, session, device)
        if session and device:
            return (
                source_key,
                uia,
                ("uia", tenant, account, None, device),
                manual_source,
                manual_account,
            )
        return (source_key, uia, manual_source, manual_account)
    if flow == "mfa":
        return (
            source_key,
            mfa_key(tenant, account, source, device, session),
            ("mfa", tenant, account, None, None),
            manual_source,
            manual_account,
        )
    return (source_key, manual_source, manual_account)


def keys_for(attempt: Attempt) -> tuple[Key, ...]:
    return applicable_keys(
        attempt.tenant,
        attempt.account,
        attempt.source,
        attempt.device,
        attempt.session,
        attempt.trusted,
        attempt.flow,
    )
