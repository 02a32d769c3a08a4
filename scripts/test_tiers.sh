#!/usr/bin/env bash
# `make test`: the suite as three pytest sessions side by side.
# The tests that start processes (marked procs/flower) spend most of their wall time
# waiting on processes, heartbeats and round deadlines, so they run as two sessions split
# by directory, and the in-process tier's CPU work fills the waits of both on 2 cores:
#   deployments  the procs/flower tests under DEPLOYMENT_DIRS: a coordinator, its
#                SuperLink and devices on loopback, each on free ports; no Ray;
#   processes    every other procs/flower test: Flower's simulation engine (all the Ray
#                tests), Flower deployments of the apps, benchmarks, the CLI's commands;
#   in-process   the tests marked neither (make test-fast).
# The two process sessions take complementary paths (DEPLOYMENT_DIRS, and the whole of
# tests/ less them), so every test runs exactly once, in one of them. Each session carries
# its own --procs-guard marker (tests/procguard.py), so none takes another's processes
# for leaks. The processes session streams; the other two print when all have ended. The
# exit status fails if any session failed. Usage: scripts/test_tiers.sh PYTHON
set -uo pipefail
py=${1:?usage: test_tiers.sh PYTHON}

# No file here may start Ray (Flower's simulation engine): those stay in one session.
DEPLOYMENT_DIRS=(tests/coordinator tests/serving tests/registry)
ignore=()
for dir in "${DEPLOYMENT_DIRS[@]}"; do ignore+=("--ignore=$dir"); done

work=$(mktemp -d -t fedveil-tiers.XXXXXX)

# `session NAME PYTEST-ARGS...`: one pytest session; its exit status and wall time go to
# $work/NAME.end. Only the processes session streams to the terminal.
session() {
    local name=$1 start=$SECONDS rc
    shift
    if [ "$name" = processes ]; then  # in the foreground: Ctrl-C reaches it
        "$py" -m pytest "$@"
        rc=$?
    else
        "$py" -m pytest "$@" >"$work/$name.log" 2>&1 &
        echo $! >"$work/$name.pid"
        wait $!
        rc=$?
        rm -f "$work/$name.pid"  # ended: its pid is no longer its own
    fi
    echo "$rc $((SECONDS - start))" >"$work/$name.end"
    return "$rc"
}

# On an early exit (interrupted), the sessions still running in the background are ended.
trap 'kill $(cat "$work"/*.pid 2>/dev/null) 2>/dev/null; rm -rf "$work"' EXIT
session deployments -q -m "procs or flower" --procs-guard --durations=15 \
    -p no:cacheprovider "${DEPLOYMENT_DIRS[@]}" &
session in-process -q -m "not procs and not flower" --procs-guard --durations=10 \
    -p no:cacheprovider &

session processes -q -m "procs or flower" --procs-guard --durations=15 "${ignore[@]}" tests
wait

echo "::: the deployments tier (procs or flower, under ${DEPLOYMENT_DIRS[*]}), run alongside"
cat "$work/deployments.log"
echo "::: the in-process tier (not procs, not flower), run alongside"
cat "$work/in-process.log"
echo "::: tiers: exit status, wall time"
failed=0
for name in processes deployments in-process; do
    read -r rc wall <"$work/$name.end" || { rc=1 wall="?"; }
    printf '  %-12s exit %s  %s s\n' "$name" "$rc" "$wall"
    [ "$rc" -eq 0 ] || failed=1
done
[ "$failed" -eq 0 ]
