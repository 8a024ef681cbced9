#!/usr/bin/env bash
# make test: start the local broker, run every test, and stop every broker the run started
# (the single broker, and the three-node cluster that tests/test_cluster.py starts) when the
# tests end: passed, failed or interrupted. Ctrl-C reaches pytest, which runs its finalizers;
# a TERM or HUP to the group ends pytest at once; either way this shell then stops the
# brokers (the secured ones tests/test_security.py starts too). A broker that was running
# before the run is left running.
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
"$PY" -m pytest -q -p no:cacheprovider --durations=30 "$@"
