-- failure_ratio_spike: a tenant's failure ratio over the last 10 minutes far above its own
-- baseline, the 24 hours before the window.
-- Window: the 10 complete minutes before {now_ms}. Subject: the tenant. Period: the hour.
-- Fires when the window has >= 100 attempts, a failure ratio >= 0.3, and a ratio >= 3 x
-- the baseline ratio (a baseline below 0.05, or no history at all, counts as 0.05).
-- Attempts and failures are sum(weight), so rate-capped summary rows count in full.
-- Reads the per-minute aggregate attempts_by_source_minute, never raw rows.
WITH
    toStartOfMinute(fromUnixTimestamp64Milli({now_ms:Int64}, 'UTC')) AS end_minute,
    end_minute - INTERVAL 10 MINUTE AS start_minute,
    start_minute - INTERVAL 24 HOUR AS baseline_start
SELECT
    spike_tenant AS tenant,
    spike_tenant AS subject,
    CAST(NULL, 'Nullable(String)') AS source,
    CAST(NULL, 'Nullable(String)') AS account_digest,
    toUInt64(recent_failures) AS count,
    toUInt64(recent_accounts) AS distinct_accounts,
    toDateTime64(start_minute, 3, 'UTC') AS window_start,
    toDateTime64(end_minute, 3, 'UTC') AS window_end,
    toStartOfHour(end_minute) AS period
FROM
(
    SELECT
        tenant AS spike_tenant,
        sumIf(attempts, minute >= start_minute) AS recent_attempts,
        sumIf(failures, minute >= start_minute) AS recent_failures,
        uniqMergeIf(accounts, minute >= start_minute) AS recent_accounts,
        sumIf(attempts, minute < start_minute) AS baseline_attempts,
        sumIf(failures, minute < start_minute) AS baseline_failures
    FROM attempts_by_source_minute
    WHERE minute >= baseline_start AND minute < end_minute
    GROUP BY spike_tenant
)
WHERE recent_attempts >= 100
    AND recent_failures / recent_attempts >= 0.3
    AND recent_failures / recent_attempts
        >= 3 * greatest(if(baseline_attempts > 0, baseline_failures / baseline_attempts, 0), 0.05)
ORDER BY spike_tenant
