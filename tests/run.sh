#!/usr/bin/env bash
# make test: start the local broker, run every test, and stop every broker the run started
# (the single broker, and the three-node cluster that tests/test_cluster.py starts) when the
# tests end: passed, failed or interrupted. Ctrl-C reaches pytest, which runs its finalizers;
# a TERM or HUP to the group ends pytest at once; either way this shell then stops the
# brokers (the secured ones tests/test_security.py starts too). A broker that was running
# before the run is left running.
#
# With no pytest arguments the tests run in two phases: first the serial ones (those that
# restart the shared broker, and the three-node cluster's, which kill and restart its nodes),
# on a broker that still holds few topics (restarted after the whole suite's thousands of
# topics it takes minutes to load them), with the tests that need no broker beside them in
# one process; then every other broker test
# in TEST_WORKERS processes (pytest-xdist, default 4: most of the suite waits on brokers,
# timeouts and child processes, not on the two cores; tests sharing a resource they change
# run in one process, tests/conftest.py). With arguments, pytest runs them as given, in one
# process.
#   tests/run.sh PYTHON [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
PY="$1"
shift
BROKER=deploy/kafka-local/broker
single_up=0 cluster_up=0 sasl_up=0 mtls_up=0
$BROKER status >/dev/null 2>&1 && single_up=1
$BROKER --brokers 3 status >/dev/null 2>&1 && cluster_up=1
$BROKER --security sasl_ssl status >/dev/null 2>&1 && sasl_up=1
$BROKER --security mtls status >/dev/null 2>&1 && mtls_up=1
cleanup() {
  trap - EXIT INT TERM HUP
  ((single_up)) || $BROKER stop >/dev/null 2>&1
  ((cluster_up)) || $BROKER --brokers 3 stop >/dev/null 2>&1
  ((sasl_up)) || $BROKER --security sasl_ssl stop >/dev/null 2>&1
  ((mtls_up)) || $BROKER --security mtls stop >/dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
$BROKER start || exit 1
# the secured brokers start beside the first tests (tests/test_security.py's fixtures wait
# for them, or start them if this failed)
((sasl_up)) || $BROKER --security sasl_ssl start >/dev/null 2>&1 &
((mtls_up)) || $BROKER --security mtls start >/dev/null 2>&1 &
if (($#)); then
  "$PY" -m pytest -q -p no:cacheprovider --durations=30 "$@"
  exit $?
fi
# beside the serial phase (which mostly waits on restarting brokers), the tests that need no
# broker, in one process (one core: the cluster's tests flaked when four processes of the
# whole suite ran beside them); their report follows the serial phase's
free_log=$(mktemp)
"$PY" -m pytest -q -p no:cacheprovider --durations=10 -m "not kafka and not cluster and not serial" \
  >"$free_log" 2>&1 &
free_pid=$!
trap 'kill $free_pid 2>/dev/null; rm -f "$free_log"; cleanup' EXIT
"$PY" -m pytest -q -p no:cacheprovider --durations=5 -m serial
serial=$?
wait $free_pid
free=$?
cat "$free_log"
"$PY" -m pytest -q -p no:cacheprovider --durations=30 -n "${TEST_WORKERS:-4}" \
  --dist loadgroup -m "kafka and not serial"
parallel=$?
((parallel == 0 && serial == 0 && free == 0)) || exit $((serial ? serial : free ? free : parallel))
