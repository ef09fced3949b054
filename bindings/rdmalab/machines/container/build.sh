#!/bin/sh
# Builds the rdmalab host images from Debian's packages alone (no image registry):
#   1. debootstrap a minimal bookworm root file system into CACHE/rootfs (once);
#   2. import it as the base image, localhost/rdmalab-base:bookworm (once per root fs);
#   3. podman build bindings/rdmalab/machines/container/Containerfile on it: localhost/rdmalab-host:bookworm
#      (podman's layer cache makes a repeat a no-op).
# Idempotent: a step whose result exists (and matches) is skipped; --rebuild redoes them all.
#
#   bindings/rdmalab/machines/container/build.sh [--rebuild] [CACHE_DIR]     (default CACHE_DIR: <repo>/.cache/container)
#
# Environment: RLC_MIRROR, RLC_SECURITY_MIRROR (default: what this machine's apt uses, else
# deb.debian.org), RLC_SUITE (bookworm), RLC_INCLUDE (debootstrap --include), RLC_BASE_IMAGE,
# RLC_IMAGE, RLC_EXTRA_PACKAGES (more Debian packages in the host image), RLC_RUNTIME and
# RLC_ULIMITS (see common.sh). Needs root and: apt-get install --no-install-recommends podman
# debootstrap (and runc on a cgroup v1 hybrid host).
set -eu
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"

REBUILD=0
case "${1:-}" in
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --rebuild) REBUILD=1; shift ;;
    -*) rlc_die "unknown option $1 (usage: build.sh [--rebuild] [CACHE_DIR])" ;;
esac
[ $# -le 1 ] || rlc_die "usage: build.sh [--rebuild] [CACHE_DIR]"
CACHE=${1:-$RLC_REPO/.cache/container}

rlc_need_root
rlc_need podman podman
rlc_need debootstrap debootstrap
OPTS=$(rlc_podman_opts) || exit 1

SUITE=${RLC_SUITE:-bookworm}
MIRROR=${RLC_MIRROR:-$(rlc_apt_uri debian)}
SECURITY_MIRROR=${RLC_SECURITY_MIRROR:-$(rlc_apt_uri debian-security)}
INCLUDE=${RLC_INCLUDE:-python3,python3-rpyc,python3-execnet,iproute2,rdma-core,ibverbs-providers,libibverbs1,librdmacm1,nftables}
ROOTFS=$CACHE/rootfs
STAMP=$CACHE/rootfs.stamp   # what the root fs was made from; written once it is complete
WANT="variant=minbase suite=$SUITE mirror=$MIRROR include=$INCLUDE"

mkdir -p "$CACHE" || rlc_die "cannot create the cache directory $CACHE"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

# -- 1. the root file system ------------------------------------------------------------------
if [ "$REBUILD" = 0 ] && [ -d "$ROOTFS" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ]; then
    rlc_log "root file system: $ROOTFS (kept; --rebuild to redo)"
else
    rm -rf "$ROOTFS.tmp" "$STAMP"
    rlc_log "debootstrap $SUITE from $MIRROR into $ROOTFS (log: $CACHE/debootstrap.log)"
    t=$(now)
    if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$ROOTFS.tmp" "$MIRROR" \
            > "$CACHE/debootstrap.log" 2>&1; then
        tail -n 15 "$CACHE/debootstrap.log" >&2
        rlc_die "debootstrap failed (full log: $CACHE/debootstrap.log; is $MIRROR reachable?" \
                "set RLC_MIRROR to the Debian mirror to use)"
    fi
    # What debootstrap copied from this machine, and the downloaded .debs: not for an image
    # (podman writes /etc/hostname and /etc/resolv.conf for each container).
    rm -f "$ROOTFS.tmp/etc/hostname" "$ROOTFS.tmp/etc/resolv.conf" \
          "$ROOTFS.tmp"/var/cache/apt/archives/*.deb
    rm -rf "$ROOTFS"
    mv "$ROOTFS.tmp" "$ROOTFS"
    echo "$WANT" > "$STAMP"
    rlc_log "debootstrap took $(since "$t") s ($(du -sh "$ROOTFS" | cut -f1))"
fi

# -- 2. the base image ------------------------------------------------------------------------
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
OLD_BASE=$(image_id "$RLC_BASE_IMAGE")
OLD_HOST=$(image_id "$RLC_IMAGE")
SUM=$(sha256sum "$STAMP" | cut -c1-16)-$(stat -c %Y "$STAMP")
have=$(podman image inspect --format '{{index .Labels "rdmalab.rootfs"}}' "$RLC_BASE_IMAGE" \
       2>/dev/null || true)
if [ "$REBUILD" = 0 ] && [ "$have" = "$SUM" ]; then
    rlc_log "base image: $RLC_BASE_IMAGE (kept)"
else
    rlc_log "importing $ROOTFS as $RLC_BASE_IMAGE"
    t=$(now)
    tar --numeric-owner -C "$ROOTFS" -c . \
        | podman import -q --change "LABEL rdmalab.rootfs=$SUM" \
                        --change 'CMD ["/bin/bash"]' - "$RLC_BASE_IMAGE" >/dev/null \
        || rlc_die "podman import of $ROOTFS failed"
    rlc_log "import took $(since "$t") s"
fi

# -- 3. the host image ------------------------------------------------------------------------
rlc_log "podman build $RLC_IMAGE from $RLC_HERE/Containerfile (podman options: $OPTS)"
t=$(now)
# --network host: the RUN step only fetches from the mirror (no CNI bridge, no iptables).
# shellcheck disable=SC2086  # OPTS: several options
podman build $OPTS --network host --build-arg BASE="$RLC_BASE_IMAGE" \
    --build-arg DEBIAN_MIRROR="$MIRROR" --build-arg SECURITY_MIRROR="$SECURITY_MIRROR" \
    --build-arg EXTRA_PACKAGES="${RLC_EXTRA_PACKAGES:-}" \
    -t "$RLC_IMAGE" -f "$RLC_HERE/Containerfile" "$RLC_HERE" > "$CACHE/build.log" 2>&1 || {
    tail -n 25 "$CACHE/build.log" >&2
    rlc_die "podman build failed (full log: $CACHE/build.log)"
}
rlc_log "build took $(since "$t") s"
# The images these tags named before, now untagged: removed unless a container still uses them.
for old in "$OLD_HOST" "$OLD_BASE"; do
    if [ -n "$old" ] && [ "$old" != "$(image_id "$RLC_IMAGE")" ] \
            && [ "$old" != "$(image_id "$RLC_BASE_IMAGE")" ]; then
        if podman rmi "$old" >/dev/null 2>&1; then
            rlc_log "removed the previous image $(echo "$old" | cut -c1-12)"
        fi
    fi
done
podman image inspect --format "{{.Id}}" "$RLC_IMAGE" | cut -c1-12 \
    | sed "s,^,$(basename "$0"): $RLC_IMAGE is ready: ," >&2
