"""The source shard: the attempts the account shard forwards (untrusted password failures
and successes, successes that made an account familiar here, challenge outcomes),
partitioned by source. Spray (rule 5), the credential-stuffing alert
(``pipeline.core.stuffing``), the block of sources that keep failing challenges (bot
evidence), whether a source is shared by real users, its shares of distinct failing
sources and of distinct unknown accounts per tenant, and the strangers' failing sources
and whether a sign-in redeemed them (the wave's slow tier, ``StrangersConfig``).

No decision here depends on whether an account exists: ``unknown_account`` feeds only
alerts and the tenant's wave (an operator's signal and a challenge every untrusted
stranger of the tenant meets alike), never a source's own decision.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.attempt import FAMILIAR, REPEAT, REPEAT_UNKNOWN, Attempt
from pipeline.core.dedupe import DEDUPE_CAPACITY, DEDUPE_HORIZON_MS
from pipeline.core.keys import Key
from pipeline.core.outbox import Outbox, Shares, add_share
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.core.policy_rules import RuleConfig
from pipeline.core.records import build_alert
from pipeline.core.rules import TenantRules
from pipeline.core.shard import Shard, restore_shares, share_records
from pipeline.core.state import PairState, SourceState
from pipeline.core.stuffing import stuffing_alert_due

_NOT_NEW = frozenset({FAMILIAR, REPEAT, REPEAT_UNKNOWN})
"""Forwarded failures that are not a stranger's new failure (``pipeline.core.attempt``)."""
_UNKNOWN = frozenset({"unknown_account", REPEAT_UNKNOWN})


class SourceShard(Shard):
    """Signals keyed by source: spray (rule 5) and credential stuffing.

    Fed untrusted password failures and successes, forwarded by the account shard; a
    success of an account that failed from the source within the window is a redemption. Allowlisted
    ranges are exempt. In ``observe`` mode (the default) spray raises ``spray_source``
    once per window and publishes an ``observe`` decision that never refuses: a NAT full
    of colleagues is never collateral. In ``enforce`` mode that decision is a CAPTCHA
    challenge for the source's unfamiliar untrusted password attempts (issue 44): it
    refuses nobody, spares every account familiar there and every trusted device, and
    never reaches the block-list feed. A redeemed pair stops counting towards spray: a
    user who succeeds right after a typo is not being sprayed.

    A source that fails ``challenge_failures.threshold`` challenges in its window meets a
    CAPTCHA for its unfamiliar attempts for ``block_ms`` (rule ``challenge_failures``),
    wave or no wave: the same challenge it failed, again, never a refusal (before issue
    44 a block, which refused a café's newcomers and, through the nginx feed, the trusted
    laptops behind it). What an attacker's failures raise, it meets first.
    """

    def __init__(
        self,
        policy: Policy = DEFAULT_POLICY,
        *,
        part: int = 0,
        dedupe_horizon_ms: int = DEDUPE_HORIZON_MS,
        dedupe_capacity: int = DEDUPE_CAPACITY,
    ) -> None:
        super().__init__(
            policy, part=part, dedupe_horizon_ms=dedupe_horizon_ms, dedupe_capacity=dedupe_capacity
        )
        # This shard's share of distinct unknown accounts per (tenant, window).
        self.unknown_shares: Shares = {}
        # Its strangers' failing sources, and those redeemed, per (tenant, window failed in).
        self.stranger_shares: Shares = {}
        self.redeemed_shares: Shares = {}

    def meta(self) -> list[Any]:
        return [
            *super().meta(),
            share_records(self.unknown_shares),
            share_records(self.stranger_shares),
            share_records(self.redeemed_shares),
        ]

    def restore(self, key: list[Any], value: list[Any] | None) -> None:
        if key == ["meta"] and value is not None:
            # Records written before stuffing_tenant have 2 fields, before strangers 3.
            for shares, at in (
                (self.unknown_shares, 2),
                (self.stranger_shares, 3),
                (self.redeemed_shares, 4),
            ):
                if len(value) > at:
                    restore_shares(shares, value[at])
        super().restore(key, value)

    def step(self, attempt: Attempt, now_ms: int, out: Outbox, seq: int = -1) -> None:
        if now_ms > self.watermark_ms:
            self.watermark_ms = now_ms
        if self.dedupe is not None and self.dedupe.seen(
            attempt.event_id, self.watermark_ms, attempt.tenant
        ):
            self.metrics.duplicates += 1
            return
        rules = self.tenants.get(attempt.tenant) or self.tenant(attempt.tenant)
        if attempt.occurred_ms <= self.watermark_ms - rules.max_span_ms:
            self.metrics.late += 1
            return
        if rules.allowlist is not None and rules.allowlisted(attempt.source):
            return
        skey: Key = ("source", attempt.tenant, None, attempt.source, None)
        entries = rules.sources.mapping
        src = entries.get(skey)
        if src is None:
            src = rules.sources.create(skey, rules.source_factory)
        else:
            entries.move_to_end(skey)
        if seq >= 0 and src.seq >= seq:
            return
        if attempt.flow == "challenge":
            if not attempt.success:
                self.metrics.counted += 1
                self._challenge_failure(attempt, rules, src, skey, out)
                self._stranger(attempt, rules, src, out)
        elif attempt.success:
            self._success(attempt, rules, src, out, seq)
        else:
            self.metrics.counted += 1
            self._failure(attempt, rules, src, skey, out)
        if seq > src.seq:
            src.seq = seq
        if self.track_changes:
            self.dirty[("sources", skey)] = None

    def _failure(
        self, attempt: Attempt, rules: TenantRules, src: SourceState, skey: Key, out: Outbox
    ) -> None:
        new_pair = self._distinct(attempt, rules, src)
        now = attempt.occurred_ms
        if src.distinct.total >= rules.spray_threshold and now >= src.spray_alerted_until_ms:
            self._spray(attempt, rules, src, skey, out)
        self._stuffing_signals(attempt, rules, src, skey, new_pair, out)
        self._stranger(attempt, rules, src, out)
        if src.tenant_window != now // rules.tenant_window_ms:
            window = self.add_tenant_share(attempt, rules, out)
            src.tenant_window = window
            src.keep_until_ms = max(src.keep_until_ms, (window + 1) * rules.tenant_window_ms)

    def _stranger(
        self, attempt: Attempt, rules: TenantRules, src: SourceState, out: Outbox
    ) -> None:
        """A failure at a stranger's place (not a known place, and not at the account's own
        familiar pair or client, which the account stage marks ``familiar``): count the
        source in its window's stranger share, once per ``redeem_ms`` it stays pending."""
        if not rules.strangers_on or attempt.failure_reason in _NOT_NEW:
            return
        now = attempt.occurred_ms
        known = rules.familiar.get(("familiar", attempt.tenant, None, attempt.source, None))
        if known is not None and known.blocked_until_ms > now:
            return  # a known place: some account signed in here (the wave's step-up place)
        if src.stranger_window >= 0 and now - src.stranger_since_ms <= rules.strangers_redeem_ms:
            return  # already pending
        window = now // rules.tenant_window_ms
        src.stranger_window = window
        src.stranger_since_ms = now
        src.stranger_account = attempt.account
        add_share(
            self.stranger_shares, attempt.tenant, window, rules.shares_bound, out.stranger_shares
        )
        keep = now + rules.strangers_redeem_ms
        if keep > src.keep_until_ms:
            src.keep_until_ms = keep

    def _redeem(self, attempt: Attempt, rules: TenantRules, src: SourceState, out: Outbox) -> None:
        """A success at the source within ``redeem_ms`` of its pending stranger failure
        redeems it when it makes the place familiar (a ``familiar`` forward: within its
        account's ``new_per_day``) or it is the account whose failure made it pending (an
        attacker's own account that failed here first redeems nothing of a stuffing's)."""
        if attempt.occurred_ms - src.stranger_since_ms > rules.strangers_redeem_ms:
            src.stranger_window = -1  # settled unredeemed: the rollup has counted it
            return
        if attempt.failure_reason != FAMILIAR and attempt.account != src.stranger_account:
            return
        add_share(
            self.redeemed_shares,
            attempt.tenant,
            src.stranger_window,
            rules.shares_bound,
            out.redeemed_shares,
        )
        src.stranger_window = -1

    def _stuffing_signals(
        self,
        attempt: Attempt,
        rules: TenantRules,
        src: SourceState,
        skey: Key,
        new_pair: bool,
        out: Outbox,
    ) -> None:
        """Credential stuffing: all failures, and unknown_account failures of accounts new
        from this source in the window (distinct unknown accounts), on aligned rings."""
        now = attempt.occurred_ms
        bucket = now // rules.stuffing_sub_ms
        failures, unknown = src.failures, src.unknown
        failures.add(bucket)
        if new_pair and attempt.failure_reason in _UNKNOWN:
            unknown.add(bucket)
            add_share(
                self.unknown_shares,
                attempt.tenant,
                now // rules.stuffing_tenant_window_ms,
                rules.unknown_shares_bound,
                out.unknown_shares,
            )
        if unknown.head < failures.head:
            unknown.advance(failures.head)
        if now >= src.stuffing_alerted_until_ms and stuffing_alert_due(
            failures.total, unknown.total, rules.stuffing_min, rules.stuffing_ratio
        ):
            self._stuffing(attempt, rules, src, out)

    def _challenge_failure(
        self, attempt: Attempt, rules: TenantRules, src: SourceState, skey: Key, out: Outbox
    ) -> None:
        """A failed challenge: bot evidence. Enough of them challenge the source's unfamiliar
        attempts (a CAPTCHA, never a refusal: a shared address's newcomers pass it)."""
        now = attempt.occurred_ms
        ring = src.challenges
        if not ring.add(now // rules.challenge_sub_ms):
            return
        keep = (ring.head + rules.challenge_ring_size) * rules.challenge_sub_ms
        if keep > src.keep_until_ms:
            src.keep_until_ms = keep
        cfg = rules.challenge_rule
        if ring.total < cfg.threshold or now < src.blocked_until_ms:
            return
        self._block(
            attempt, src, skey, "challenge_failures", cfg, ring.total, rules.challenge_block_ms, out
        )
        src.keep_until_ms = max(src.keep_until_ms, src.blocked_until_ms)

    def _block(
        self,
        attempt: Attempt,
        src: SourceState,
        skey: Key,
        rule: str,
        cfg: RuleConfig,
        count: int,
        block_ms: int,
        out: Outbox,
    ) -> None:
        """Publish ``rule``'s decision on the source key for ``block_ms`` from now: a CAPTCHA
        challenge in enforce mode (``observe`` in observe mode), never a block."""
        now = attempt.occurred_ms
        expires = now + block_ms
        src.blocked_until_ms = expires
        src.block_rule = rule
        src.decision_id = self.issue(
            out,
            rule,
            "source",
            skey,
            attempt.tenant,
            None,
            attempt.source,
            None,
            cfg,
            count,
            now,
            expires,
            "challenge",
            "captcha",
        )

    def _success(
        self, attempt: Attempt, rules: TenantRules, src: SourceState, out: Outbox, seq: int
    ) -> None:
        """A success forwarded here: an untrusted one, or one that made its account
        familiar at the source (``failure_reason = "familiar"``: one more account of the
        source's real users). After a failure of the same account from here (a
        redemption, for that pair only) the pair stops counting as sprayed."""
        now = attempt.occurred_ms
        if attempt.failure_reason == FAMILIAR:
            period = now // rules.renew_ms
            src.vouch(period)
            self.familiar(attempt, rules, out, seq, None)  # the source is known
            keep = (period + 2) * rules.renew_ms
            if keep > src.keep_until_ms:
                src.keep_until_ms = keep
        pkey: Key = ("pair", attempt.tenant, attempt.account, attempt.source, None)
        pair = rules.pairs.mapping.get(pkey)
        if src.stranger_window >= 0:
            self._redeem(attempt, rules, src, out)
        if pair is not None and pair.bucket >= 0:
            src.distinct.remove(pair.bucket)
            pair.bucket = -1
            if self.track_changes:
                self.dirty[("pairs", pkey)] = None

    def _distinct(self, attempt: Attempt, rules: TenantRules, src: SourceState) -> bool:
        """Move the pair's one count to the bucket of its latest failure. True when the
        pair is new in the spray window (no failure of it counted there)."""
        sub_ms = rules.spray_sub_ms
        bucket = attempt.occurred_ms // sub_ms
        pkey: Key = ("pair", attempt.tenant, attempt.account, attempt.source, None)
        entries = rules.pairs.mapping
        pair = entries.get(pkey)
        if pair is None:
            pair = rules.pairs.create(pkey, PairState)
        else:
            entries.move_to_end(pkey)
        distinct = src.distinct
        new_pair = pair.bucket < 0 or pair.bucket <= bucket - rules.spray_ring_size
        if pair.bucket < bucket:
            if pair.bucket >= 0:
                distinct.remove(pair.bucket)
            if distinct.add(bucket):
                pair.bucket = bucket
        keep = (max(pair.bucket, distinct.head) + rules.spray_ring_size) * sub_ms
        pair.keep_until_ms = keep
        if keep > src.keep_until_ms:
            src.keep_until_ms = keep
        if self.track_changes:
            self.dirty[("pairs", pkey)] = None
        return new_pair

    def _spray(
        self, attempt: Attempt, rules: TenantRules, src: SourceState, skey: Key, out: Outbox
    ) -> None:
        distinct = src.distinct.total
        cfg = rules.policy.source
        now = attempt.occurred_ms
        if distinct < cfg.threshold or now < src.spray_alerted_until_ms:
            return
        src.spray_alerted_until_ms = now + cfg.window_ms
        out.alerts.append(
            build_alert(
                "spray_source",
                attempt.tenant,
                attempt.source,
                None,
                distinct,
                distinct,
                now - cfg.window_ms,
                now,
                self.version,
            )
        )
        self.metrics.alerts += 1
        # Like every rule, observe mode publishes its decision with action "observe" (the
        # refusal check never applies it); enforce mode publishes a CAPTCHA challenge.
        if now >= src.blocked_until_ms:
            self._block(attempt, src, skey, "source", cfg, distinct, cfg.window_ms, out)
        src.keep_until_ms = max(src.keep_until_ms, src.spray_alerted_until_ms, src.blocked_until_ms)

    def _stuffing(
        self, attempt: Attempt, rules: TenantRules, src: SourceState, out: Outbox
    ) -> None:
        """Enough failures, mostly unknown accounts, no alert this window: alert."""
        failures = src.failures.total
        cfg = rules.policy.stuffing
        now = attempt.occurred_ms
        src.stuffing_alerted_until_ms = now + cfg.window_ms
        src.keep_until_ms = max(src.keep_until_ms, src.stuffing_alerted_until_ms)
        out.alerts.append(
            build_alert(
                "credential_stuffing",
                attempt.tenant,
                attempt.source,
                None,
                failures,
                src.distinct.total,
                now - cfg.window_ms,
                now,
                self.version,
            )
        )
        self.metrics.alerts += 1
