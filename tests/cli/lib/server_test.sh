# server_test.sh — sourced by the server shell tests (tests/cli/server_*.sh, serve_*.sh); not a
# test itself (ctest registers tests/cli/*.sh only). Needs BIN. Defines:
#   pass, fail, tmp (removed on exit), PIDS (servers, killed on exit);
#   ok, bad MSG, check WHAT CMD... (counts the outcome of CMD);
#   js EXPR < JSON → the value of a JS expression over `d` (strings raw, other values as JSON);
#   launch_server NAME ARGS... → runs "$BIN" ARGS... in the background, log in $tmp/NAME.log,
#     sets SPID and PORT once it prints "listening on" (bounded wait; the test exits on failure);
#   stop_server PID [TENTHS]: SIGTERM, up to TENTHS × 0.1 s (default 100) for a clean exit (0);
#   post_json PATH BODY → POST to the server on $PORT: the body in $tmp/out, the status in $CODE.
pass=0; fail=0
tmp=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT

ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }

js() { node -e 'const d=JSON.parse(require("fs").readFileSync(0,"utf8"));
  const v=(new Function("d","return ("+process.argv[1]+")"))(d);
  process.stdout.write(v===undefined?"undefined":typeof v==="string"?v:JSON.stringify(v))' "$1"; }

launch_server() {
  local name=$1; shift
  "$BIN" "$@" >"$tmp/$name.log" 2>&1 &
  SPID=$!; PIDS+=("$SPID")
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's|.*listening on http://[^ ]*:\([0-9][0-9]*\)$|\1|p' "$tmp/$name.log")
    [ -n "$PORT" ] && return 0
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: server $name did not start:"; cat "$tmp/$name.log"; exit 1
}

stop_server() {
  local pid=$1 tenths=${2:-100} rc
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 "$tenths"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; bad "server $pid ignored SIGTERM"; fi
  wait "$pid"; rc=$?
  check "server $pid exit code $rc after SIGTERM" [ "$rc" -eq 0 ]
}

post_json() {
  CODE=$(curl -s --max-time 120 -o "$tmp/out" -w '%{http_code}' -H 'Content-Type: application/json' \
         --data-binary "$2" "http://127.0.0.1:$PORT$1")
}
