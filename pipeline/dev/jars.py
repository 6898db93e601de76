"""The broker's jars: Maven copies the classpath of ``deploy/local/kafka/pom.xml`` into a
``libs/`` directory once; a marker file records the Kafka version and the POM digest, so a
version bump fetches again. ``python -m pipeline.dev.jars fetch-libs <dir>`` (scripts/setup)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from pipeline.dev.errors import StackError
from pipeline.dev.processes import file_lock, require_tool, tail_lines
from pipeline.errors import AuthpipeError
from pipeline.logs import configure_logging, get_logger

log = get_logger("stack")

KAFKA_DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "local" / "kafka"
POM_PATH = KAFKA_DEPLOY_DIR / "pom.xml"
LIBS_MARKER = ".authpipe-libs"
LOG_TAIL_LINES = 40
_MAVEN_TIMEOUT_S = 900.0
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def kafka_version(pom_text: str) -> str:
    """The ``kafka.version`` property of the broker POM."""
    node = ET.fromstring(pom_text).find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not (node.text or "").strip():
        raise StackError(f"{POM_PATH} has no <kafka.version> property; restore it from git")
    return (node.text or "").strip()


def libs_marker_text(pom_text: str) -> str:
    """Marker content: the Kafka version plus the POM digest (any POM change re-fetches)."""
    digest = hashlib.sha256(pom_text.encode("utf-8")).hexdigest()
    return f"kafka {kafka_version(pom_text)}\npom-sha256 {digest}\n"


def libs_ready(libs_dir: Path, pom_path: Path = POM_PATH) -> bool:
    marker = libs_dir / LIBS_MARKER
    try:
        return marker.read_text() == libs_marker_text(pom_path.read_text())
    except OSError:
        return False


def fetch_libs(libs_dir: Path, pom_path: Path = POM_PATH) -> Path:
    """Copy the broker classpath into ``libs_dir`` with Maven, unless it is already there."""
    if libs_ready(libs_dir, pom_path):
        return libs_dir
    require_tool("java", "install a Java 17+ runtime (Maven and the broker need it)")
    mvn = require_tool("mvn", "install Apache Maven 3.6+ (e.g. `apt-get install maven`)")
    with file_lock(libs_dir.parent / f".{libs_dir.name}.lock"):
        if libs_ready(libs_dir, pom_path):  # another process fetched them meanwhile
            return libs_dir
        pom_text = pom_path.read_text()
        staging = libs_dir.parent / f".{libs_dir.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        log.info(
            "kafka_libs_fetching", kafka_version=kafka_version(pom_text), libs_dir=str(libs_dir)
        )
        started = time.monotonic()
        command = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom_path),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=_MAVEN_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise StackError(
                f"Maven did not finish fetching the Kafka jars within {_MAVEN_TIMEOUT_S:.0f}s; "
                "check network access to Maven Central (or ~/.m2/settings.xml)"
            ) from exc
        if result.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            raise StackError(
                f"Maven could not fetch the Kafka jars (exit {result.returncode}):\n"
                f"{tail_lines(result.stdout + result.stderr, LOG_TAIL_LINES)}\n"
                "check network access to Maven Central (or ~/.m2/settings.xml)"
            )
        (staging / LIBS_MARKER).write_text(libs_marker_text(pom_text))
        old = libs_dir.parent / f".{libs_dir.name}.old-{os.getpid()}"
        if libs_dir.is_symlink():
            # A shared jar cache linked in: refresh its target, keep the link.
            target = libs_dir.resolve()
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        else:
            if libs_dir.exists():
                libs_dir.rename(old)
            staging.rename(libs_dir)
            shutil.rmtree(old, ignore_errors=True)
        log.info(
            "kafka_libs_ready",
            libs_dir=str(libs_dir),
            elapsed_s=round(time.monotonic() - started, 1),
        )
    return libs_dir


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipeline.dev.jars fetch-libs <dir>``: pre-fetch the broker jars (scripts/setup)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "fetch-libs":
        print("usage: python -m pipeline.dev.jars fetch-libs <libs-dir>", file=sys.stderr)
        return 2
    configure_logging(one_shot=True)  # like `authpipe stack`: console lines on stderr
    try:
        fetch_libs(Path(args[1]).absolute())
    except AuthpipeError as exc:
        print(f"authpipe: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
