#!/bin/sh
# The brain container: initialise the data dir once, serve, and mint one join token for each
# worker named in TETHER_WORKERS that has none yet, into /join/NAME.token (token, then the CA
# pin), where those workers' containers read it. Tokens are one-time and expire in an hour.
set -eu
: "${TETHER_DATA:=/data}"
host="${TETHER_HOST:-brain}"
if [ ! -f "$TETHER_DATA/ca.pem" ]; then
	brain init --host "$host"
fi
brain serve --listen 0.0.0.0:7443 &
serve=$!
trap 'kill -TERM $serve 2>/dev/null; wait $serve; exit 0' TERM INT
admin="--brain https://127.0.0.1:7443"
for name in ${TETHER_WORKERS:-}; do
	[ -s "/join/$name.token" ] && continue
	i=0
	# shellcheck disable=SC2086
	# The join line (`TETHER_JOIN_TOKEN=... worker join ... --ca-hash ...`) goes to stderr.
	until line=$(brain $admin token create --ttl 1h --label "compose=$name" 2>&1 | grep 'worker join'); do
		i=$((i + 1))
		[ $i -lt 100 ] || { echo "the brain did not come up" >&2; exit 1; }
		sleep 0.2
	done
	token=$(echo "$line" | sed -n 's/.*TETHER_JOIN_TOKEN=\([^ ]*\).*/\1/p')
	pin=$(echo "$line" | sed -n 's/.*--ca-hash \([^ ]*\).*/\1/p')
	umask 077
	printf '%s\n%s\n' "$token" "$pin" >"/join/$name.tmp"
	chmod 0644 "/join/$name.tmp"
	mv "/join/$name.tmp" "/join/$name.token"
	echo "join token for $name written"
done
wait $serve
