#!/bin/sh
# vmlab guest /init (busybox sh, PID 1). Settings come from the kernel command line:
#   vmlab.name vmlab.ip (data, CIDR) vmlab.dmac vmlab.cmac (NIC MACs) vmlab.rdma (rxe|siw|none)
#   vmlab.port (agent port on the control NIC) vmlab.agent (agent.py path in the host tree)
#   vmlab.sshkeys (folder in the host tree with the sshd host key and authorized_keys, or none)
#   vmlab.hide (host paths, comma-separated, the guest must not see: an empty tmpfs over each;
#   or none), vmlab.sysctl (NAME=VALUE,... set before the RDMA device comes up, or none),
#   vmlab.keep (paths, comma-separated, the guest keeps across its reboots: a folder of its
#   own in the share, /vmlab/keep/PATH, mounted over each; or none).
#   vmlab.moddir (host folder holding the guest kernel's modules and depmod's indexes,
#   bind-mounted at /lib/modules/<release> for modprobe; or none).
#   The agent and the ssh keys are copied into the guest's /run/vmlab first.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

log() { echo "vmlab-init: [$(cut -d' ' -f1 /proc/uptime)] $*" > /dev/console; }
die() {
  echo "VMLAB-FAIL $*" > /dev/console
  echo o > /proc/sysrq-trigger
  sleep 30
}
arg() {
  for w in $(cat /proc/cmdline); do
    case "$w" in "vmlab.$1="*) echo "${w#*=}" ;; esac
  done
}
ifname() {  # interface whose MAC is $1
  for d in /sys/class/net/*; do
    [ "$(cat "$d/address")" = "$1" ] && basename "$d"
  done
}

NAME=$(arg name); IP=$(arg ip); DMAC=$(arg dmac); CMAC=$(arg cmac)
RDMA=$(arg rdma); PORT=$(arg port); AGENT=$(arg agent); SSHKEYS=$(arg sshkeys)
HIDE=$(arg hide); SYSCTL=$(arg sysctl); KEEP=$(arg keep); MODDIR=$(arg moddir)

# Modules in dependency order (computed on the host with modinfo); siw only when asked,
# since it taints the kernel.
while read -r m; do
  [ "$m" = siw ] && [ "$RDMA" != siw ] && continue
  insmod "/modules/$m.ko" || die "insmod $m"
done < /modules/order
log "modules loaded"

# Host root read-only over 9p, a tmpfs overlay on top, the read-write share at /vmlab.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /host || die "9p hostroot"
mount -t tmpfs -o size=256m tmpfs /ovl || die "tmpfs"
mkdir -p /ovl/upper /ovl/work
mount -t overlay -o lowerdir=/host,upperdir=/ovl/upper,workdir=/ovl/work overlay /newroot \
  || die "overlay"
R=/newroot
mkdir -p $R/vmlab
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 vmlab $R/vmlab || die "9p vmlab"
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
# /tmp stays the overlay's (host content visible, writes in the tmpfs upper): a checkout under
# the host's /tmp (CI, fresh-clone tests) must be visible at the same path in the guest.
mount -t tmpfs tmpfs $R/run
echo "$NAME" > /proc/sys/kernel/hostname
# modprobe as on a real host: the host's kmod finds the guest kernel's modules (mounted before
# any hide, which may cover where they live). The kernel's own requests (request_module: a
# transport, a netdev kind) run /proc/sys/kernel/modprobe in PID 1's root, this initramfs:
# handed to the same modprobe in the new root.
if [ "$MODDIR" != none ]; then
  M=$R/lib/modules/$(uname -r)
  mkdir -p "$M" && mount -o bind "$R$MODDIR" "$M" || die "modules $MODDIR"
  printf '#!/bin/sh\nexec /bin/chroot %s /sbin/modprobe "$@"\n' "$R" > /bin/vmlab-modprobe
  chmod 755 /bin/vmlab-modprobe && echo /bin/vmlab-modprobe > /proc/sys/kernel/modprobe
fi
# The host's ~/.bashrc (pyenv and the like) would run for every ssh command; the guest gets
# its own, in the tmpfs overlay (the host's file is untouched).
echo "# vmlab guest" > $R/root/.bashrc

# NICs named by MAC, whatever order they probed in: eth0 data, eth1 control.
D=$(ifname "$DMAC"); C=$(ifname "$CMAC")
[ -n "$D" ] && [ -n "$C" ] || die "NICs not found (data $DMAC '$D', control $CMAC '$C')"
ip link set "$D" name vmdata && ip link set "$C" name vmctl || die "rename"
ip link set vmdata name eth0 && ip link set vmctl name eth1 || die "rename"
ip link set lo up
ip addr add "$IP" dev eth0 && ip link set eth0 up || die "eth0"
ip addr add 10.0.2.15/24 dev eth1 && ip link set eth1 up || die "eth1"
log "network up"

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
if [ -n "$SYSCTL" ] && [ "$SYSCTL" != none ]; then  # NAME=VALUE,... (vm.py checked the form)
  for kv in $(echo "$SYSCTL" | tr , ' '); do
    k=${kv%%=*}; v=${kv#*=}
    echo "$v" > "/proc/sys/$(echo "$k" | tr . /)" || die "sysctl $kv"
  done
  log "sysctl $SYSCTL"
fi
case "$RDMA" in
  rxe|siw) chroot $R rdma link add "${RDMA}0" type "$RDMA" netdev eth0 || die "rdma link add" ;;
  none) ;;
  *) die "unknown vmlab.rdma '$RDMA'" ;;
esac
log "rdma $RDMA up"

# The agent and sshd's keys are read from the guest's own tmpfs, so that they still work where
# the host paths they came from are hidden below.
V=$R/run/vmlab
mkdir -p $V && chmod 700 $V
cp "$R$AGENT" $V/agent.py || die "copy agent $AGENT"
if [ "$SSHKEYS" != none ]; then
  for f in ssh_host_ed25519_key authorized_keys; do
    cp "$R$SSHKEYS/$f" $V/$f && chmod 600 $V/$f || die "copy $SSHKEYS/$f"
  done
fi
if [ "$HIDE" != none ]; then
  for p in $(echo "$HIDE" | tr , ' '); do
    mkdir -p "$R$p" && mount -t tmpfs -o mode=755 tmpfs "$R$p" || die "hide $p"
  done
  # The overlay keeps its lower layer; detached here, /host is not reachable from the new
  # root either (e.g. through /proc/1/root/host).
  umount -l /host || die "detach /host"
  log "hidden: $HIDE"
fi
# A real machine's /var/tmp outlives its reboot (FHS); the tmpfs upper does not.
if [ -n "$KEEP" ] && [ "$KEEP" != none ]; then
  for p in $(echo "$KEEP" | tr , ' '); do
    mkdir -p "$R/vmlab/keep$p" "$R$p" && mount -o bind "$R/vmlab/keep$p" "$R$p" || die "keep $p"
  done
  log "kept across reboots: $KEEP"
fi

# sshd from the host's openssh-server, keys made on the host (bindings/rdmalab/machines/vmlab/ssh.py), no config file.
# StrictModes off: the key copies sit under /run, a mode-1777 tmpfs, which fails sshd's path
# check, and this throwaway guest has no other users to protect them from.
if [ "$SSHKEYS" != none ]; then
  mkdir -p $R/run/sshd
  chroot $R /usr/sbin/sshd -D -e -f /dev/null -o ListenAddress=10.0.2.15 -o Port=22 \
    -o HostKey=/run/vmlab/ssh_host_ed25519_key -o AuthorizedKeysFile=/run/vmlab/authorized_keys \
    -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no \
    -o KbdInteractiveAuthentication=no -o UsePAM=no -o PidFile=/run/sshd.pid \
    -o StrictModes=no \
    > /dev/console 2>&1 &
fi

# The agent prints VMLAB-READY once it listens; it powers the VM off on request.
chroot $R /usr/bin/python3 -u -S -E /run/vmlab/agent.py --port "$PORT" > /dev/console 2>&1 &
wait $!
die "agent exited"
