# cluster.sh: helpers for the `strata serve` fabric scenarios (sourced by
# tests/integration/cluster_*.sh and tests/bench/cluster_*.sh). Nodes run on 127.0.0.1: HTTP on a
# free port (--port 0), the fabric on CL_BASE+i.
#
# cl_serve NAME ARGS...   starts `strata serve --host 127.0.0.1 --port 0 --threads 1 -v ARGS` in
#                         the background, log in $W/NAME.log; waits until it listens (HTTP); sets
#                         CL_PID[NAME], CL_URL[NAME]
# cl_ready NAME SECONDS   waits for /health 200
# cl_complete NAME PROMPT N [CURL ARGS]   prints the greedy completion text (N tokens); with
#                         -H 'X-Strata-Route: local' served by that node itself, never relayed
# cl_kill NAME            SIGKILL;  cl_stop NAME: SIGTERM and the exit status
# cl_cleanup              (EXIT trap) kills what cl_serve started
# cl_begin NAME           a control-plane scenario's start (tests/lib/serve.sh sourced first): fails
#                         without the binary, skips without python3, makes the work dir $W (kept
#                         with KEEP=1) with the EXIT trap, converts the tiny model (its path in
#                         CL_MODEL) and writes the cluster key to $W/key
# cl_why NAME             the last lines of a node's log on one line (failure messages)
# cl_q NAME PYEXPR        PYEXPR over the node's /v1/cluster as `d` ("" when it does not answer),
#                         with events(kind[, model]), node(id), hold(id[, model]) (its first or
#                         named model's holding, {} when none)
# cl_until SECONDS NAME PYEXPR   polls until cl_q prints True
# cl_q_any PYEXPR         cl_q over the first live node (by name) that answers: a scenario that kills
#                         nodes asks whoever is left
# cl_until_any SECONDS PYEXPR   polls until cl_q_any prints True
# cl_until_snap SECONDS PYEXPR FILE   the same, keeping the answer that made it true in FILE
# cl_eval PYEXPR <FILE     PYEXPR over a kept /v1/cluster answer
STRATA=${STRATA:-build/strata}
# Below the kernel's ephemeral range (32768-60999 by default): a port we listen on must not be one
# the kernel may already have given an outgoing connection (bind would fail at random).
CL_BASE=${CL_BASE:-$((20000 + ($$ % 1200) * 10))}
declare -A CL_PID CL_URL
fail=0

ok() { echo "ok - $*"; }
not_ok() {
    echo "not ok - $*"
    fail=1
}

cl_key() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"; }

cl_begin() {
    [ -x "$STRATA" ] || { echo "not ok - $1: $STRATA not built"; exit 1; }
    command -v python3 >/dev/null || { echo "skip - $1: needs python3"; exit 0; }
    W=$(mktemp -d "/tmp/$1.XXXXXX")
    trap 'cl_cleanup; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
    serve_model || { echo "not ok - $1: cannot convert the tiny model"; exit 1; }
    CL_MODEL=$(realpath "$SERVE_MODEL")
    cl_key "$W/key"
}

cl_serve() { # cl_serve NAME ARGS...
    local name=$1 i port=""
    shift
    : >"$W/$name.log"
    "$STRATA" serve --host 127.0.0.1 --port 0 --threads 1 -v "$@" >"$W/$name.log" 2>&1 &
    CL_PID[$name]=$!
    for ((i = 0; i < 100; i++)); do
        port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$W/$name.log" | head -n1)
        [ -n "$port" ] && break
        kill -0 "${CL_PID[$name]}" 2>/dev/null || break
        sleep 0.05
    done
    [ -n "$port" ] || return 1
    CL_URL[$name]="http://127.0.0.1:$port"
}

cl_ready() { # cl_ready NAME SECONDS
    local i
    for ((i = 0; i < $2 * 20; i++)); do
        curl -sf -o /dev/null "${CL_URL[$1]}/health" && return 0
        kill -0 "${CL_PID[$1]}" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

cl_complete() { # cl_complete NAME PROMPT N [CURL ARGS]
    local name=$1 prompt=$2 n=$3
    shift 3
    curl -s -m 60 "$@" "${CL_URL[$name]}/v1/completions" \
        -d "{\"prompt\":\"$prompt\",\"max_tokens\":$n,\"temperature\":0}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>/dev/null
}

cl_kill() {
    kill -9 "${CL_PID[$1]}" 2>/dev/null
    wait "${CL_PID[$1]}" 2>/dev/null
}

cl_stop() { # exit status of the node after SIGTERM
    kill -TERM "${CL_PID[$1]}" 2>/dev/null
    wait "${CL_PID[$1]}"
}

cl_cleanup() {
    local n
    for n in "${!CL_PID[@]}"; do kill -9 "${CL_PID[$n]}" 2>/dev/null; done
    for n in "${!CL_PID[@]}"; do wait "${CL_PID[$n]}" 2>/dev/null; done
}

cl_why() { tail -n 6 "$W/$1.log" | tr '\n' '|'; }

cl_q() { # cl_q NAME PYEXPR
    curl -s -m 2 "${CL_URL[$1]}/v1/cluster" | cl_eval "$2"
}

cl_eval() { # cl_eval PYEXPR <CLUSTER_JSON: PYEXPR over that /v1/cluster answer (d, events, node, hold)
    python3 -c "
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
events = lambda kind, m=None: [e for e in d['events'] if e['event'] == kind and (m is None or e.get('model') == m)]
node = lambda i: [n for n in d['nodes'] if n['id'] == i][0]
hold = lambda i, m=None: ([x for x in node(i)['models'] if m is None or x['name'] == m] or [{}])[0]
print($1)" 2>/dev/null
}

cl_until() { # cl_until SECONDS NAME PYEXPR
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt $end ]; do
        [ "$(cl_q "$2" "$3")" = True ] && return 0
        sleep 0.1
    done
    return 1
}
cl_live() { # the names of the nodes still running, sorted
    local name
    for name in $(printf '%s\n' "${!CL_PID[@]}" | sort); do
        kill -0 "${CL_PID[$name]}" 2>/dev/null && echo "$name"
    done
}
cl_q_any() { # cl_q_any PYEXPR
    local name r
    for name in $(cl_live); do
        r=$(cl_q "$name" "$1")
        [ -n "$r" ] && { echo "$r"; return; }
    done
}
cl_until_any() { # cl_until_any SECONDS PYEXPR
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt $end ]; do
        [ "$(cl_q_any "$2")" = True ] && return 0
        sleep 0.2
    done
    return 1
}
cl_until_snap() { # cl_until_snap SECONDS PYEXPR FILE: cl_until_any, keeping in FILE the /v1/cluster
    local end=$((SECONDS + $1)) name j # answer that made PYEXPR true (checks of that moment read it)
    while [ $SECONDS -lt $end ]; do
        j=""
        for name in $(cl_live); do
            j=$(curl -s -m 2 "${CL_URL[$name]}/v1/cluster") && [ -n "$j" ] && break
        done
        if [ "$(printf '%s' "$j" | cl_eval "$2")" = True ]; then
            printf '%s' "$j" >"$3"
            return 0
        fi
        sleep 0.2
    done
    return 1
}
