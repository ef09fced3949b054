# Sourced by build.sh and hosts.sh: what podman needs on this machine. POSIX sh.
#
# Two things in Debian 12's podman 4.3.1 (crun 1.8.1) fail on some hosts, both found on a
# Firecracker VM with cgroup v1 and no CAP_SYS_RESOURCE (see README.md):
#   * crun refuses a cgroup v1 "hybrid" host whose cgroup2 hierarchy still holds a controller:
#       crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2
#     runc (Debian's runc package) runs there: rlc_runtime picks it.
#   * rootful podman asks for RLIMIT_NOFILE and RLIMIT_NPROC of 1048576 in every container;
#     without CAP_SYS_RESOURCE raising a hard limit fails:
#       crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied
#     rlc_ulimits then asks for what the caller already has instead. podman runs its own
#     process with RLIMIT_NPROC = kernel.pid_max, so nproc is capped there too.

RLC_HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC2034  # used by the scripts that source this
RLC_REPO=$(cd "$RLC_HERE/../../../.." && pwd)
RLC_BASE_IMAGE=${RLC_BASE_IMAGE:-localhost/rdmalab-base:bookworm}
RLC_IMAGE=${RLC_IMAGE:-localhost/rdmalab-host:bookworm}

rlc_die() {
    echo "$(basename "$0"): error: $*" >&2
    exit 1
}

rlc_log() {
    echo "$(basename "$0"): $*" >&2
}

rlc_need_root() {
    [ "$(id -u)" = 0 ] || rlc_die "run as root (rootful podman, network namespaces, bridges)"
}

rlc_need() {  # rlc_need COMMAND DEBIAN-PACKAGE
    command -v "$1" >/dev/null 2>&1 \
        || rlc_die "$1 not found: apt-get install --no-install-recommends $2"
}

# Has this process CAP_SYS_RESOURCE (bit 24 of CapEff)?
rlc_has_sys_resource() {
    eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
    [ -n "$eff" ] && [ $(( 0x$eff >> 24 & 1 )) = 1 ]
}

# The OCI runtime to pass with --runtime, or nothing for podman's default. RLC_RUNTIME wins.
rlc_runtime() {
    if [ -n "${RLC_RUNTIME:-}" ]; then
        echo "$RLC_RUNTIME"
        return
    fi
    ctl=$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null || true)
    if [ -n "$ctl" ]; then  # cgroup v1 with a cgroup2 hierarchy holding controllers
        command -v runc >/dev/null 2>&1 || rlc_die "this host mixes cgroup v1 and v2" \
            "(/sys/fs/cgroup/unified has the controllers: $ctl), which crun refuses" \
            "('cgroups in hybrid mode not supported'): apt-get install --no-install-recommends runc"
        echo runc
    fi
}

# --ulimit options every container (and every build step) needs here; RLC_ULIMITS wins.
rlc_ulimits() {
    if [ -n "${RLC_ULIMITS+x}" ]; then
        echo "$RLC_ULIMITS"
        return
    fi
    rlc_has_sys_resource && return 0
    # The hard limits this process has ("Max open files  SOFT  HARD  files").
    nofile=$(awk '/^Max open files/ {print $5}' /proc/self/limits)
    [ "$nofile" = unlimited ] && nofile=$(cat /proc/sys/fs/nr_open)
    nproc=$(awk '/^Max processes/ {print $4}' /proc/self/limits)
    pidmax=$(cat /proc/sys/kernel/pid_max)
    if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pidmax" ]; then
        nproc=$pidmax
    fi
    echo "--ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc"
}

# The options podman run / podman build need on this machine (runtime, ulimits).
rlc_podman_opts() {
    rt=$(rlc_runtime) || exit 1
    echo "${rt:+--runtime $rt} $(rlc_ulimits)"
}

# The Debian mirror this machine's apt uses (deb822 "URIs:" or one-line "deb URL SUITE"),
# for suffix debian or debian-security; else deb.debian.org.
rlc_apt_uri() {  # rlc_apt_uri debian|debian-security
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
              /etc/apt/sources.list.d/*.sources 2>/dev/null \
          | sed -n -e 's/^URIs:[[:space:]]*//p' \
                   -e 's/^deb[[:space:]]\{1,\}\(\[[^]]*\][[:space:]]\{1,\}\)\{0,1\}\([^[:space:]]*\).*/\2/p' \
          | tr ' ' '\n' | grep -E "^(https?|file)://.*/$1/?\$" | head -n 1)
    echo "${uri:-http://deb.debian.org/$1}" | sed 's,/*$,,'
}
