"""Decision records and alerts as JSONL files (``scorecard --save-outputs`` writes them;
``scorecard --decisions``, ``backtest --live`` and ``report --decisions`` read them), and the
JSON file ``scorecard --out`` and ``backtest --out`` write."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from pipeline.contracts.codec import decision_model, decode_decision
from pipeline.contracts.models import Alert
from pipeline.core.grouping import within_grouping
from pipeline.sim.errors import ScorecardError
from pipeline.sim.outputs import AlertRecord, DecisionRecord, Outputs


def load_outputs(
    decisions_path: Path,
    alerts_path: Path | None,
    source_ok: Callable[[str], bool] = within_grouping,
) -> Outputs:
    """Decision records (``{"key", "value", "after"?}`` per line) and alerts (an alert
    object, or ``{"value": alert, "after"}``, per line) from files."""
    outputs = Outputs(origin=f"file:{decisions_path}")
    for row in _jsonl(decisions_path):
        value = row.get("value")
        decision = (
            None
            if value is None
            else decision_model(decode_decision(orjson.dumps(value), source_ok=source_ok))
        )
        outputs.decisions.append(DecisionRecord(str(row["key"]), decision, row.get("after")))
    if alerts_path is not None:
        for row in _jsonl(alerts_path):
            body = row.get("value", row)
            alert = Alert.model_validate_json(orjson.dumps(body))
            outputs.alerts.append(AlertRecord(alert, row.get("after")))
    return outputs


def _jsonl(path: Path) -> Iterable[dict[str, Any]]:
    if not path.is_file():
        raise ScorecardError(f"{path} does not exist")
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ScorecardError(f"{path}:{number} is not JSON ({exc})") from None


def write_outputs(outputs: Outputs, decisions_path: Path, alerts_path: Path) -> None:
    """The inverse of ``load_outputs``."""
    with decisions_path.open("wb") as handle:
        for rec in outputs.decisions:
            value = None if rec.decision is None else rec.decision.model_dump(mode="json")
            handle.write(orjson.dumps({"key": rec.key, "value": value, "after": rec.after}) + b"\n")
    with alerts_path.open("wb") as handle:
        for alert_rec in outputs.alerts:
            row = {"value": alert_rec.alert.model_dump(mode="json"), "after": alert_rec.after}
            handle.write(orjson.dumps(row) + b"\n")


def write_json(data: dict[str, Any], path: Path) -> None:
    """``data`` as indented JSON at ``path`` (its folder made if missing): the scorecard's and
    the backtest's ``--out``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
