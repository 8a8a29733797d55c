#!/usr/bin/env bash
# The multi-machine recipe of docs/operations.md ("Running the roles yourself"), one step per call:
#
#     docs/multihost.sh STEP
#
# on the machine the step belongs to. tests/integration/test_multihost_netns.py runs exactly
# these steps on hosts made of network namespaces, and tests/unit/test_multihost_recipe.py checks
# that docs/operations.md shows these very commands, so the documented recipe is the tested one.
#
# Settings, from the environment:
#   ECHO2_AUTH_TOKEN  the run's join token (every machine; the learner machine makes it up)
#   CONFIG, RUN_DIR   the run's TOML config and run dir (learner machine)
#   LEARNER_HOST      an address of the learner machine the workers can reach
#   PORT              the coordinator's port (default 8470)
#   THIS_HOST         a worker's own address, as its peers reach it
#   BANDWIDTH_BPS     a worker's link in bits/s, for the broadcast planner (default 1e9)
#   PRICE_PER_HOUR    what a worker costs (default 0)
set -euo pipefail
PORT=${PORT:-8470}
BANDWIDTH_BPS=${BANDWIDTH_BPS:-1e9}
PRICE_PER_HOUR=${PRICE_PER_HOUR:-0}

case "${1:-}" in
  # ---- on the learner machine: coordinator and learner, each in its own terminal (or with &)
  prepare)            # config.json and the (warm-started) base model in the run dir
    exec echo2 prepare --config "$CONFIG" --set run_dir="$RUN_DIR" ;;
  coordinator)        # every interface, a port the workers are told
    exec echo2 coordinator --run-dir "$RUN_DIR" --set coordinator.host=0.0.0.0 --set coordinator.port="$PORT" ;;
  learner)            # the broadcast origin on every interface, announced at LEARNER_HOST
    exec echo2 learner --run-dir "$RUN_DIR" --set learner.host=0.0.0.0 --set learner.advertise_host="$LEARNER_HOST" ;;
  # ---- on each rollout machine
  check)              # can it join? coordinator reachable, same echo2, token, relay reachable
    exec echo2 worker --check --coordinator "http://$LEARNER_HOST:$PORT" --set relay_host=0.0.0.0 --set relay_advertise_host="$THIS_HOST" ;;
  worker)             # peers can reach it: it relays weights to other workers
    exec echo2 worker --coordinator "http://$LEARNER_HOST:$PORT" --set price_per_hour="$PRICE_PER_HOUR" --set bandwidth_bps="$BANDWIDTH_BPS" --set relay_host=0.0.0.0 --set relay_advertise_host="$THIS_HOST" ;;
  worker-behind-nat)  # no incoming connections: it only ever receives (a broadcast leaf)
    exec echo2 worker --coordinator "http://$LEARNER_HOST:$PORT" --set price_per_hour="$PRICE_PER_HOUR" --set bandwidth_bps="$BANDWIDTH_BPS" --set accepts_incoming=false ;;
  *)
    echo "usage: $0 prepare|coordinator|learner|check|worker|worker-behind-nat (settings: see the top of $0)" >&2
    exit 2 ;;
esac
