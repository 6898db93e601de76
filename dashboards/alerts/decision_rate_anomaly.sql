-- decision_rate_anomaly: throttle decisions issued per minute out of the ordinary for a
-- tenant: the last 10 minutes against the tenant's rate over the 24 hours before.
-- Window: the 10 complete minutes before {now_ms}. Subject: the tenant. Period: the hour.
-- Fires when the window has >= 50 decisions (5 a minute) and its rate is >= 4 x the
-- baseline rate per minute (a baseline below 0.25 a minute counts as 0.25).
-- Reads the per-minute aggregate decisions_by_minute (tombstones are not decisions).
WITH
    toStartOfMinute(fromUnixTimestamp64Milli({now_ms:Int64}, 'UTC')) AS end_minute,
    end_minute - INTERVAL 10 MINUTE AS start_minute,
    start_minute - INTERVAL 24 HOUR AS baseline_start
SELECT
    rate_tenant AS tenant,
    rate_tenant AS subject,
    CAST(NULL, 'Nullable(String)') AS source,
    CAST(NULL, 'Nullable(String)') AS account_digest,
    toUInt64(recent_decisions) AS count,
    toUInt64(recent_accounts) AS distinct_accounts,
    toDateTime64(start_minute, 3, 'UTC') AS window_start,
    toDateTime64(end_minute, 3, 'UTC') AS window_end,
    toStartOfHour(end_minute) AS period
FROM
(
    SELECT
        tenant AS rate_tenant,
        sumIf(decisions, minute >= start_minute) AS recent_decisions,
        uniqMergeIf(accounts, minute >= start_minute) AS recent_accounts,
        sumIf(decisions, minute < start_minute) AS baseline_decisions
    FROM decisions_by_minute
    WHERE minute >= baseline_start AND minute < end_minute
    GROUP BY rate_tenant
)
WHERE recent_decisions >= 50
    AND recent_decisions / 10 >= 4 * greatest(baseline_decisions / 1440, 0.25)
ORDER BY rate_tenant
