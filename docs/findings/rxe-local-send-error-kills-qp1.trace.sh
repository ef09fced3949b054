#!/bin/bash
# docs/findings/rxe-local-send-error-kills-qp1.md, "The second trigger". One rxe guest: a CM message sent while the link is down, then is QP1 still able to receive?
set -u
DEV=rxe0; ETH=eth0; T=/sys/kernel/tracing; H=/sys/class/infiniband/$DEV/ports/1/hw_counters
IP=$(ip -4 -o addr show dev $ETH | awk '{print $4}' | cut -d/ -f1)
mount -t tracefs nodev $T 2>/dev/null
echo 'r:rxe_prep rdma_rxe:rxe_prepare ret=$retval:s32' >> $T/kprobe_events
echo 'p:rxe_qperr rdma_rxe:rxe_qp_error' >> $T/kprobe_events
echo 'p:modqp ib_core:ib_modify_qp st=+0(%si):u32 cur=+4(%si):u32 mask=%dx:x32' >> $T/kprobe_events
echo 'ret < 0' > $T/events/kprobes/rxe_prep/filter
echo 1 > $T/events/kprobes/enable
snap(){ echo "== $1: $(for c in sent_pkts rcvd_pkts send_err; do printf '%s=%s ' $c $(cat $H/$c 2>/dev/null); done)"
        rdma res show qp lqpn 1; }
snap "before"
rping -s -a $IP -p 7999 >/dev/null 2>&1 &
sleep 1
rping -c -a $IP -p 7999 -C 100000 -S 64 >/dev/null 2>&1 &
CL=$!
sleep 3
snap "connected"
ip link set dev $ETH down
kill -9 $CL            # the client's cm_id destroyed: its DREQ, a QP1 send with the link down
sleep 2
ip link set dev $ETH up
sleep 3
snap "link up again"
pkill -9 rping; sleep 1
rping -s -a $IP -p 7998 >/dev/null 2>&1 &
sleep 1
if timeout 30 rping -c -a $IP -p 7998 -C 3 -v >/tmp/rping2.out 2>&1; then echo "RESULT: a new connection works"
else echo "RESULT: a new connection FAILED (rc $?): $(tail -2 /tmp/rping2.out | tr '\n' ' ')"; fi
snap "after the new connect"
echo "== trace"; grep -v '^#' $T/trace | head -20
echo "== dmesg"; dmesg | grep -i -E 'rxe|mad|reach|qp#' | tail -15
