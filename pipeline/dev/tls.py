"""A local certificate authority for the dev broker's TLS listeners (``authpipe stack up --tls``).

Made with ``keytool`` (Java 17, which the broker needs anyway) and, for the PEM private
keys Python and librdkafka clients load, ``openssl pkcs12``:

* ``ca.p12`` / ``ca.pem``: the CA; basicConstraints critical CA:true *and* keyUsage
  keyCertSign, cRLSign (a CA without keyUsage fails Python 3.13's strict verification);
* ``broker.p12``: the broker's key and certificate (SAN ``DNS:localhost``, ``IP:127.0.0.1``),
  signed by the CA; ``truststore.p12``: the CA alone, for the broker's check of clients;
* ``<name>.pem`` / ``<name>.key``: a client certificate (CN=<name>) and its unencrypted
  PKCS#8 key for mutual TLS (``openssl pkcs12``: keytool exports no private key).

Every store has the password ``STORE_PASSWORD``: throwaway development material, never a
production CA. Invariant: ``make_authority`` is idempotent (files that exist are kept).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline.dev.errors import StackError
from pipeline.dev.processes import require_tool, tail_lines

STORE_PASSWORD = "authpipe-dev-store"
_SAN = "SAN=dns:localhost,ip:127.0.0.1"
_VALIDITY_DAYS = "825"
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TlsFiles:
    """The files of one local authority (see the module docstring)."""

    directory: Path

    @property
    def ca_pem(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def broker_keystore(self) -> Path:
        return self.directory / "broker.p12"

    @property
    def truststore(self) -> Path:
        return self.directory / "truststore.p12"

    def client_cert(self, name: str) -> Path:
        return self.directory / f"{name}.pem"

    def client_key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def broker_properties(self) -> dict[str, str]:
        """The broker's ssl.* settings (keystore, and the truststore that checks clients)."""
        return {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.broker_keystore),
            "ssl.keystore.password": STORE_PASSWORD,
            "ssl.key.password": STORE_PASSWORD,
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.location": str(self.truststore),
            "ssl.truststore.password": STORE_PASSWORD,
        }


def _run(command: list[str], what: str) -> None:
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{what}: {command[0]} did not finish in {_TIMEOUT_S:.0f}s") from exc
    if result.returncode != 0:
        raise StackError(
            f"{what} failed (exit {result.returncode}):\n"
            f"{tail_lines(result.stdout + result.stderr, 20)}\n"
            "remove the TLS directory to make a fresh authority"
        )


def _keytool(*args: str) -> list[str]:
    keytool = require_tool("keytool", "install a Java 17+ JDK/JRE (keytool comes with it)")
    # C1 only and the serial collector: each call is a JVM start, about half the CPU so.
    quick = ["-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC"]
    return [keytool, *quick, *args, "-storepass", STORE_PASSWORD, "-noprompt"]


def _signed_keypair(files: TlsFiles, store: Path, alias: str, dname: str, ext: list[str]) -> None:
    """A key pair in ``store`` whose certificate the CA signs (chain: CA, then ``alias``)."""
    d = files.directory
    csr, signed = d / f"{alias}.csr", d / f"{alias}.signed.pem"
    common = ["-keystore", str(store), "-storetype", "PKCS12"]
    _run(
        _keytool(
            "-genkeypair",
            "-alias",
            alias,
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-dname",
            dname,
            "-validity",
            _VALIDITY_DAYS,
            "-keypass",
            STORE_PASSWORD,
            *common,
        ),
        f"keytool -genkeypair {alias}",
    )
    _run(_keytool("-certreq", "-alias", alias, "-file", str(csr), *common), "keytool -certreq")
    extensions = [arg for e in ext for arg in ("-ext", e)]
    _run(
        _keytool(
            "-gencert",
            "-alias",
            "ca",
            "-keystore",
            str(d / "ca.p12"),
            "-infile",
            str(csr),
            "-outfile",
            str(signed),
            "-rfc",
            "-validity",
            _VALIDITY_DAYS,
            *extensions,
        ),
        f"keytool -gencert {alias}",
    )
    _run(
        _keytool("-importcert", "-alias", "ca", "-file", str(files.ca_pem), *common),
        "keytool -importcert ca",
    )
    _run(
        _keytool("-importcert", "-alias", alias, "-file", str(signed), *common),
        f"keytool -importcert {alias}",
    )
    csr.unlink(missing_ok=True)
    signed.unlink(missing_ok=True)


def make_authority(
    directory: Path, clients: tuple[str, ...] = ("authpipe-client",), *, broker: bool = True
) -> TlsFiles:
    """The CA, a certificate per client name and (``broker``) the broker's keystore and
    the truststore."""
    files = TlsFiles(directory.resolve())
    files.directory.mkdir(parents=True, exist_ok=True)
    ca_store = files.directory / "ca.p12"
    if not ca_store.exists():
        _run(
            _keytool(
                "-genkeypair",
                "-alias",
                "ca",
                "-keyalg",
                "RSA",
                "-keysize",
                "2048",
                "-dname",
                "CN=authpipe-dev-ca",
                "-ext",
                "bc:c",
                "-ext",
                "KU:c=keyCertSign,cRLSign",
                "-validity",
                _VALIDITY_DAYS,
                "-keystore",
                str(ca_store),
                "-storetype",
                "PKCS12",
                "-keypass",
                STORE_PASSWORD,
            ),
            "keytool: the local CA",
        )
    if not files.ca_pem.exists():
        _run(
            _keytool(
                "-exportcert",
                "-rfc",
                "-alias",
                "ca",
                "-keystore",
                str(ca_store),
                "-file",
                str(files.ca_pem),
            ),
            "keytool -exportcert ca",
        )
    if broker and not files.truststore.exists():
        _run(
            _keytool(
                "-importcert",
                "-alias",
                "ca",
                "-file",
                str(files.ca_pem),
                "-keystore",
                str(files.truststore),
                "-storetype",
                "PKCS12",
            ),
            "keytool: the truststore",
        )
    if broker and not files.broker_keystore.exists():
        _signed_keypair(
            files,
            files.broker_keystore,
            "broker",
            "CN=localhost",
            [_SAN, "KU=digitalSignature,keyEncipherment", "EKU=serverAuth,clientAuth"],
        )
    for name in clients:
        if not files.client_key(name).exists():
            _client(files, name)
    return files


def _client(files: TlsFiles, name: str) -> None:
    """``<name>.pem`` (the client's certificate alone) and ``<name>.key`` (PEM, PKCS#8,
    unencrypted)."""
    store = files.directory / f"{name}.p12"
    store.unlink(missing_ok=True)
    _signed_keypair(files, store, name, f"CN={name}", ["KU=digitalSignature", "EKU=clientAuth"])
    openssl = require_tool("openssl", "install OpenSSL (`apt-get install openssl`)")
    source = [openssl, "pkcs12", "-in", str(store), "-passin", f"pass:{STORE_PASSWORD}"]
    _run(
        [*source, "-nokeys", "-clcerts", "-out", str(files.client_cert(name))],
        "openssl: client cert",
    )
    _run([*source, "-nocerts", "-nodes", "-out", str(files.client_key(name))], "openssl: key")
    files.client_key(name).chmod(0o600)
