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
# topics it takes minutes to load them), then every other broker test
# in TEST_WORKERS processes (pytest-xdist, default 4: most of the suite waits on brokers,
# timeouts and child processes, not on the two cores; tests sharing a resource they change
# run in one process, tests/conftest.py). With arguments, pytest runs them as given, in one
# process.
#   tests/run.sh PYTHON [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
PY="$1"
shift
# a skipped test fails the run unless its reason is one a machine can truly need
# (tests/conftest.py ALLOWED_SKIPS): a missing test dependency is a broken setup, not a pass
export SW_NO_SKIPS="${SW_NO_SKIPS:-1}"
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
alone=0
if ! (($#)); then
  # the timing tests first, with nothing beside them, not even the secured brokers starting
  # (tests/test_serve_fairness.py: a client's p99 against its idle p99 while attacks run)
  "$PY" -m pytest -q -p no:cacheprovider --durations=5 -m alone
  alone=$?
fi
# the secured brokers start beside the first tests (tests/test_security.py's fixtures wait
# for them, or start them if this failed)
((sasl_up)) || $BROKER --security sasl_ssl start >/dev/null 2>&1 &
((mtls_up)) || $BROKER --security mtls start >/dev/null 2>&1 &
if (($#)); then
  "$PY" -m pytest -q -p no:cacheprovider --durations=30 "$@"
  exit $?
fi
# The tests that need no broker run beside the other phases, in one process each time: most
# of them (A) beside the serial phase, which mostly waits on restarting brokers (the
# cluster's tests flaked when four processes of the whole suite ran beside them), the rest
# (B, these files) beside the broker tests, whose processes mostly wait too; each report
# follows its phase's.
FREE="not kafka and not cluster and not serial and not alone and not image"
FREE_B=(tests/test_fuzz.py tests/test_onnx.py tests/test_onnx5.py tests/test_serve.py
        tests/test_categorical.py)
free_a_log=$(mktemp)
free_b_log=$(mktemp)
"$PY" -m pytest -q -p no:cacheprovider --durations=10 -m "$FREE" \
  "${FREE_B[@]/#/--ignore=}" >"$free_a_log" 2>&1 &
free_pid=$!
trap 'kill $free_pid 2>/dev/null; rm -f "$free_a_log" "$free_b_log"; cleanup' EXIT
"$PY" -m pytest -q -p no:cacheprovider --durations=5 -m serial
serial=$?
wait $free_pid
free_a=$?
cat "$free_a_log"
"$PY" -m pytest -q -p no:cacheprovider --durations=10 -m "$FREE" "${FREE_B[@]}" \
  >"$free_b_log" 2>&1 &
free_pid=$!
"$PY" -m pytest -q -p no:cacheprovider --durations=30 -n "${TEST_WORKERS:-4}" \
  --dist loadgroup -m "kafka and not serial"
parallel=$?
wait $free_pid
free_b=$?
cat "$free_b_log"
free=$((free_a ? free_a : free_b))
serial=$((alone ? alone : serial))
((parallel == 0 && serial == 0 && free == 0)) || exit $((serial ? serial : free ? free : parallel))
