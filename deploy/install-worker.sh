#!/bin/sh
# install-worker.sh: install a Tether worker on this machine, join it to a brain and start it.
# Safe to run again: see --help. POSIX sh; needs sha256sum (or shasum, or openssl), and curl
# for --url.
set -eu

PROG=install-worker.sh
UNIT=tether-worker.service

usage() {
	cat <<'EOF'
Usage:
  install-worker.sh --brain URL --token T --ca-hash sha256:HEX [--name N] [--label K=V]...
                    (--binary PATH | --url URL) --sha256 HEX [--prefix DIR] [--no-start]
  install-worker.sh --uninstall [--purge] [--prefix DIR]

Installs the worker binary after checking its SHA-256, enrols it with the brain once
(`worker join --no-run`, with the line `brain token create` printed) and runs it
(`worker run`) as a systemd service.

  --brain URL       the brain, e.g. https://brain.example:7443
  --token T         one-time join token from `brain token create` (or $TETHER_JOIN_TOKEN,
                    which keeps it out of the process list; it is passed on that way)
  --ca-hash H       the brain's CA pin, sha256:<hex>, from `brain token create`
  --name N          name shown in `brain workers` (default: the host name)
  --label K=V       label for placement, repeatable
  --binary PATH     the worker binary to install ...
  --url URL         ... or where to download it from (with curl)
  --sha256 HEX      the binary's SHA-256 (required); a mismatch installs nothing
  --prefix DIR      install the binary as DIR/bin/tether-worker
                    (default ~/.local, or /usr/local as root)
  --no-start        install and enrol, but do not start (or restart) anything
  --ephemeral D     for a machine the brain provisioned: once the brain has been
                    unreachable for D (e.g. 10m; also while joining) the worker gives up
                    and powers the machine off (systemd's FailureAction does it too), so
                    the machine cannot outlive its brain
  --uninstall       stop the worker and remove the binary, the unit and the pid/log files
  --purge           with --uninstall, also delete the state dir: identity and workspaces
  -h, --help        this help

As a normal user:
  binary    ~/.local/bin/tether-worker
  state     ~/.local/share/tether-worker   (identity, call journal, workspaces)
  unit      ~/.config/systemd/user/tether-worker.service   (systemctl --user)
  Where `systemctl --user` cannot reach a user manager (containers, some SSH sessions), the
  worker is started with setsid nohup instead, its pid in ~/.local/state/tether-worker/
  worker.pid and its log beside it; it is then not restarted if it dies or at boot. To
  keep a user service running while you are logged out: loginctl enable-linger "$USER".
As root:
  binary    /usr/local/bin/tether-worker
  state     /var/lib/tether-worker, owned by the system user tether-worker (created)
  unit      /etc/systemd/system/tether-worker.service

Running it again is safe: a state dir that already holds an identity is not enrolled again
(--brain, --token and --ca-hash are then not needed), the binary is replaced only when its
checksum differs, the unit is rewritten only when it changed, and the service is restarted
only when one of them changed. Each step prints what it did: installed, updated, unchanged,
enrolled, started, restarted, removed.

Environment:
  TETHER_INSTALL_PREFIX  a directory used instead of $HOME for every per-user path (as root:
                         put in front of every system path, like DESTDIR); for tests.

Exit status: 0 done; 1 failed (nothing is left half-installed by a checksum mismatch);
2 bad arguments.
EOF
}

say() { printf '%s\n' "$*"; }
warn() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
	printf '%s: error: %s\n' "$PROG" "$*" >&2
	exit 1
}
usage_error() {
	printf '%s: %s (see --help)\n' "$PROG" "$*" >&2
	exit 2
}

# --- arguments -------------------------------------------------------------------------

brain='' token="${TETHER_JOIN_TOKEN:-}" ca_hash='' name='' labels='' binary='' url='' sha256='' prefix=''
no_start=0 uninstall=0 purge=0 ephemeral=''

# value OPTION NARGS: fails unless the option has a value after it.
value() {
	[ "$2" -ge 2 ] || usage_error "$1 needs a value"
}

while [ $# -gt 0 ]; do
	opt=$1
	case $opt in
	--*=*)
		# --opt=value: split it and go round again.
		shift
		set -- "${opt%%=*}" "${opt#*=}" "$@"
		continue
		;;
	esac
	case $opt in
	--brain)
		value "$opt" $#
		brain=$2
		shift
		;;
	--token)
		value "$opt" $#
		token=$2
		shift
		;;
	--ca-hash)
		value "$opt" $#
		ca_hash=$2
		shift
		;;
	--name)
		value "$opt" $#
		name=$2
		shift
		;;
	--label)
		value "$opt" $#
		case $2 in
		*=*) ;;
		*) usage_error "--label wants KEY=VALUE, not '$2'" ;;
		esac
		case $2 in
		*'
'*) usage_error "--label must not contain a newline" ;;
		esac
		labels="$labels$2
"
		shift
		;;
	--binary)
		value "$opt" $#
		binary=$2
		shift
		;;
	--url)
		value "$opt" $#
		url=$2
		shift
		;;
	--sha256)
		value "$opt" $#
		sha256=$2
		shift
		;;
	--prefix)
		value "$opt" $#
		prefix=$2
		shift
		;;
	--ephemeral)
		value "$opt" $#
		case $2 in
		'' | *[!0-9smhd]*) usage_error "--ephemeral wants a duration like 10m, not '$2'" ;;
		esac
		ephemeral=$2
		shift
		;;
	--no-start) no_start=1 ;;
	--uninstall) uninstall=1 ;;
	--purge) purge=1 ;;
	-h | --help)
		usage
		exit 0
		;;
	*) usage_error "unknown argument '$opt'" ;;
	esac
	shift
done

if [ "$purge" = 1 ] && [ "$uninstall" = 0 ]; then
	usage_error "--purge only goes with --uninstall"
fi

# --- where things go -------------------------------------------------------------------

if [ "$(id -u)" = 0 ]; then
	mode=system
	root=${TETHER_INSTALL_PREFIX:-}
	[ -n "$prefix" ] || prefix=$root/usr/local
	state_dir=$root/var/lib/tether-worker
	unit_dir=$root/etc/systemd/system
	run_dir=$root/run/tether-worker
	log_dir=$root/var/log/tether-worker
	svc_user=tether-worker
else
	mode=user
	base=${TETHER_INSTALL_PREFIX:-${HOME:?HOME is not set}}
	[ -n "$prefix" ] || prefix=$base/.local
	state_dir=$base/.local/share/tether-worker
	unit_dir=$base/.config/systemd/user
	run_dir=$base/.local/state/tether-worker
	log_dir=$run_dir
	svc_user=''
fi
case $prefix in
/*) ;;
*) prefix=$(pwd)/$prefix ;;
esac
bin_dir=$prefix/bin
bin=$bin_dir/tether-worker
# What `worker run` gets besides --state; an ephemeral machine gives up and powers off.
run_extra=''
if [ -n "$ephemeral" ]; then
	run_extra=" --exit-after-unreachable $ephemeral --poweroff-on-give-up"
fi
unit_file=$unit_dir/$UNIT
pid_file=$run_dir/worker.pid
log_file=$log_dir/worker.log

# systemd reads the unit only from the real places: not from under TETHER_INSTALL_PREFIX.
staged=0
if [ "$mode" = system ] && [ -n "$root" ]; then
	staged=1
elif [ "$mode" = user ] && [ "$base" != "${HOME:-}" ]; then
	staged=1
fi

# The paths go into the unit unquoted: keep them plain.
case "$bin$state_dir" in
*[!A-Za-z0-9/._+@:,=-]*)
	die "paths with spaces or special characters are not supported: $bin, $state_dir"
	;;
esac

# --- helpers ---------------------------------------------------------------------------

sha256_of() {
	if command -v sha256sum >/dev/null 2>&1; then
		sha256sum <"$1" | cut -d' ' -f1
	elif command -v shasum >/dev/null 2>&1; then
		shasum -a 256 <"$1" | cut -d' ' -f1
	elif command -v openssl >/dev/null 2>&1; then
		openssl dgst -sha256 <"$1" | sed 's/^.*= *//'
	else
		die "no sha256sum, shasum or openssl to check the binary with"
	fi
}

# systemctl for our mode, if a service manager answers.
have_systemd() {
	[ "$staged" = 0 ] || return 1
	command -v systemctl >/dev/null 2>&1 || return 1
	if [ "$mode" = system ]; then
		[ -d /run/systemd/system ] || return 1
		systemctl show-environment >/dev/null 2>&1
	else
		systemctl --user show-environment >/dev/null 2>&1
	fi
}
sctl() {
	if [ "$mode" = system ]; then
		systemctl "$@"
	else
		systemctl --user "$@"
	fi
}

# The pid in the pid file, if that process is still our worker.
running_pid() {
	[ -f "$pid_file" ] || return 1
	pid=$(cat "$pid_file" 2>/dev/null) || return 1
	case $pid in
	'' | *[!0-9]*) return 1 ;;
	esac
	kill -0 "$pid" 2>/dev/null || return 1
	if [ -r "/proc/$pid/cmdline" ]; then
		# A recycled pid is someone else's process: leave it alone.
		tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qxF -- "$bin" || return 1
	fi
	printf '%s\n' "$pid"
}

stop_pid() {
	pid=$1
	kill "$pid" 2>/dev/null || return 0
	i=0
	while kill -0 "$pid" 2>/dev/null && [ $i -lt 10 ]; do
		sleep 1
		i=$((i + 1))
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -9 "$pid" 2>/dev/null || true
	fi
}

start_detached() {
	mkdir -p "$run_dir" "$log_dir"
	if [ "$mode" = system ]; then
		command -v setpriv >/dev/null 2>&1 ||
			die "no systemd and no setpriv to run the worker as $svc_user: start it yourself: $bin run --state $state_dir"
		# shellcheck disable=SC2086 # run_extra is words of this script's own making
		setsid nohup setpriv --reuid="$svc_user" --regid="$svc_user" --init-groups \
			"$bin" run --state "$state_dir" $run_extra </dev/null >>"$log_file" 2>&1 &
	else
		# shellcheck disable=SC2086
		setsid nohup "$bin" run --state "$state_dir" $run_extra </dev/null >>"$log_file" 2>&1 &
	fi
	echo $! >"$pid_file"
	# A worker that cannot start (not joined, bad identity) exits at once: say so.
	sleep 1
	if ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
		rm -f "$pid_file"
		tail -n 5 "$log_file" >&2 || true
		die "the worker exited at once; its log is $log_file"
	fi
}

membership_field() {
	sed -n "s/^ *\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" "$state_dir/worker.json" 2>/dev/null | head -n 1
}

# " as ID (NAME)", from the membership file the worker wrote.
enrolled_as() {
	wid=$(membership_field worker_id)
	[ -z "$wid" ] || printf ' as %s (%s)' "$wid" "$(membership_field name)"
}

is_enrolled() {
	[ -f "$state_dir/worker.json" ] && [ -f "$state_dir/identity/cert.pem" ]
}

# An ephemeral machine's system unit: when the worker fails for good (it gave up on its
# brain, exit 69; a bad config, 78; or it keeps crashing), systemd powers the machine off.
ephemeral_lines() {
	[ -n "$ephemeral" ] || return 0
	printf '\nFailureAction=poweroff'
}

# The unit for this mode and these paths; %h where the paths are under the real home.
unit_text() {
	if [ "$mode" = system ]; then
		cat <<EOF
# Written by install-worker.sh; the same as deploy/tether-worker.service but for its paths.
[Unit]
Description=Tether worker
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=60
StartLimitBurst=5

[Service]
Type=simple
User=$svc_user
Group=$svc_user
StateDirectory=tether-worker
StateDirectoryMode=0711
Environment=TETHER_WORKER_STATE=$state_dir
ExecStart=$bin run --state $state_dir$run_extra
Restart=on-failure
RestartSec=2
RestartPreventExitStatus=78 69$(ephemeral_lines)
KillMode=control-group
TimeoutStopSec=30
Delegate=yes
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectHostname=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes

[Install]
WantedBy=multi-user.target
EOF
	else
		u_state=$state_dir u_bin=$bin
		if [ -n "${HOME:-}" ]; then
			case $u_state in "$HOME"/*) u_state=%h${u_state#"$HOME"} ;; esac
			case $u_bin in "$HOME"/*) u_bin=%h${u_bin#"$HOME"} ;; esac
		fi
		cat <<EOF
# Written by install-worker.sh; the same as deploy/tether-worker.user.service but for its paths.
[Unit]
Description=Tether worker
StartLimitIntervalSec=60
StartLimitBurst=5

[Service]
Type=simple
Environment=TETHER_WORKER_STATE=$u_state
ExecStart=$u_bin run --state $u_state$run_extra
Restart=on-failure
RestartSec=2
RestartPreventExitStatus=78 69
KillMode=control-group
TimeoutStopSec=30
Delegate=yes
NoNewPrivileges=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes

[Install]
WantedBy=default.target
EOF
	fi
}

tmp=''
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- uninstall -------------------------------------------------------------------------

if [ "$uninstall" = 1 ]; then
	if have_systemd && { [ -f "$unit_file" ] || sctl cat "$UNIT" >/dev/null 2>&1; }; then
		if sctl is-active --quiet "$UNIT" || sctl is-enabled --quiet "$UNIT" 2>/dev/null; then
			sctl disable --now "$UNIT" >/dev/null 2>&1 || sctl stop "$UNIT" || true
			say "stopped $UNIT"
		fi
	fi
	if pid=$(running_pid); then
		stop_pid "$pid"
		say "stopped worker (pid $pid)"
	fi
	for f in "$unit_file" "$bin" "$pid_file" "$log_file"; do
		if [ -e "$f" ]; then
			rm -f "$f"
			say "removed $f"
		fi
	done
	rmdir "$run_dir" "$log_dir" 2>/dev/null || true
	if have_systemd; then sctl daemon-reload || true; fi
	if [ -d "$state_dir" ]; then
		if [ "$purge" = 1 ]; then
			rm -rf "$state_dir"
			say "removed $state_dir"
		else
			say "kept $state_dir (identity, workspaces): --uninstall --purge deletes it"
		fi
	fi
	if [ "$mode" = system ] && id "$svc_user" >/dev/null 2>&1; then
		say "kept user $svc_user (userdel $svc_user removes it)"
	fi
	say "uninstalled"
	exit 0
fi

# --- install: check the arguments before touching anything -----------------------------

[ -n "$sha256" ] || usage_error "--sha256 HEX is required: the SHA-256 of the worker binary"
sha256=$(printf '%s' "${sha256#sha256:}" | tr 'A-F' 'a-f')
case $sha256 in
*[!0-9a-f]*) usage_error "--sha256 wants 64 hex digits" ;;
esac
[ ${#sha256} -eq 64 ] || usage_error "--sha256 wants 64 hex digits"
if [ -n "$binary" ] && [ -n "$url" ]; then
	usage_error "give --binary or --url, not both"
fi
[ -n "$binary" ] || [ -n "$url" ] || usage_error "give the worker binary: --binary PATH or --url URL"
if ! is_enrolled; then
	if [ -z "$brain" ] || [ -z "$token" ] || [ -z "$ca_hash" ]; then
		usage_error "$state_dir holds no identity yet: --brain, --token and --ca-hash are needed to enrol (the line \`brain token create\` printed)"
	fi
fi

# --- the binary ------------------------------------------------------------------------

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tether-install.XXXXXX")
if [ -n "$url" ]; then
	command -v curl >/dev/null 2>&1 || die "--url needs curl"
	curl -fsSL --retry 3 -o "$tmp/worker" "$url" || die "cannot download $url"
	src=$tmp/worker
else
	[ -f "$binary" ] || die "--binary $binary: no such file"
	src=$binary
fi
actual=$(sha256_of "$src")
if [ "$actual" != "$sha256" ]; then
	die "checksum mismatch for ${url:-$binary}:
  expected sha256 $sha256
  got      sha256 $actual
refusing to install it; nothing was changed"
fi

changed=0
if [ -f "$bin" ] && [ "$(sha256_of "$bin")" = "$sha256" ]; then
	say "unchanged $bin (sha256 $sha256)"
else
	verb=installed
	[ -e "$bin" ] && verb=updated
	mkdir -p "$bin_dir"
	# Copy beside it, then rename: a running worker keeps its old file, nobody sees half a file.
	cp "$src" "$bin_dir/.tether-worker.new"
	chmod 0755 "$bin_dir/.tether-worker.new"
	if [ "$(sha256_of "$bin_dir/.tether-worker.new")" != "$sha256" ]; then
		rm -f "$bin_dir/.tether-worker.new"
		die "the copy in $bin_dir does not match the checksum; $bin was not changed"
	fi
	mv -f "$bin_dir/.tether-worker.new" "$bin"
	say "$verb $bin (sha256 $sha256)"
	changed=1
fi

# --- the state dir and the enrolment ---------------------------------------------------

if [ "$mode" = system ] && ! id "$svc_user" >/dev/null 2>&1; then
	command -v useradd >/dev/null 2>&1 || die "no useradd to create the system user $svc_user"
	useradd --system --user-group --home-dir "$state_dir" --no-create-home \
		--shell /usr/sbin/nologin "$svc_user"
	say "created system user $svc_user"
fi

if is_enrolled; then
	say "unchanged $state_dir: already enrolled$(enrolled_as); not joining again"
	if [ -n "$token" ] && [ -z "${TETHER_JOIN_TOKEN:-}" ]; then
		warn "--token ignored: this worker is already enrolled (uninstall --purge first to enrol afresh)"
	fi
else
	mkdir -p "$state_dir"
	chmod 0711 "$state_dir"
	set -- "$bin" join --no-run --brain "$brain" --ca-hash "$ca_hash" --state "$state_dir"
	if [ -n "$ephemeral" ]; then
		# A brain not reachable yet is waited for; one that stays away ends the machine.
		set -- "$@" --exit-after-unreachable "$ephemeral" --poweroff-on-give-up
	fi
	if [ -n "$name" ]; then
		set -- "$@" --name "$name"
	fi
	while IFS= read -r l; do
		[ -z "$l" ] || set -- "$@" --label "$l"
	done <<EOF
$labels
EOF
	# The token goes by environment: the process list shows arguments.
	TETHER_JOIN_TOKEN=$token "$@" || die "joining the brain failed (see above); nothing was enrolled"
	if [ "$mode" = system ]; then
		chown -R "$svc_user:$svc_user" "$state_dir"
	fi
	say "enrolled$(enrolled_as); identity in $state_dir"
fi

# --- the unit --------------------------------------------------------------------------

unit_changed=0
unit_text >"$tmp/unit"
if [ -f "$unit_file" ] && cmp -s "$tmp/unit" "$unit_file"; then
	say "unchanged $unit_file"
else
	verb=installed
	[ -e "$unit_file" ] && verb=updated
	mkdir -p "$unit_dir"
	cp "$tmp/unit" "$unit_file.new"
	chmod 0644 "$unit_file.new"
	mv -f "$unit_file.new" "$unit_file"
	say "$verb $unit_file"
	unit_changed=1
fi

# --- start -----------------------------------------------------------------------------

if [ "$no_start" = 1 ]; then
	say "not started (--no-start)"
	if have_systemd; then
		if [ "$mode" = system ]; then s=''; else s=' --user'; fi
		if sctl is-active --quiet "$UNIT"; then
			if [ "$changed" = 1 ] || [ "$unit_changed" = 1 ]; then
				say "note: $UNIT runs the old version until: systemctl$s daemon-reload && systemctl$s restart $UNIT"
			fi
		else
			say "start it with: systemctl$s daemon-reload && systemctl$s enable --now $UNIT"
		fi
	elif pid=$(running_pid); then
		if [ "$changed" = 1 ]; then
			say "note: the worker running as pid $pid runs the old binary until this script runs again without --no-start"
		fi
	else
		say "start it with: $bin run --state $state_dir   (or run this script again without --no-start)"
	fi
	exit 0
fi

if have_systemd; then
	if pid=$(running_pid); then
		# Started without systemd by an earlier run: one worker per identity.
		stop_pid "$pid"
		rm -f "$pid_file"
		say "stopped worker started without systemd (pid $pid)"
	fi
	if [ "$unit_changed" = 1 ]; then
		sctl daemon-reload
	fi
	if sctl is-active --quiet "$UNIT"; then
		if [ "$changed" = 1 ] || [ "$unit_changed" = 1 ]; then
			sctl restart "$UNIT"
			say "restarted $UNIT"
		else
			say "unchanged $UNIT: running"
		fi
		sctl enable --quiet "$UNIT"
	else
		sctl enable --quiet --now "$UNIT"
		say "started $UNIT"
	fi
	# A worker that cannot start (not joined, bad identity: exit 78) stops at once.
	sleep 2
	if ! sctl is-active --quiet "$UNIT"; then
		sctl status --no-pager --lines=5 "$UNIT" >&2 || true
		die "$UNIT is not running (see above)"
	fi
	if [ "$mode" = system ]; then
		say "status: systemctl status $UNIT; logs: journalctl -u $UNIT"
	else
		say "status: systemctl --user status $UNIT; logs: journalctl --user -u $UNIT"
		if command -v loginctl >/dev/null 2>&1 &&
			[ "$(loginctl show-user "$(id -un)" -p Linger --value 2>/dev/null || true)" != yes ]; then
			say "note: it stops when you log out; loginctl enable-linger $(id -un) keeps it running"
		fi
	fi
else
	if [ "$staged" = 1 ]; then
		how='TETHER_INSTALL_PREFIX is set, and systemd does not read units from there'
	elif [ "$mode" = system ]; then
		how='no systemd here (systemctl does not answer)'
	else
		how='systemd --user is not available here (systemctl --user does not answer)'
	fi
	warn "$how: the worker runs under setsid nohup, not as a service; it is not restarted if it dies, nor at boot (run this script again to start it)"
	if pid=$(running_pid); then
		if [ "$changed" = 1 ]; then
			stop_pid "$pid"
			start_detached
			say "restarted worker (pid $(cat "$pid_file"), log $log_file)"
		else
			say "unchanged worker: running (pid $pid, log $log_file)"
		fi
	else
		start_detached
		say "started worker (pid $(cat "$pid_file"), log $log_file)"
	fi
fi
