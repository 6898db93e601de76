#!/usr/bin/env bash
# Keep an nginx include file equal to the authpipe edge's block-list.
#
#   sync-blocklist.sh [--once] <include file> [format]
#
# format: nginx-geo (default; entries for a `geo` block) or nginx (`deny` lines).
# Long-polls GET /v1/blocklist with If-None-Match and wait_ms=55000: the edge answers
# within about a second of a change (200 with the new list) or after 55 s (304). A new
# list is written next to the target, checked with `nginx -t`, moved into place
# atomically, and nginx is reloaded. With --once it fetches once (for cron).
# Environment: AUTHPIPE_EDGE_URL (default http://127.0.0.1:8080), AUTHPIPE_EDGE_TOKEN,
# AUTHPIPE_NGINX: the nginx command to test and reload with (default `nginx`; e.g.
# `nginx -p /srv/gw -c /srv/gw/nginx.conf` for an nginx with its own prefix and config).
set -euo pipefail

once=0
if [[ "${1:-}" == "--once" ]]; then once=1; shift; fi
target="${1:?usage: sync-blocklist.sh [--once] <include file> [nginx-geo|nginx]}"
format="${2:-nginx-geo}"
edge="${AUTHPIPE_EDGE_URL:-http://127.0.0.1:8080}"
read -r -a nginx <<< "${AUTHPIPE_NGINX:-nginx}"
auth=()
if [[ -n "${AUTHPIPE_EDGE_TOKEN:-}" ]]; then auth=(-H "Authorization: Bearer ${AUTHPIPE_EDGE_TOKEN}"); fi
etag=""
tmp="$(mktemp "${target}.XXXXXX")"
headers="$(mktemp)"
trap 'rm -f "$tmp" "$headers"' EXIT

while true; do
    wait_ms=55000
    if [[ $once -eq 1 || -z "$etag" ]]; then wait_ms=0; fi
    status=$(curl -sS -o "$tmp" -D "$headers" -w '%{http_code}' --max-time 70 "${auth[@]}" \
        ${etag:+-H "If-None-Match: $etag"} \
        "${edge}/v1/blocklist?format=${format}&wait_ms=${wait_ms}") || status=000
    case "$status" in
        200)
            etag=$(tr -d '\r' < "$headers" | awk 'tolower($1) == "etag:" {print $2}')
            cp "$target" "${target}.previous" 2>/dev/null || true
            cp "$tmp" "${target}.next"
            mv "${target}.next" "$target"
            if "${nginx[@]}" -t -q; then
                # A failed reload (nginx not running yet) keeps the loop going: the next
                # start of nginx reads the file as it is.
                "${nginx[@]}" -s reload || echo "nginx reload failed; is nginx running?" >&2
            else
                echo "nginx -t failed with the new block-list; restoring the previous one" >&2
                mv "${target}.previous" "$target" 2>/dev/null || true
            fi
            ;;
        304) ;;  # unchanged
        *)  # edge unreachable, not ready (503) or unauthorised: keep the current list
            echo "block-list fetch answered ${status}; keeping ${target}" >&2
            sleep 2
            ;;
    esac
    if [[ $once -eq 1 ]]; then break; fi
done
