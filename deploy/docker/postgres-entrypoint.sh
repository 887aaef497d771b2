#!/bin/sh
# PostgreSQL for deploy/compose.replicas.yaml where no registry is reachable (the image of
# deploy/Dockerfile.postgres, built from the host's Debian packages). It reads the variables
# of the official `postgres` image, so either image fits the compose file: POSTGRES_PASSWORD
# (required), POSTGRES_USER (postgres), POSTGRES_DB (the user's name) and PGDATA.
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	mkdir -p "$PGDATA"
	chmod 0700 "$PGDATA"
	pw=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
	"$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pw" -E UTF8 --no-locale \
		--auth-local=trust --auth-host=scram-sha-256 >/dev/null
	rm -f "$pw"
	# Clients come from the compose network, with a password.
	echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
	if [ "$db" != postgres ]; then
		echo "CREATE DATABASE \"$db\" OWNER \"$user\";" |
			"$bin/postgres" --single -D "$PGDATA" -j postgres >/dev/null
	fi
	echo "initialised $PGDATA: user $user, database $db"
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp
