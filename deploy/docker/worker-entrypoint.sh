#!/bin/sh
# The worker container: enrol once with the token the brain container wrote for this worker
# (/join/NAME.token: token, then the CA pin), then run. NAME is TETHER_WORKER_NAME.
set -eu
name="${TETHER_WORKER_NAME:?set TETHER_WORKER_NAME}"
state="${TETHER_WORKER_STATE:-/state/worker}"
if [ ! -f "$state/worker.json" ]; then
	i=0
	until [ -s "/join/$name.token" ]; do
		i=$((i + 1))
		[ $i -lt 600 ] || { echo "no join token for $name in /join" >&2; exit 1; }
		sleep 0.2
	done
	token=$(sed -n 1p "/join/$name.token")
	pin=$(sed -n 2p "/join/$name.token")
	TETHER_JOIN_TOKEN="$token" worker join --no-run --brain "${TETHER_BRAIN:?set TETHER_BRAIN}" \
		--ca-hash "$pin" --name "$name" --state "$state"
fi
exec worker run --state "$state"
