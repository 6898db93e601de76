"""Kafka connection security: settings validation and the one builder of client options."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from pipeline.dev.broker_config import add_sasl_listener, scram_format_args
from pipeline.dev.errors import StackError
from pipeline.errors import ConfigError
from pipeline.kafka_client import client_kwargs, security_kwargs
from pipeline.settings import KafkaSettings, load_settings


def test_plaintext_adds_no_client_options() -> None:
    """The default connection passes nothing beyond the bootstrap servers."""
    assert client_kwargs(KafkaSettings()) == {"bootstrap_servers": "127.0.0.1:9092"}


def test_sasl_plaintext_gives_mechanism_user_and_password() -> None:
    """SASL_PLAINTEXT maps to aiokafka's sasl_* options, without a TLS context."""
    kafka = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="worker",
        sasl_password="pw",
    )  # type: ignore[arg-type]
    assert security_kwargs(kafka) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "worker",
        "sasl_plain_password": "pw",
    }
    assert "pw" not in repr(kafka)


def test_sasl_ssl_adds_a_verifying_tls_context() -> None:
    """SASL_SSL verifies the broker's certificate and host name."""
    kafka = KafkaSettings(security_protocol="SASL_SSL", sasl_username="u", sasl_password="p")  # type: ignore[arg-type]
    context = security_kwargs(kafka)["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_REQUIRED, True)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs sasl_username and sasl_password"),
        (
            {"security_protocol": "PLAINTEXT", "ssl_cafile": "/etc/hostname"},
            "set but security_protocol=PLAINTEXT",
        ),
        (
            {"security_protocol": "SSL", "ssl_certfile": "/etc/hostname"},
            "ssl_certfile and ssl_keyfile go together",
        ),
        (
            {"security_protocol": "SSL", "ssl_cafile": "/no/such/ca.pem"},
            "ssl_cafile=/no/such/ca.pem: no such file",
        ),
        ({"security_protocol": "TLS"}, "kafka.security_protocol: Input should be"),
    ],
)
def test_inconsistent_security_settings_are_config_errors(
    overrides: dict[str, str], problem: str
) -> None:
    """Each inconsistent combination is one ConfigError saying what is wrong."""
    with pytest.raises(ConfigError, match=problem):
        load_settings(kafka=overrides)


def test_sasl_listener_is_added_beside_the_plaintext_one() -> None:
    """The rendered properties list both client listeners and enable both SCRAM mechanisms."""
    base = (
        "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093\n"
        "advertised.listeners=PLAINTEXT://127.0.0.1:9092\n"
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
    )
    lines = add_sasl_listener(base, 9094).splitlines()
    assert lines[:3] == [
        "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093,SASL_PLAINTEXT://127.0.0.1:9094",
        "advertised.listeners=PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9094",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
    ]
    assert "sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512" in lines


def test_scram_users_become_storage_format_arguments() -> None:
    """Each user gets both mechanisms; a name StorageTool could misparse is refused."""
    assert scram_format_args({"w": "pw"}) == [
        "--add-scram",
        "SCRAM-SHA-256=[name=w,password=pw]",
        "--add-scram",
        "SCRAM-SHA-512=[name=w,password=pw]",
    ]
    with pytest.raises(StackError, match="use only letters"):
        scram_format_args({"w": "p,w]"})


def test_settings_files_must_exist(tmp_path: Path) -> None:
    """An existing CA file is accepted."""
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    assert (
        load_settings(kafka={"security_protocol": "SSL", "ssl_cafile": str(ca)}).kafka.ssl_cafile
        == ca
    )
