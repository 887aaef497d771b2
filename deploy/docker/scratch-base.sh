#!/bin/sh
# Builds a base image FROM scratch for deploy/Dockerfile.* where no registry is reachable:
# the shared libraries the given binaries need (as `ldd` reports them, the loader included),
# a static busybox for sh and the usual tools (`apt-get install busybox-static`), and
# /etc/passwd with nobody (65534). A directory among the paths is copied whole, at the same
# path, with the libraries of every program and shared object in it (how the PostgreSQL image
# of deploy/Dockerfile.postgres takes the host's /usr/lib/postgresql/N).
#
#   deploy/docker/scratch-base.sh TAG BINARY|DIRECTORY...
#   docker build -f deploy/Dockerfile.worker --build-arg BASE=TAG -t tether-worker .
set -eu
tag=${1:?usage: scratch-base.sh TAG BINARY...}
shift
[ $# -gt 0 ] || { echo "usage: scratch-base.sh TAG BINARY|DIRECTORY..." >&2; exit 2; }
busybox=${BUSYBOX:-/bin/busybox}
[ -x "$busybox" ] || { echo "no static busybox at $busybox (apt-get install busybox-static)" >&2; exit 1; }
ctx=$(mktemp -d "${TMPDIR:-/tmp}/tether-base.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
r=$ctx/rootfs
mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/usr/local/bin"
chmod 1777 "$r/tmp"
for path in "$@"; do
	[ -d "$path" ] || [ -x "$path" ] || { echo "not an executable or a directory: $path" >&2; exit 1; }
done
for path in "$@"; do
	if [ -d "$path" ]; then
		mkdir -p "$r$(dirname "$path")"
		cp -a "$path" "$r$path"
		find "$path" -type f \( -perm -u+x -o -name '*.so*' \)
	else
		echo "$path"
	fi
done | while read -r bin; do
	# ldd fails on what is not dynamically linked (scripts, data): nothing to copy for those.
	ldd "$bin" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' || true
done | sort -u | while read -r lib; do
	mkdir -p "$r$(dirname "$lib")"
	cp -L "$lib" "$r$lib"
done
cp "$busybox" "$r/bin/busybox"
chmod 0755 "$r/bin/busybox"
for applet in $("$busybox" --list); do
	[ "$applet" = busybox ] || ln -sf busybox "$r/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
tar -C "$r" --numeric-owner --owner=0 --group=0 -cf "$ctx/rootfs.tar" .
printf 'FROM scratch\nADD rootfs.tar /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n' >"$ctx/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$ctx" >/dev/null
echo "built $tag"
