"""One frozen settings model, loaded from a TOML file plus ``AUTHPIPE_*`` variables.

Precedence (highest first): keyword arguments, environment, the TOML file, defaults.
Environment names join the section and the field with one underscore:
``AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS``, ``AUTHPIPE_CLICKHOUSE_URL``, ``AUTHPIPE_EDGE_PORT``.
The TOML file is ``authpipe.toml`` in the working directory, or the path in
``AUTHPIPE_CONFIG``; a missing default file is fine, a missing named file is an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from pipeline.errors import ConfigError

DEV_DIGEST_KEY = "authpipe-dev-key-change-me"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    bootstrap_servers: str = Field("127.0.0.1:9092", description="host:port[,host:port]")
    partitions: int = Field(8, ge=1, le=1024, description="partitions of every topic we create")
    replication_factor: int = Field(1, ge=1, description="1 on the local single-node broker")
    input_topic: str = Field("auth.login-attempts", description="login attempts from producers")
    decisions_topic: str = Field("auth.throttle-decisions", description="compacted decisions")
    alerts_topic: str = Field("auth.alerts", description="alerts, once per subject per window")
    dlq_topic: str = Field("auth.login-attempts.dlq", description="dead letters, bytes untouched")
    audit_topic: str = Field("auth.audit", description="audit rows for the ClickHouse sink")
    app_id: str = Field("authpipe", description="faust app id: consumer group and topic prefix")


class ClickHouseSettings(_Section):
    url: str | None = Field(None, description="http(s)://user:pass@host:8123; unset = embedded chdb")
    path: Path = Field(Path(".state/chdb"), description="chdb data directory (embedded mode)")
    database: str = Field("authpipe", description="database that holds every authpipe table")
    ttl_days: int = Field(90, ge=1, description="TTL of raw attempt rows")
    store_plain_account: bool = Field(False, description="also store the typed account in plain")


class IngestSettings(_Section):
    trusted_proxies: tuple[str, ...] = Field((), description="CIDRs whose X-Forwarded-For we trust")
    ipv6_prefix: int = Field(64, ge=1, le=128, description="IPv6 sources grouped by this prefix")
    ipv4_prefix: int = Field(32, ge=1, le=32, description="IPv4 sources grouped by this prefix")
    case_sensitive_tenants: tuple[str, ...] = Field(
        (), description="tenants whose account identifiers are case-sensitive"
    )
    max_event_bytes: int = Field(16384, ge=256, description="larger events are dead-lettered")
    max_future_skew_ms: int = Field(300_000, ge=0, description="events further ahead: dead-lettered")
    dedupe_horizon_ms: int = Field(3_600_000, ge=0, description="event_id duplicates within: once")
    dedupe_capacity: int = Field(1_000_000, ge=1, description="event ids a worker remembers, at most")


class IdentitySettings(_Section):
    digest_key: str = Field(
        DEV_DIGEST_KEY,
        min_length=16,
        description="secret key of the account digest; shared with gateways; set it in production",
    )


class WorkerSettings(_Section):
    batch_max_events: int = Field(5000, ge=1, description="events per batch at most")
    batch_max_wait_ms: int = Field(
        20, ge=1, description="ingest fills a batch for this long after its first record"
    )
    forward_linger_ms: int = Field(
        50, ge=0, le=10_000,
        description="forwards to the source stage and tenant shares gather this long before sending",
    )  # fmt: skip
    web_port: int = Field(6066, ge=0, le=65535, description="metrics and readiness port (0=any)")
    web_host: str = Field(
        "127.0.0.1", min_length=1,
        description="metrics and readiness bind address; 0.0.0.0 in a container",
    )  # fmt: skip
    entry_cap: int = Field(100_000, ge=10, description="entries per tenant per table")


class EdgeSettings(_Section):
    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(8080, ge=0, le=65535, description="HTTP port")
    token: str | None = Field(None, description="bearer token required when set")


class AuditSettings(_Section):
    rows_per_minute: int = Field(60, ge=1, description="failure rows per key per minute")
    flush_rows: int = Field(50_000, ge=1, description="a batch is written at this many rows")
    flush_interval_ms: int = Field(1000, ge=10, description="or after this long")


class LogSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = Field("auto", description="auto: console on a tty")


class Settings(BaseSettings):
    """Everything a process of authpipe reads at start; frozen once built."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix="AUTHPIPE_",
        env_nested_delimiter="_",
        env_nested_max_split=1,
        toml_file="authpipe.toml",
    )

    state_dir: Path = Field(Path(".state"), description="pidfiles, broker data, chdb, reports")
    policy_path: Path | None = Field(None, description="policy TOML; unset = built-in defaults")
    kafka: KafkaSettings = KafkaSettings()
    clickhouse: ClickHouseSettings = ClickHouseSettings()
    ingest: IngestSettings = IngestSettings()
    identity: IdentitySettings = IdentitySettings()
    worker: WorkerSettings = WorkerSettings()
    edge: EdgeSettings = EdgeSettings()
    audit: AuditSettings = AuditSettings()
    log: LogSettings = LogSettings()

    @field_validator("policy_path")
    @classmethod
    def _policy_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"policy file {value} does not exist; point policy_path at a TOML file")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = os.environ.get("AUTHPIPE_CONFIG", "authpipe.toml")
        toml = TomlConfigSettingsSource(settings_cls, toml_file=toml_path)
        return (init_settings, env_settings, toml)


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning every validation problem into one clear ConfigError."""
    named = os.environ.get("AUTHPIPE_CONFIG")
    if named and not Path(named).is_file():
        raise ConfigError(f"AUTHPIPE_CONFIG={named} does not exist; fix the path or unset it")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid settings ({problems}); see docs/operations.md 'Configuration'") from exc
