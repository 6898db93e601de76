-- source_many_tenants: one source failing against many tenants over the last hour, a
-- credential-stuffing sign no per-tenant rule sees.
-- Window: the 60 complete minutes before {now_ms}. Subject: the source; tenant is '*'
-- (all tenants). Period: the hour.
-- Fires when the source has failures in >= 5 tenants in the window.
-- Reads the per-minute aggregate attempts_by_source_minute, never raw rows.
WITH
    toStartOfMinute(fromUnixTimestamp64Milli({now_ms:Int64}, 'UTC')) AS end_minute,
    end_minute - INTERVAL 60 MINUTE AS start_minute
SELECT
    '*' AS tenant,
    wide_source AS subject,
    CAST(wide_source, 'Nullable(String)') AS source,
    CAST(NULL, 'Nullable(String)') AS account_digest,
    toUInt64(sum(tenant_failures)) AS count,
    toUInt64(uniqMerge(tenant_accounts)) AS distinct_accounts,
    toDateTime64(start_minute, 3, 'UTC') AS window_start,
    toDateTime64(end_minute, 3, 'UTC') AS window_end,
    toStartOfHour(end_minute) AS period
FROM
(
    SELECT
        source AS wide_source,
        tenant AS wide_tenant,
        sum(failures) AS tenant_failures,
        uniqMergeState(accounts) AS tenant_accounts
    FROM attempts_by_source_minute
    WHERE minute >= start_minute AND minute < end_minute AND source != ''
    GROUP BY wide_source, wide_tenant
    HAVING tenant_failures > 0
)
GROUP BY wide_source
HAVING count() >= 5
ORDER BY wide_source
