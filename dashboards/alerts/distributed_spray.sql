-- distributed_spray: many sources, each with few failures, against many accounts of one
-- tenant over the last hour: the low-and-slow spray that no per-source limit sees.
-- Window: the 60 complete minutes before {now_ms}. Subject: the tenant. Period: the hour.
-- Fires when, in the window, the tenant has >= 20 failing sources, >= 50 distinct accounts
-- on them, and <= 10 failures per failing source on average.
-- Reads the per-minute aggregate attempts_by_source_minute, never raw rows.
WITH
    toStartOfMinute(fromUnixTimestamp64Milli({now_ms:Int64}, 'UTC')) AS end_minute,
    end_minute - INTERVAL 60 MINUTE AS start_minute
SELECT
    spray_tenant AS tenant,
    spray_tenant AS subject,
    CAST(NULL, 'Nullable(String)') AS source,
    CAST(NULL, 'Nullable(String)') AS account_digest,
    toUInt64(sum(source_failures)) AS count,
    toUInt64(uniqMerge(source_accounts)) AS distinct_accounts,
    toDateTime64(start_minute, 3, 'UTC') AS window_start,
    toDateTime64(end_minute, 3, 'UTC') AS window_end,
    toStartOfHour(end_minute) AS period
FROM
(
    SELECT
        tenant AS spray_tenant,
        source AS spray_source,
        sum(failures) AS source_failures,
        uniqMergeState(accounts) AS source_accounts
    FROM attempts_by_source_minute
    WHERE minute >= start_minute AND minute < end_minute AND source != ''
    GROUP BY spray_tenant, spray_source
    HAVING source_failures > 0
)
GROUP BY spray_tenant
HAVING count() >= 20
    AND uniqMerge(source_accounts) >= 50
    AND sum(source_failures) <= 10 * count()
ORDER BY spray_tenant
