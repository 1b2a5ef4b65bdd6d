#!/bin/sh
# A credential helper for `exec` accounts in the integration tests.
# Usage: token-helper.sh STATE_DIR [ARGS...]
# STATE_DIR steers it: "mode" (ok, deny-exit, deny-json, fail, garbage, hang; default ok) and
# "lifetime" (seconds, default 3). It appends "N MODE PID ARGS..." to STATE_DIR/calls for every run.
dir="$1"
shift
count=$(( $(cat "$dir/count" 2>/dev/null || echo 0) + 1 ))
echo "$count" > "$dir/count"
mode=$(cat "$dir/mode" 2>/dev/null || echo ok)
lifetime=$(cat "$dir/lifetime" 2>/dev/null || echo 3)
echo "$count $mode $$ $*" >> "$dir/calls"
case "$mode" in
ok)
    printf '{"access_token":"exec-at-%s-%s","expires_in":%s,"token_type":"Bearer","refresh_token":"ignored"}\n' \
        "$count" "$$" "$lifetime"
    ;;
deny-exit)
    echo "helper: the session is gone; log in again (stderr-marker-$count)" >&2
    exit 2
    ;;
deny-json)
    printf '{"error":"invalid_grant"}\n'
    exit 1
    ;;
fail)
    echo "helper: backend unreachable (stderr-marker-$count)" >&2
    exit 1
    ;;
garbage)
    echo "this is not json"
    ;;
hang)
    exec sleep 60
    ;;
esac
