"""Benchmarks (run as modules: python -m bench.bench_core)."""

import os

# authpipe has no built-in digest key (services refuse to start without one); the
# benchmarks, and the workers they start, use this one unless the environment sets another.
os.environ.setdefault(
    "AUTHPIPE_IDENTITY_DIGEST_KEY", "authpipe-bench-digest-key-not-for-production"
)
