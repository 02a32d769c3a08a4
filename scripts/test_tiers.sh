#!/usr/bin/env bash
# `make test`: both tiers of the suite at once, as two pytest sessions side by side.
# The tier that starts processes (marked procs/flower) spends much of its wall time
# waiting on processes, heartbeats and round deadlines; the in-process tier is CPU work
# that fills those waits on a 2-core machine. Each session carries its own --procs-guard
# marker (tests/procguard.py), so neither takes the other's processes for leaks.
# The in-process tier's output goes to a log printed when both have ended; the exit
# status fails if either tier failed. Usage: scripts/test_tiers.sh PYTHON
set -uo pipefail
py=${1:?usage: test_tiers.sh PYTHON}
log=$(mktemp -t fedveil-fast-tier.XXXXXX)

"$py" -m pytest -q -m "not procs and not flower" --procs-guard --durations=10 \
    -p no:cacheprovider >"$log" 2>&1 &
fast=$!
trap 'kill "$fast" 2>/dev/null; rm -f "$log"' EXIT

"$py" -m pytest -q -m "procs or flower" --procs-guard --durations=25
procs_rc=$?
wait "$fast"
fast_rc=$?

echo "::: the in-process tier (not procs, not flower), run alongside: exit $fast_rc"
cat "$log"
echo "::: tiers: processes exit $procs_rc, in-process exit $fast_rc"
[ "$procs_rc" -eq 0 ] && [ "$fast_rc" -eq 0 ]
