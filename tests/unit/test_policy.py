"""The policy: TOML loading, tenant overrides, validation, the example file, backoff."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from pipeline.core.errors import PolicyError
from pipeline.core.policy import DEFAULT_POLICY, TenantPolicy, policy_from_mapping, policy_from_toml
from pipeline.core.policy_rules import BackoffConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "schemas" / "policy.example.toml"
MIN = 60_000


def test_toml_loading() -> None:
    """A TOML document sets version and defaults; unspecified fields keep their defaults."""
    policy = policy_from_toml(
        """
        policy_version = "p-7"
        [defaults.account_source]
        threshold = 3
        window_ms = 600000
        """
    )
    assert policy.policy_version == "p-7"
    assert policy.defaults.account_source.threshold == 3
    assert policy.defaults.account_source.window_ms == 600_000
    assert policy.defaults.account_source.mode == "enforce"
    assert policy.defaults.account.threshold == 50


def test_tenant_overrides_merge_over_defaults() -> None:
    """[tenants.x] is merged key by key over [defaults], nested tables included."""
    policy = policy_from_toml(
        """
        [defaults.account]
        threshold = 40
        [defaults.source]
        mode = "enforce"
        [tenants.acme]
        case_sensitive = true
        [tenants.acme.account]
        window_ms = 300000
        """
    )
    acme = policy.for_tenant("acme")
    assert acme.account.threshold == 40  # from defaults
    assert acme.account.window_ms == 300_000  # from the override
    assert acme.source.mode == "enforce"
    assert acme.case_sensitive is True
    assert policy.for_tenant("other") is policy.defaults
    assert policy.for_tenant("other").account.window_ms == 900_000


def test_empty_document_is_the_default_policy() -> None:
    """An empty document gives DEFAULT_POLICY."""
    assert policy_from_toml("") == DEFAULT_POLICY


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[defaults.account_source]\nthreshold = 0", "threshold"),
        ("[defaults.account]\nmode = 'block'", "mode"),
        ("[defaults.device]\nwindow_ms = 10", "window_ms"),
        ("[defaults]\nsub_buckets = 0", "sub_buckets"),
        ("[defaults]\nentry_cap = 1", "entry_cap"),
        ("[defaults.stuffing]\nunknown_ratio = 1.5", "unknown_ratio"),
        ("[defaults]\nallowlist = ['10.0.0.0/33']", "allowlist"),
        ("[defaults]\nthreshhold = 5", "threshhold"),
        ("[defaults.backoff]\ncap_ms = 100000000000000", "cap_ms"),
    ],
)
def test_invalid_values_name_the_field(text: str, field: str) -> None:
    """An invalid value raises PolicyError whose message names the field."""
    with pytest.raises(PolicyError, match=field):
        policy_from_toml(text)


def test_invalid_tenant_override_names_tenant_and_field() -> None:
    """An invalid tenant override names both the tenant and the field."""
    with pytest.raises(PolicyError, match=r"(?s)tenants\.acme.*threshold"):
        policy_from_toml("[tenants.acme.uia]\nthreshold = -1")


def test_cap_must_not_be_below_base() -> None:
    """backoff.cap_ms < backoff.base_ms is rejected, also when a tenant lowers the cap."""
    with pytest.raises(PolicyError, match="cap_ms"):
        policy_from_toml("[defaults.backoff]\nbase_ms = 600000\ncap_ms = 60000")
    with pytest.raises(PolicyError, match=r"(?s)tenants\.t\].*cap_ms"):
        policy_from_toml("[tenants.t.backoff]\ncap_ms = 60000")


def test_unknown_top_level_key_and_bad_toml() -> None:
    """Unknown top-level keys and broken TOML raise PolicyError."""
    with pytest.raises(PolicyError, match="unknown top-level"):
        policy_from_mapping({"rules": {}})
    with pytest.raises(PolicyError, match="not valid TOML"):
        policy_from_toml("[defaults")
    with pytest.raises(PolicyError, match="must be a table"):
        policy_from_mapping({"tenants": {"a": 3}})


def test_policy_is_frozen() -> None:
    """Policies are immutable once built."""
    with pytest.raises(ValueError, match="frozen"):
        DEFAULT_POLICY.defaults.account.threshold = 1  # type: ignore[misc]


def test_backoff_curve_and_cap() -> None:
    """Blocks go 15, 30, 60, 60 minutes: min(cap, base * 2^(k-1))."""
    b = DEFAULT_POLICY.defaults.backoff
    assert [b.block_ms(k) for k in (1, 2, 3, 4, 5)] == [
        15 * MIN,
        30 * MIN,
        60 * MIN,
        60 * MIN,
        60 * MIN,
    ]
    assert b.block_ms(10_000) == b.cap_ms == 60 * MIN
    assert b.block_ms(0) == 15 * MIN


def test_cap_holds_for_huge_k_with_a_huge_cap() -> None:
    """With a cap above base * 2^40 the curve still reaches exactly the cap."""
    b = BackoffConfig(base_ms=1000, cap_ms=300 * 24 * 3600 * 1000)
    assert b.block_ms(10_000) == b.cap_ms
    assert b.block_ms(3) == 4000


@given(
    base=st.integers(1000, 10**9),
    extra=st.integers(0, 10**9),
    k=st.integers(1, 100_000),
)
def test_backoff_property(base: int, extra: int, k: int) -> None:
    """block_ms(k) == min(cap, base * 2^(k-1)) for every k, and never exceeds the cap."""
    b = BackoffConfig(base_ms=base, cap_ms=base + extra)
    assert b.block_ms(k) == min(b.cap_ms, base * 2 ** (k - 1))


def _field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for name, info in model.model_fields.items():
        annotation: Any = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths |= _field_paths(annotation, f"{prefix}{name}.")
        else:
            paths.add(prefix + name)
    return paths


def _doc_paths(doc: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, value in doc.items():
        if isinstance(value, dict):
            paths |= _doc_paths(value, f"{prefix}{key}.")
        else:
            paths.add(prefix + key)
    return paths


def test_example_file_equals_the_defaults() -> None:
    """schemas/policy.example.toml loads and equals DEFAULT_POLICY but for its version."""
    policy = policy_from_toml(EXAMPLE.read_text())
    assert policy.policy_version == "example-1"
    assert (
        policy.model_copy(update={"policy_version": DEFAULT_POLICY.policy_version})
        == DEFAULT_POLICY
    )


def test_example_file_documents_every_field() -> None:
    """Every TenantPolicy field appears in the example's [defaults]."""
    doc = tomllib.loads(EXAMPLE.read_text())
    assert _doc_paths(doc["defaults"]) == _field_paths(TenantPolicy)


def test_partial_rule_table_in_defaults_keeps_builtin_values() -> None:
    """[defaults.source] with only a threshold keeps mode observe (no silent enforce)."""
    policy = policy_from_toml("[defaults.source]\nthreshold = 300")
    assert policy.defaults.source.threshold == 300
    assert policy.defaults.source.mode == "observe"
    only_mode = policy_from_toml("[defaults.uia]\nmode = 'observe'")
    assert (only_mode.defaults.uia.threshold, only_mode.defaults.uia.mode) == (5, "observe")


def test_case_sensitive_tenants_from_the_policy() -> None:
    """case_sensitive_tenants lists the tenants whose policy sets case_sensitive."""
    policy = policy_from_toml(
        "[tenants.strict]\ncase_sensitive = true\n[tenants.loose.account]\nthreshold = 9"
    )
    assert policy.case_sensitive_tenants() == frozenset({"strict"})
