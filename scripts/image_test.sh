#!/usr/bin/env bash
# The container image, built and run for real: `make image-test`.
#
# Builds the Dockerfile with podman on a Debian bookworm base made here with
# debootstrap (no registry needed) and runs it detached with host networking,
# restricted as deploy/kubernetes restricts it (read-only root, no
# capabilities). From the host it checks gRPC health SERVING and one
# PrepareTool/CommitTool through the Python client with a bearer token (and
# UNAUTHENTICATED without one); inside, the image's own HEALTHCHECK, `effectd
# ctl` and the non-root user; then a graceful stop (exit 0 on SIGTERM).
# Everything it creates (container, images, private podman storage, the
# scratch directory) is removed at exit, on failure too.
#
# Needs root (debootstrap, chroot, rootful podman) and Debian's archive; it
# installs podman, buildah, debootstrap and runc with apt-get if missing.
# Environment: PY (the Python with effectd-client, default .venv/bin/python),
# EFFECTD_IMAGE_MIRROR (a Debian mirror; default: the one apt uses here),
# KEEP_SCRATCH=1 (leave the scratch directory for inspection).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
TAG=$$
BASE_IMAGE=localhost/effectd-base:bookworm-$TAG
IMAGE=localhost/effectd:test-$TAG
NAME=effectd-image-test-$TAG

say() { printf '[image-test %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
    die "needs root (debootstrap, chroot and rootful podman); run it as root"
fi
[ -x "$PY" ] || die "no Python at $PY (run 'make run' or set PY)"

missing=()
for tool in podman buildah debootstrap runc; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah debootstrap runc
fi

# Podman's machine-wide state directories: whatever of them this run creates,
# it removes.
STATE_DIRS=(/run/libpod /run/containers /var/lib/containers /etc/containers/networks /etc/cni/net.d)
preexisting=()
for dir in "${STATE_DIRS[@]}"; do
    [ -e "$dir" ] && preexisting+=("$dir")
done

S=$(mktemp -d /tmp/effectd-image.XXXXXX)
R=$S/rootfs
cid=""

cleanup() {
    local rc=$?
    set +e
    if [ "$rc" -ne 0 ] && [ -n "$cid" ]; then
        say "container log:"
        podman logs "$cid" 2>&1 | tail -40 >&2
    fi
    if [ "$rc" -ne 0 ] && [ -s "$S/podman.log" ]; then
        tail -20 "$S/podman.log" >&2
    fi
    if [ -n "$cid" ]; then
        podman rm --force --time 0 --volumes "$cid" >/dev/null 2>&1
    fi
    podman volume rm --force "$NAME-run" >/dev/null 2>&1
    podman rmi --force "$IMAGE" "$BASE_IMAGE" >/dev/null 2>&1
    podman rmi --all --force >/dev/null 2>&1
    mountpoint -q "$R/proc" && umount "$R/proc"
    # Overlay layers still mounted under the private storage block removal.
    if [ -d "$S/storage" ]; then
        findmnt -rn -o TARGET | grep -F "$S/" | sort -r | while read -r m; do
            umount -l "$m"
        done
    fi
    if [ "${KEEP_SCRATCH:-0}" = 1 ]; then
        say "scratch directory kept: $S"
    else
        rm -rf "$S"
    fi
    for dir in "${STATE_DIRS[@]}"; do
        if [ -e "$dir" ] && [[ " ${preexisting[*]} " != *" $dir "* ]]; then
            rm -rf "$dir"
        fi
    done
    if [ "$rc" -eq 0 ]; then say "passed"; else say "failed (exit $rc)"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. Private podman configuration: runc (crun fails on hybrid cgroups), rlimits
#    the machine allows, storage and run state inside the scratch directory.
mkdir -p "$S/storage" "$S/runroot" "$S/tmp"
cat >"$S/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$S/tmp"
EOF
cat >"$S/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$S/storage"
runroot = "$S/runroot"
EOF
export CONTAINERS_CONF=$S/containers.conf
export CONTAINERS_STORAGE_CONF=$S/storage.conf
export TMPDIR=$S/tmp

# 2. A base image without a registry: Debian bookworm with Python 3.11.
mirror=${EFFECTD_IMAGE_MIRROR:-}
if [ -z "$mirror" ]; then
    mirror=$(grep -rhoE '^(deb |URIs:)[^#]*https?://[^ ]+/debian/?( |$)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
        | grep -oE 'https?://[^ ]+' | grep -v security | head -n 1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
say "debootstrap bookworm from $mirror"
debootstrap --variant=minbase bookworm "$R" "$mirror" >"$S/debootstrap.log" 2>&1 \
    || { tail -20 "$S/debootstrap.log" >&2; die "debootstrap"; }
# A clean environment in the chroot: nothing of this script's (TMPDIR) leaks in.
in_root() {
    chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"
}
mount -t proc proc "$R/proc"
in_root apt-get install -y -qq --no-install-recommends \
    python3 python3-venv python3-pip ca-certificates >"$S/apt.log" 2>&1 \
    || { tail -20 "$S/apt.log" >&2; die "python3 in the base"; }
# This machine's extra CA certificates (an intercepting proxy's, say) let
# pip reach PyPI during the build, as they let it on the host.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/"
fi
in_root update-ca-certificates >/dev/null
# Behave like python:3.11-slim: `python` and `pip` on PATH, pip not refused.
rm -f "$R"/usr/lib/python3.*/EXTERNALLY-MANAGED
ln -sf python3 "$R/usr/bin/python"
ln -sf pip3 "$R/usr/bin/pip"
in_root apt-get clean
umount "$R/proc"
tar -C "$R" -c . | podman import --quiet \
    --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
say "base image $BASE_IMAGE imported"

# 3. The image, from the Dockerfile, on that base. Docker format: the OCI one
#    drops HEALTHCHECK.
say "podman build"
podman build --quiet --format docker --build-arg "BASE=$BASE_IMAGE" \
    --tag "$IMAGE" --file "$ROOT/Dockerfile" "$ROOT" >"$S/build.log" 2>&1 \
    || { tail -40 "$S/build.log" >&2; die "podman build"; }
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE ($((size / 1000000)) MB)"
healthcheck=$(podman image inspect --format '{{json .HealthCheck}}' "$IMAGE")
case "$healthcheck" in
    *sidecar.probe*) ;;
    *) die "the image has no HEALTHCHECK through sidecar.probe: $healthcheck" ;;
esac

# 4. Run it detached on the host's network, on free loopback ports.
read -r grpc_port health_port < <("$PY" - <<'PY'
import socket

sockets = [socket.socket() for _ in range(2)]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in sockets))
PY
)
# Authentication on, with a token made for this run; it reaches the daemon
# through the environment (EFFECTD_TOKENS), never through argv.
EFFECTD_TOKEN=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')
EFFECTD_TOKENS=$(printf '[[token]]\nname = "image-test"\nsecret = "%s"\nroles = ["agent", "operator"]\nnamespaces = ["*"]\n' "$EFFECTD_TOKEN")
export EFFECTD_TOKEN EFFECTD_TOKENS
say "podman run (gRPC 127.0.0.1:$grpc_port, health 127.0.0.1:$health_port)"
# Restricted as deploy/kubernetes restricts it: read-only root, no
# capabilities, no privilege gain; the socket directory a named volume, as
# the README shows (it starts as the image's /run/effectd: 0700, uid 10001).
cid=$(podman run --detach --init --network host --name "$NAME" --env EFFECTD_TOKENS \
    --read-only --volume "$NAME-run:/run/effectd" \
    --cap-drop all --security-opt no-new-privileges \
    "$IMAGE" --init --listen "127.0.0.1:$grpc_port" \
    --health-listen "127.0.0.1:$health_port" --grace 5 2>>"$S/podman.log")

# 5. From the host: gRPC health SERVING on the health port, within a minute.
serving=0
for _ in $(seq 1 120); do
    if "$PY" -m sidecar.probe --timeout 1 "127.0.0.1:$health_port" 2>/dev/null; then
        serving=1
        break
    fi
    [ "$(podman inspect --format '{{.State.Running}}' "$cid")" = true ] \
        || die "the container exited"
    sleep 0.5
done
[ "$serving" = 1 ] || die "health never SERVING on 127.0.0.1:$health_port"
say "health SERVING"

# 6. From the host: one PrepareTool (and its commit and replay) through the
#    Python client on the gRPC port, with the token (EFFECTD_TOKEN); without
#    it, UNAUTHENTICATED.
"$PY" - "127.0.0.1:$grpc_port" <<'PY'
import sys

from effectd_client import Client, Decision, Effect, EffectdError

with Client(sys.argv[1], token="") as anonymous:
    try:
        anonymous.get_tool_call("image-test", "call-1")
    except EffectdError as exc:
        assert exc.reason == "UNAUTHENTICATED", exc.reason
    else:
        raise AssertionError("a call without a token was served")

with Client(sys.argv[1]) as effectd:
    first = effectd.prepare_tool(
        "image-test", "call-1", "send_email", {"to": "ada@example.com"},
        effect=Effect.SIDE_EFFECT, start=True,
    )
    assert first.decision is Decision.EXECUTE, first.decision
    effectd.commit_tool("image-test", "call-1", first.call.attempt, {"id": "m-1"})
    again = effectd.prepare_tool(
        "image-test", "call-1", "send_email", {"to": "ada@example.com"}
    )
    assert again.decision is Decision.RETURN_RESULT, again.decision
    assert again.call.result is not None and again.call.result.value == {"id": "m-1"}
print("no token: UNAUTHENTICATED; PrepareTool: EXECUTE, then RETURN_RESULT")
PY

# 7. Inside: the image's HEALTHCHECK passes, `effectd ctl` finds the socket
#    from the image's environment, and the daemon is not root.
podman healthcheck run "$cid" >/dev/null 2>>"$S/podman.log" \
    || die "the image's HEALTHCHECK failed"
podman exec --env EFFECTD_TOKEN "$cid" effectd ctl audit verify >/dev/null \
    || die "effectd ctl audit verify in the container"
uid=$(podman exec "$cid" /opt/effectd/bin/python -c 'import os; print(os.getuid())')
[ "$uid" = 10001 ] || die "the daemon runs as uid $uid, not 10001"
say "HEALTHCHECK healthy, uid $uid"

# 8. SIGTERM: a graceful stop, exit status 0.
podman stop --time 20 "$cid" >/dev/null 2>>"$S/podman.log"
code=$(podman inspect --format '{{.State.ExitCode}}' "$cid")
[ "$code" = 0 ] || die "exit status $code after SIGTERM"
say "stopped on SIGTERM with exit status 0"
