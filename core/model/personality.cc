// The personality table. Sources: docs/semantics.md (section letter) and docs/vmlab.md
// (observed on rxe, kernel 6.1). "(model)" marks a choice the sources do not settle. The
// provider facts (err_post, raises, ...) are the rows of the drivers each personality
// predicts (rdmalab/driver_facts.h), with their sources there.
#include "model/personality.h"

#include <algorithm>
#include <cerrno>
#include <map>

#include "rdmalab/driver_facts.h"
#include "rdmalab/error.h"
#include "rdmalab/model.h"

namespace rdmalab::model {
namespace {

DeviceCaps base_caps(const std::string& name, Transport t) {
  DeviceCaps c;
  c.personality = name;
  c.transport = t;
  c.max_qp = 4096;  // (model) limits large enough for scenarios, small enough to test
  c.max_qp_wr = 4096;
  c.max_sge = 4;
  c.max_cq = 4096;
  c.max_cqe = 65536;
  c.max_srq = 1024;
  c.max_srq_wr = 4096;
  c.max_mr = 4096;
  c.phys_port_cnt = 1;
  // The kernel every personality runs under: Debian's amd64 config (CONFIG_HZ_250), the kernel
  // of the VM lab; its CM timers round on the timer wheel (rdmalab/kernel_timer.h).
  c.kernel_hz = 250;
  // include/net/tcp.h TCP_SYN_RETRIES 6, tcp_ipv4.c sysctl_tcp_syn_retries (6.1 and 7.2).
  c.tcp_syn_retries = 6;
  return c;
}

// A personality's caps: the base, then the provider facts of the driver it predicts, none of
// a real device's (apply_device_facts): its QPs always report their state (ibv_query_qp), as
// siw does since 6.8; rts_needs_cm and refused_send_resend_races stay false (types.h).
DeviceCaps driver_caps(const std::string& name, Transport t, const std::string& driver) {
  DeviceCaps c = base_caps(name, t);
  apply_driver_facts(driver_facts(driver), c);
  return c;
}

Personality roce() {
  Personality p;
  p.caps = driver_caps("roce", Transport::RoCE, "rxe");
  p.caps.xrc = false;                        // vmlab.md: no XRC bit, ibv_open_xrcd -> EOPNOTSUPP
  p.first_qpn = 17;                          // vmlab.md (the row's qpn_policy: increment)
  p.max_qpn = 0x1ffff;                       // (model) wrap point of the cyclic range
  p.cq_overflow = CqOverflow::kLoseEach;     // vmlab.md: CQ_ERR per lost completion, QP stays RTS
  p.cq_rounding = CqRounding::kPow2PlusOne;  // rxe_queue.c rxe_queue_init, rxe_cq_from_init
  p.send_port_down_loc_qp_op_err = true;     // vmlab.md: send while down -> LOC_QP_OP_ERR, QP ERR
  p.guid_base = 0x5054001234560000ull;       // (model) rxe derives the GUID from the MAC
  p.caps.local_ca_ack_delay = 15;            // rxe_param.h RXE_LOCAL_CA_ACK_DELAY
  return p;
}

Personality ib(XrcTgtLifetime rule, const std::string& name) {
  Personality p;
  p.caps = driver_caps(name, Transport::IB, "mlx5");
  p.caps.xrc = true;                      // semantics.md D: mlx4, mlx5 support XRC
  p.caps.xrc_tgt_lifetime = rule;         // semantics.md D: kHandle today, kXrcd in 2007/2011
  p.first_qpn = 0x100;                    // (the row's qpn_policy: increment)
  p.cq_overflow = CqOverflow::kErrorQps;  // (model) mlx5: CQ overflow is a CQ error, QPs to ERR
  // mlx5_ib_create_cq: entries = roundup_pow_of_two(n + 1), ibcq.cqe = entries - 1 (libmlx5
  // asks for align_queue_size(n + 1) - 1: the same); the ring holds entries (Q11, inference).
  p.cq_rounding = CqRounding::kPow2PlusOneRing;
  p.guid_base = 0x0002c90300000000ull;  // (model) a Mellanox OUI
  return p;
}

Personality iwarp_cxgb4() {
  Personality p;
  p.caps = driver_caps("iwarp-cxgb4", Transport::iWARP, "cxgb4");
  p.caps.xrc = false;        // semantics.md D: no XRC on cxgb4
  p.caps.ud = false;         // iWARP is connected only
  p.qp_error_aborts = true;  // qp.c c4iw_modify_qp RTS -> ERROR: abort = 1, c4iw_ep_disconnect
  // cm.c:111 ep_timeout_secs = 60 (module parameter) and start_ep_timer: jiffies +
  // ep_timeout_secs * HZ, in 6.1.192 and 7.2.13. Active: send_mpa_req starts it (MPA_REQ_SENT);
  // passive: pass_establish starts it (MPA_REQ_WAIT). The model has no cxgb4 TCP handshake,
  // so only the active one runs.
  p.iw_mpa_reply_timeout_ms = 60000;
  p.iw_mpa_request_timeout_ms = 60000;
  p.caps.qpn_policy = QpnPolicy::kIncrement;  // (model) cxgb4 qids; the row says nothing
  p.first_qpn = 1024;
  p.cq_overflow = CqOverflow::kErrorQps;  // (model)
  p.iwarp_closing = true;                 // seed 000: SQD == CLOSING, cxgb4 rules
  // cq.c c4iw_create_cq: ibcq.cqe = roundup(n + 2, 16) - 2 on an IQ of about twice that.
  p.cq_rounding = CqRounding::kCxgb4;
  // cm.c process_mpa_reply: MPA_REJECT -> err = -ECONNREFUSED -> connect_reply_upcall(ep, err).
  p.mpa_reject_status = -ECONNREFUSED;
  p.guid_base = 0x0007430000000000ull;  // (model) a Chelsio OUI
  return p;
}

Personality iwarp_siw() {
  Personality p;
  p.caps = driver_caps("iwarp-siw", Transport::iWARP, "siw");
  p.caps.xrc = false;  // semantics.md D: no XRC on siw
  p.caps.ud = false;
  // siw_cm.h MPAREQ_TIMEOUT (HZ * 10) and MPAREP_TIMEOUT (HZ * 5), the same in 6.1.192 and
  // 7.2.13; siw_cm.c siw_cm_queue_work(SIW_CM_WORK_MPATIMEOUT) queues the delayed work with
  // MPAREQ_TIMEOUT in SIW_EPSTATE_AWAIT_MPAREP (siw_connect, after its MPA request) and
  // MPAREP_TIMEOUT otherwise (siw_accept_newconn, SIW_EPSTATE_AWAIT_MPAREQ): the names are the
  // message sent, not the one awaited. siw_cm_work_handler MPATIMEOUT: AWAIT_MPAREP ->
  // CONNECT_REPLY -ETIMEDOUT; AWAIT_MPAREQ -> the socket released; other states: nothing.
  p.iw_mpa_reply_timeout_ms = 10000;
  p.iw_mpa_request_timeout_ms = 5000;
  p.caps.qpn_policy = QpnPolicy::kIncrement;  // (model) siw: xa_alloc's lowest free (the row)
  p.first_qpn = 1;
  p.cq_overflow = CqOverflow::kLoseEach;  // semantics.md E: CQ_ERR when CQ full
  p.cq_rounding = CqRounding::kPow2;      // siw_verbs.c siw_create_cq: roundup_pow_of_two(n)
  // siw_cm.c siw_proc_mpareply: MPA_RR_FLAG_REJECT -> CONNECT_REPLY with -ECONNRESET.
  p.mpa_reject_status = -ECONNRESET;
  // siw_cm.c: every IW_CM_EVENT_CLOSE upcall carries 0, an abort's too (siw_qp_cm_drop in
  // RDMA_MODE; SIW_CM_WORK_PEER_CLOSE: DISCONNECT then CLOSE, both 0), and cma_iw_handler
  // passes the status through: DISCONNECTED status 0 (cxgb4's peer_abort: -ECONNRESET).
  p.abort_close_status = 0;
  p.iwarp_closing = true;               // seed 000, semantics.md F
  p.closing_flushes_rq = true;          // siw_qp_nextstate_from_rts, CLOSING: siw_rq_flush
  p.guid_base = 0x0250560000000000ull;  // (model)
  return p;
}

Personality mana() {
  Personality p;
  p.caps = driver_caps("mana", Transport::RoCE, "mana");
  p.caps.xrc = false;  // semantics.md D: XRC only on mlx4/mlx5/hns/qedr
  p.caps.srq = false;  // (model) mana_ib has no SRQ: create_srq EOPNOTSUPP
  // The row's is 7.2's; 6.1.192 mana has no .disassociate_ucontext, and the model is 6.1 (Q3).
  p.caps.disassociates = false;
  p.first_qpn = 0x40;                     // (model) (the row's qpn_policy: lifo)
  p.cq_overflow = CqOverflow::kErrorQps;  // (model)
  p.cq_rounding = CqRounding::kExact;     // (model) mana_ib_create_cq never sets ibcq->cqe (Q11)
  p.guid_base = 0x00155d0000000000ull;    // (model) a Microsoft OUI
  return p;
}

const std::map<std::string, Personality>& table() {
  static const std::map<std::string, Personality> t = {
      {"roce", roce()},
      {"ib", ib(XrcTgtLifetime::kHandle, "ib")},
      {"ib-legacy", ib(XrcTgtLifetime::kXrcd, "ib-legacy")},
      {"iwarp-cxgb4", iwarp_cxgb4()},
      {"iwarp-siw", iwarp_siw()},
      {"mana", mana()},
  };
  return t;
}

}  // namespace

CqSize cq_size(const Personality& p, int n) {
  const auto pow2 = [](int v) {
    int r = 1;
    while (r < v) r <<= 1;
    return r;
  };
  switch (p.cq_rounding) {
    case CqRounding::kExact:
      return {n, n};
    case CqRounding::kPow2PlusOne:
      return {pow2(n + 1) - 1, pow2(n + 1) - 1};  // rxe_queue.h queue_full keeps a slot empty
    case CqRounding::kPow2PlusOneRing:
      return {pow2(n + 1) - 1, pow2(n + 1)};
    case CqRounding::kPow2:
      return {pow2(n), pow2(n)};  // a slot is free while its VALID flag is clear
    case CqRounding::kCxgb4: {
      const int entries = (n + 2 + 15) / 16 * 16;
      // hwentries = max(64, 2 * entries) (t4_max_iq_size: (model) no cap), less the status
      // page and the slot that tells full from empty (Q11, inference).
      const int hwentries = std::max(64, 2 * entries);
      return {entries - 2, hwentries - 2};
    }
  }
  return {n, n};
}

const std::vector<std::string>& personality_names() {
  static const std::vector<std::string> names = {"roce",        "ib",        "ib-legacy",
                                                 "iwarp-cxgb4", "iwarp-siw", "mana"};
  return names;
}

const Personality& personality(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end()) throw Error("make_lab", EINVAL, "unknown personality '" + name + "'");
  return it->second;
}

std::vector<std::string> personalities() {
  return personality_names();
}

}  // namespace rdmalab::model
