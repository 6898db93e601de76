"""Stable partitioners (Python's hash() is salted per process, so never used here)."""

from __future__ import annotations

import zlib


def account_partition(account_digest: str, partitions: int) -> int:
    """Partition of an account: its digest is already uniform, so its first 32 bits do."""
    return int(account_digest[:8], 16) % partitions


def source_partition(tenant: str, source: str, partitions: int) -> int:
    """Partition of a (tenant, source): CRC-32 of both, stable across processes."""
    return zlib.crc32(f"{tenant}|{source}".encode()) % partitions


def tenant_partition(tenant: str, partitions: int) -> int:
    """Partition of a tenant's shares on the tenant-shares topic (stable across processes)."""
    return zlib.crc32(tenant.encode()) % partitions
