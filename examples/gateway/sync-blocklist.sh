#!/usr/bin/env bash
# Keep an nginx include file equal to the authpipe edge's block-list.
#
#   sync-blocklist.sh [--once] [--tenant T] <include file> [format]
#
# format: nginx-geo (default; entries for a `geo` block) or nginx (`deny` lines).
# --tenant T: only tenant T's sources (default: every tenant's).
# Long-polls GET /v1/blocklist with If-None-Match and wait_ms=55000: the edge answers
# within about a second of a change (200 with the new list) or after 55 s (304).
#
# Nothing unchecked reaches nginx. A new list is installed only when every line is what
# the edge writes: the header line (its count, its tenant) and then one entry per line,
# an IPv4/IPv6 address or CIDR (no prefix shorter than /16 for IPv4 or /32 for IPv6) in
# the format's syntax. It is then moved into place atomically, checked with `nginx -t`
# and nginx is reloaded; a list that fails any check (or `nginx -t`) leaves the previous
# file in place. The first run, when the edge cannot be reached or answers with a bad
# list and no file exists yet, writes an empty list (header only) so nginx can start:
# that fails open at nginx only, the login service's own /v1/check still refuses.
# With --once it fetches once (for cron) and exits 1 when it kept the previous file.
#
# Environment:
#   AUTHPIPE_EDGE_URL     default http://127.0.0.1:8080; https:// off loopback (plain
#                         http is refused there), the certificate verified (never -k).
#                         Parsed strictly: scheme://host[:port][/path], no user@, query
#                         or fragment; plain http only to 127.0.0.0/8 (dotted quad),
#                         [::1] or localhost, never through a proxy
#   AUTHPIPE_EDGE_CACERT  a CA bundle to verify the edge's certificate with (default:
#                         the system's)
#   AUTHPIPE_EDGE_TOKEN   the edge's bearer token
#   AUTHPIPE_NGINX        the nginx command to test and reload with (default `nginx`; e.g.
#                         `nginx -p /srv/gw -c /srv/gw/nginx.conf` for an nginx with its
#                         own prefix and config)
set -euo pipefail
export LC_ALL=C

usage="usage: sync-blocklist.sh [--once] [--tenant T] <include file> [nginx-geo|nginx]"
once=0
tenant=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --once) once=1; shift ;;
        --tenant) tenant="${2:?$usage}"; shift 2 ;;
        --) shift; break ;;
        -*) echo "$usage" >&2; exit 2 ;;
        *) break ;;
    esac
done
target="${1:?$usage}"
format="${2:-nginx-geo}"
edge="${AUTHPIPE_EDGE_URL:-http://127.0.0.1:8080}"
edge="${edge%/}"

case "$format" in
    nginx-geo) entry='[0-9A-Fa-f.:]{2,45}(/[0-9]{1,3})? 1;' ;;
    nginx) entry='deny [0-9A-Fa-f.:]{2,45}(/[0-9]{1,3})?;' ;;
    *) echo "format must be nginx-geo or nginx, not ${format}; ${usage}" >&2; exit 2 ;;
esac
query="format=${format}"
header_tenant='\*'
if [[ -n "$tenant" ]]; then
    if ! [[ "$tenant" =~ ^[a-z0-9][a-z0-9._-]{0,63}$ ]]; then
        echo "--tenant ${tenant@Q} is not a tenant ([a-z0-9][a-z0-9._-]{0,63})" >&2
        exit 2
    fi
    query="${query}&tenant=${tenant}"
    header_tenant="\"${tenant//./\\.}\""
fi

# loopback HOST: 127.0.0.0/8 as a plain dotted quad (no leading zeros, no short or
# numeric forms curl would also read), [::1] or localhost.
loopback() {
    local host="$1" octet
    [[ "$host" == localhost || "$host" == "[::1]" ]] && return 0
    [[ "$host" =~ ^127\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})$ ]] || return 1
    for octet in "${BASH_REMATCH[@]:1}"; do ((octet <= 255)) || return 1; done
}

# The URL is parsed, never matched as text: scheme://host[:port][/path] and nothing else
# (no user@, query, fragment, escapes or spaces: `http://127.0.0.1@203.0.113.9` is a
# remote host, and the bearer token must not go there).
url_form='^(https?)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?)(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$'
url_refused="AUTHPIPE_EDGE_URL must be https://host[:port][/path] (plain http:// only on loopback: 127.0.0.0/8, [::1] or localhost; no user@, query or fragment)"
if ! [[ "$edge" =~ $url_form ]]; then
    echo "${url_refused}: ${edge@Q}" >&2
    exit 2
fi
scheme="${BASH_REMATCH[1]}"
host="${BASH_REMATCH[2]}"
curl_opts=(-sS --max-time 70 --max-filesize 67108864)
if [[ "$scheme" == https ]]; then
    curl_opts+=(--proto =https)
    if [[ -n "${AUTHPIPE_EDGE_CACERT:-}" ]]; then curl_opts+=(--cacert "$AUTHPIPE_EDGE_CACERT"); fi
elif loopback "$host"; then
    # No proxy either: an http_proxy in the environment would be sent the token.
    curl_opts+=(--proto =http --noproxy '*')
else
    echo "${url_refused}: ${edge@Q}" >&2
    exit 2
fi
read -r -a nginx <<< "${AUTHPIPE_NGINX:-nginx}"
if [[ -n "${AUTHPIPE_EDGE_TOKEN:-}" ]]; then
    curl_opts+=(-H "Authorization: Bearer ${AUTHPIPE_EDGE_TOKEN}")
fi

# valid FILE: every line is the edge's: one header line whose count is the number of
# entries and whose tenant is the one asked for, then entries of the format, no prefix
# shorter than /16 (IPv4) or /32 (IPv6).
valid() {
    local file="$1" count
    [[ -s "$file" && "$(tail -c 1 "$file" | od -An -c | tr -d ' ')" == '\n' ]] || return 1
    count=$(head -n 1 "$file" | sed -En \
        "s/^# authpipe source block-list: ([0-9]+) sources, tenant=${header_tenant}, (block|block\\+observe)\$/\\1/p")
    [[ -n "$count" ]] || return 1
    [[ $(($(wc -l < "$file") - 1)) -eq $count ]] || return 1
    tail -n +2 "$file" | grep -Evx "$entry" >/dev/null && return 1
    tail -n +2 "$file" | awk -F'[/ ;]' '
        { address = ($1 == "deny") ? $2 : $1; prefix = ($1 == "deny") ? $3 : $2 }
        index($0, "/") == 0 { next }
        address ~ /:/ && (prefix + 0 < 32 || prefix + 0 > 128) { bad = 1 }
        address !~ /:/ && (prefix + 0 < 16 || prefix + 0 > 32) { bad = 1 }
        END { exit bad }' || return 1
}

# install FILE: put FILE in place, test nginx with it, reload; on a failed test put the
# previous file back. Returns 1 when the previous file was kept.
install() {
    local file="$1"
    if [[ -e "$target" ]]; then cp -p "$target" "${target}.previous"; fi
    cp "$file" "${target}.next"
    mv -f "${target}.next" "$target"
    if "${nginx[@]}" -t -q; then
        # A failed reload (nginx not running yet) keeps the loop going: the next start of
        # nginx reads the file as it is.
        "${nginx[@]}" -s reload || echo "nginx reload failed; is nginx running?" >&2
        return 0
    fi
    echo "nginx -t failed with the new block-list; restoring the previous one" >&2
    if [[ -e "${target}.previous" ]]; then
        mv -f "${target}.previous" "$target"
    else
        rm -f "$target"
        first_run
    fi
    return 1
}

# first_run: no file yet and no good list: an empty one, so nginx can start.
first_run() {
    if [[ ! -e "$target" ]]; then
        local tenant_text='*'
        if [[ -n "$tenant" ]]; then tenant_text="\"${tenant}\""; fi
        printf '# authpipe source block-list: 0 sources, tenant=%s, block\n' "$tenant_text" \
            > "${target}.next"
        mv -f "${target}.next" "$target"
        echo "no block-list yet; wrote an empty ${target} until the edge answers" >&2
    fi
}

etag=""
tmp="$(mktemp "${target}.XXXXXX")"
headers="$(mktemp)"
trap 'rm -f "$tmp" "$headers" "${target}.next"' EXIT

while true; do
    kept=0
    wait_ms=55000
    if [[ $once -eq 1 || -z "$etag" ]]; then wait_ms=0; fi
    conditional=()
    if [[ -n "$etag" ]]; then conditional=(-H "If-None-Match: ${etag}"); fi
    status=$(curl "${curl_opts[@]}" -o "$tmp" -D "$headers" -w '%{http_code}' \
        "${conditional[@]}" "${edge}/v1/blocklist?${query}&wait_ms=${wait_ms}") || status=000
    case "$status" in
        200)
            new_etag=$(tr -d '\r' < "$headers" | awk 'tolower($1) == "etag:" {print $2}' | tail -n 1)
            if ! valid "$tmp"; then
                echo "the edge's block-list has a line that is not a valid entry; keeping ${target}" >&2
                kept=1
                first_run
                if [[ $once -eq 0 ]]; then sleep 2; fi
            else
                if [[ "$new_etag" =~ ^\"[0-9a-f]{1,64}\"$ ]]; then etag="$new_etag"; else etag=""; fi
                install "$tmp" || kept=1
            fi
            ;;
        304) ;;  # unchanged
        *)  # edge unreachable, TLS not verified, not ready (503) or unauthorised
            echo "block-list fetch answered ${status}; keeping ${target}" >&2
            kept=1
            first_run
            if [[ $once -eq 0 ]]; then sleep 2; fi
            ;;
    esac
    if [[ $once -eq 1 ]]; then exit "$kept"; fi
done
