"""One frozen settings model, loaded from a TOML file plus ``AUTHPIPE_*`` variables.

Precedence (highest first): keyword arguments, environment, the TOML file, defaults.
Environment names join the section and the field with one underscore:
``AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS``, ``AUTHPIPE_CLICKHOUSE_URL``, ``AUTHPIPE_EDGE_PORT``.
The TOML file is ``authpipe.toml`` in the working directory, or the path in
``AUTHPIPE_CONFIG``; a missing default file is fine, a missing named file is an error.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from pipeline.contracts.models import TENANT_RULE, valid_tenant
from pipeline.core.dedupe import DEDUPE_CAPACITY, DEDUPE_HORIZON_MS
from pipeline.core.normalise import parse_nat64_prefix
from pipeline.errors import ConfigError

MIN_DIGEST_KEY_BYTES = 32
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
DIGEST_KEY_FILE = "digest.key"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    bootstrap_servers: str = Field("127.0.0.1:9092", description="host:port[,host:port]")
    partitions: int = Field(8, ge=1, le=1024, description="partitions of every topic we create")
    replication_factor: int = Field(
        1, ge=1, description="replicas of every topic we create: 1 on one broker, 3 in production"
    )
    min_insync_replicas: int = Field(
        1,
        ge=1,
        description="replicas a write needs in sync (topic min.insync.replicas): 2 of 3 in production",
    )
    input_topic: str = Field("auth.login-attempts", description="login attempts from producers")
    decisions_topic: str = Field("auth.throttle-decisions", description="compacted decisions")
    alerts_topic: str = Field("auth.alerts", description="alerts, once per subject per window")
    notices_topic: str = Field(
        "auth.account-notices", description="owner notices: an untrusted lock tripped (seed 001)"
    )
    dlq_topic: str = Field("auth.login-attempts.dlq", description="dead letters, bytes untouched")
    audit_topic: str = Field("auth.audit", description="audit rows for the ClickHouse sink")
    app_id: str = Field("authpipe", description="faust app id: consumer group and topic prefix")
    # Connection security: every client (faust, aiokafka, admin, sink, edge) gets the same
    # settings through pipeline.kafka_client.security_kwargs.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="SASL_SSL in production; PLAINTEXT only on a private network"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="with SASL_PLAINTEXT or SASL_SSL"
    )
    sasl_username: str | None = Field(None, description="SASL user (needed with SASL_*)")
    sasl_password: SecretStr | None = Field(None, description="SASL password (needed with SASL_*)")
    ssl_cafile: Path | None = Field(
        None, description="CA bundle to verify the broker (SSL, SASL_SSL)"
    )
    ssl_certfile: Path | None = Field(None, description="client certificate for mutual TLS")
    ssl_keyfile: Path | None = Field(None, description="key of ssl_certfile")

    @model_validator(mode="after")
    def _security_consistent(self) -> KafkaSettings:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas={self.min_insync_replicas} exceeds replication_factor="
                f"{self.replication_factor}: every write would be refused; lower it"
            )
        protocol = self.security_protocol
        if protocol.startswith("SASL_") and (not self.sasl_username or self.sasl_password is None):
            raise ValueError(
                f"security_protocol={protocol} needs sasl_username and sasl_password "
                "(AUTHPIPE_KAFKA_SASL_USERNAME, AUTHPIPE_KAFKA_SASL_PASSWORD)"
            )
        files = {
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
        }
        given = [name for name, path in files.items() if path is not None]
        if given and not protocol.endswith("SSL"):
            raise ValueError(
                f"{', '.join(given)} set but security_protocol={protocol}; use SSL or SASL_SSL"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                "ssl_certfile and ssl_keyfile go together (mutual TLS); set both or neither"
            )
        missing = [
            f"{name}={path}"
            for name, path in files.items()
            if path is not None and not path.is_file()
        ]
        if missing:
            raise ValueError(f"{', '.join(missing)}: no such file")
        return self


class ClickHouseSettings(_Section):
    url: str | None = Field(
        None, description="http(s)://user:pass@host:8123; unset = embedded chdb"
    )
    path: Path = Field(Path(".state/chdb"), description="chdb data directory (embedded mode)")
    database: str = Field("authpipe", description="database that holds every authpipe table")
    ttl_days: int = Field(90, ge=1, description="TTL of raw attempt rows")
    store_plain_account: bool = Field(
        False,
        description="also store the typed account in plain (it then travels on "
        "<app>.attempts-by-account and auth.audit: docs/contract.md)",
    )
    cluster: str | None = Field(
        None, description="ClickHouse cluster name: migrate writes ON CLUSTER DDL (replicated)"
    )


Decoder = Literal["msgspec", "pydantic"]
"""``ingest.decoder``: msgspec's fast path, then the model; or the model alone."""
DECODERS: tuple[str, ...] = get_args(Decoder)


class IngestSettings(_Section):
    trusted_proxies: tuple[str, ...] = Field((), description="CIDRs whose X-Forwarded-For we trust")
    ipv6_prefix: int = Field(64, ge=1, le=128, description="IPv6 sources grouped by this prefix")
    ipv4_prefix: int = Field(32, ge=1, le=32, description="IPv4 sources grouped by this prefix")
    nat64_prefixes: tuple[str, ...] = Field(
        (),
        description="this network's NAT64 prefixes (RFC 6052: IPv6 /32, /40, /48, /56, /64 or "
        "/96): a client translated through one is counted as the IPv4 address it carries, as "
        "64:ff9b::/96 and 64:ff9b:1::/48 always are",
    )
    case_sensitive_tenants: tuple[str, ...] = Field(
        (), description="tenants whose account identifiers are case-sensitive"
    )
    max_event_bytes: int = Field(16384, ge=256, description="larger events are dead-lettered")
    decoder: Decoder = Field(
        "msgspec",
        description="msgspec: a C decoder reads schema-exact events, the pydantic model the "
        "rest and every rejection (same rows and dead letters); pydantic: the model reads all",
    )
    max_batch_bytes: int = Field(
        8_388_608,
        ge=65_536,
        description="a compressed input batch inflating past this (or holding a record over "
        "max_event_bytes + 4096) is dead-lettered oversize, never inflated in full",
    )
    max_future_skew_ms: int = Field(
        300_000, ge=0, description="events further ahead: dead-lettered"
    )
    max_past_skew_ms: int = Field(
        604_800_000, ge=0, description="events older (or before 1970): dead-lettered"
    )
    dedupe_horizon_ms: int = Field(
        DEDUPE_HORIZON_MS, ge=0, description="event_id duplicates within: once"
    )
    dedupe_capacity: int = Field(
        DEDUPE_CAPACITY, ge=1, description="event ids a worker remembers, at most"
    )
    tenants: tuple[str, ...] = Field(
        (),
        description="allow-list of tenants; others are dead-lettered unknown_tenant (empty: any)",
    )
    max_tenants: int = Field(
        1000, ge=1, description="tenants a worker tracks; further ones are dead-lettered tenant_cap"
    )

    tenant_topics: dict[str, str] = Field(
        default_factory=dict,
        description="per-tenant input topics, {topic: tenant}: ingest reads them beside "
        "kafka.input_topic; an event whose tenant is not its topic's, or a bound tenant's "
        "event on another topic, is dead-lettered tenant_not_allowed",
    )

    @field_validator("tenants", "case_sensitive_tenants")
    @classmethod
    def _tenant_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [name for name in value if not valid_tenant(name)]
        if bad:
            raise ValueError(f"{bad[0]!r}: {TENANT_RULE}")
        return value

    @field_validator("nat64_prefixes")
    @classmethod
    def _nat64_prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            parse_nat64_prefix(text)  # a ValueError says what to write
        return value

    @field_validator("tenant_topics")
    @classmethod
    def _bound_tenants(cls, value: dict[str, str]) -> dict[str, str]:
        for topic, tenant in value.items():
            if not valid_tenant(tenant):
                raise ValueError(f"{topic!r}: {tenant!r}: {TENANT_RULE}")
            if not _TOPIC_NAME.fullmatch(topic):
                raise ValueError(
                    f"{topic[:80]!r} is not a Kafka topic name (letters, digits, '.', '_', '-')"
                )
        return value


class IdentitySettings(_Section):
    digest_key: str | None = Field(
        None,
        description="secret key of the account digest, 32+ bytes, shared with gateways; no "
        "default: unset, it is read from <state_dir>/digest.key (`authpipe stack up` writes one)",
    )

    @field_validator("digest_key")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        if value is not None and len(value.encode("utf-8")) < MIN_DIGEST_KEY_BYTES:
            raise ValueError(
                f"is {len(value.encode('utf-8'))} bytes; use at least {MIN_DIGEST_KEY_BYTES} "
                "random bytes (e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        return value


class WorkerSettings(_Section):
    batch_max_events: int = Field(5000, ge=1, description="events per batch at most")
    batch_max_wait_ms: int = Field(
        20, ge=1, description="ingest fills a batch for this long after its first record"
    )
    ingest_ahead_max_envelopes: int = Field(
        32,
        ge=0,
        le=1_000_000,
        description=(
            "ingest waits (1 s at most) while this worker's account stage has more of its"
            " envelopes than this still to apply, so a saturated worker reads larger batches;"
            " 0: never waits"
        ),
    )
    forward_linger_ms: int = Field(
        50,
        ge=0,
        le=10_000,
        description="forwards to the source stage and tenant shares gather this long before sending",
    )
    input_fetch_wait_ms: int = Field(
        10,
        ge=1,
        le=1_500,
        description=(
            "ingest's consumer asks the broker to answer a fetch within this long when its"
            " input has nothing new, and waits this long for a first record: the step by"
            " which a quiet input partition's live mark moves (10 ms: p99 to the edge 15-20"
            " ms lower than 20 ms at 0 and 50 events/s, for 0.035 of a core more when idle,"
            " bench B7)"
        ),
    )
    stage_fetch_wait_ms: int = Field(
        20,
        ge=1,
        le=1_500,
        description=(
            "the stages' consumer (faust's) asks the broker to answer a fetch within this"
            " long when it has nothing new (faust's own 1,500 ms held a partition whose"
            " records were just consumed behind a fetch of the quiet ones, bench B7)"
        ),
    )
    input_idle_ms: int = Field(
        500,
        ge=10,
        le=600_000,
        description=(
            "an input partition read to its end and silent this long no longer holds the others"
            " back; all of them: ingest releases everything read (raise it for producers that"
            " pause longer mid-stream)"
        ),
    )
    input_live_slack_ms: int = Field(
        80,
        ge=0,
        le=60_000,
        description=(
            "while every event read in the last input_idle_ms reached ingest within this long"
            " of occurring, an input partition read to its end marks the time of that read"
            " less this (a live event is released this long after it occurred, not after"
            " input_idle_ms); an event appended later than this after occurring is late; 0: off"
        ),
    )
    marks_interval_ms: int = Field(
        100,
        ge=0,
        le=60_000,
        description=(
            "an account partition holding no rows gets ingest's new marks at most this often"
            " (one with rows, or rows its marks do not release yet, gets every batch's);"
            " 0: every partition every batch"
        ),
    )
    input_live_slack_max_ms: int = Field(
        0,
        ge=0,
        le=60_000,
        description=(
            "the live slack grows to the largest hand-over delay of the last input_idle_ms"
            " while that is at most this (a worker waiting for a CPU keeps its live marks);"
            " only a later hand-over turns them off; at or below input_live_slack_ms: fixed"
            " (the default: a saturated worker's growing delays made rows late, bench B7)"
        ),
    )
    stuck_after_s: float = Field(
        300.0,
        ge=10.0,
        le=86_400.0,
        description=(
            "a stage partition with input waiting that makes no progress at all for this long"
            " ends the worker with exit status 75 for its supervisor to restart it"
            " (pipeline.stream.watch)"
        ),
    )
    web_port: int = Field(6066, ge=0, le=65535, description="metrics and readiness port (0=any)")
    web_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="metrics and readiness bind address; 0.0.0.0 in a container",
    )


class EdgeSettings(_Section):
    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(8080, ge=0, le=65535, description="HTTP port")
    token: str | None = Field(None, description="bearer token required when set")
    head_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="a request head must be complete this long after its first byte",
    )
    max_connections: int = Field(
        10_000, ge=1, description="open HTTP connections at most; further ones are closed at once"
    )
    refusal_logs_per_s: int = Field(
        20, ge=1, description="refused-check log lines per second at most; the rest are counted"
    )


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
            raise ValueError(
                f"policy file {value} does not exist; point policy_path at a TOML file"
            )
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
        return _with_key_file(Settings(**overrides))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(
            f"invalid settings ({problems}); see docs/operations.md 'Configuration'"
        ) from exc


class MissingDigestKeyError(ConfigError):
    """No ``identity.digest_key``: a service must not start with a guessable key."""


def _with_key_file(settings: Settings) -> Settings:
    """Fill an unset ``identity.digest_key`` from ``<state_dir>/digest.key`` if it exists."""
    path = settings.state_dir / DIGEST_KEY_FILE
    if settings.identity.digest_key is not None or not path.is_file():
        return settings
    key = path.read_text(encoding="utf-8").strip()
    if len(key.encode("utf-8")) < MIN_DIGEST_KEY_BYTES:
        raise ConfigError(
            f"identity.digest_key from {path} is shorter than {MIN_DIGEST_KEY_BYTES} bytes; "
            "delete the file and run `authpipe stack up` to write a new one"
        )
    identity = settings.identity.model_copy(update={"digest_key": key})
    return settings.model_copy(update={"identity": identity})


def require_digest_key(settings: Settings) -> str:
    """The account-digest key; MissingDigestKeyError (one line naming the setting) if unset.

    There is no built-in key: anyone who knows it can reverse digests with a dictionary."""
    key = settings.identity.digest_key
    if key is None:
        raise MissingDigestKeyError(
            f"identity.digest_key is not set: set AUTHPIPE_IDENTITY_DIGEST_KEY to {MIN_DIGEST_KEY_BYTES}+ "
            f"random bytes (the same on workers and gateways), or run `authpipe stack up` to write "
            f"{settings.state_dir / DIGEST_KEY_FILE}"
        )
    return key


def ensure_digest_key_file(state_dir: Path) -> Path:
    """Write a fresh random key to ``<state_dir>/digest.key`` (mode 0600) unless one exists."""
    path = state_dir / DIGEST_KEY_FILE
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process wrote it meanwhile
            return path
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(MIN_DIGEST_KEY_BYTES) + "\n")
    return path
