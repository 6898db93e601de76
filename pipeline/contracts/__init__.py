"""Wire models and the one JSON codec: what producers, gateways and dashboards code against."""

from pipeline.contracts.models import (
    SCHEMA_VERSION,
    Alert,
    AuditRow,
    Decision,
    LoginAttempt,
)

__all__ = ["SCHEMA_VERSION", "Alert", "AuditRow", "Decision", "LoginAttempt"]
