// The driver facts table. Sources: docs/semantics.md (section letter, Q<n> for the questions of
// its issue 13 and 17 reads), docs/vmlab.md (observed on rxe and siw, kernel 6.1), the
// findings registry (bindings/rdmalab/findings.toml, kind provider-fact) and the kernel files
// named (Debian's 6.1.192 and sid's 7.2.13). "(model)" marks a reading no run has checked.
#include "rdmalab/driver_facts.h"

#include <algorithm>

namespace rdmalab {
namespace {

using Ev = AsyncEventType;

DriverFacts row(const char* driver, const char* personality) {
  DriverFacts d;
  d.driver = driver;
  d.personality = personality;
  return d;
}

DriverFacts rxe() {
  DriverFacts d = row("rxe", "roce");
  d.err_post = ErrPostPolicy::kFlush;  // semantics.md C: rxe flushes posts in ERR
  // vmlab.md: rxe_comp.c treats retry_cnt 7 as infinite (rxe-retry-cnt-7-is-infinite).
  d.retry_cnt_7_infinite = true;
  d.qpn_policy = QpnPolicy::kIncrement;  // vmlab.md: first QPN 17, then 18 (cyclic allocation)
  // A send the host's own stack refuses (ip_local_out fails): 6.1.192 rolls the WQE back and
  // resends under need_req_skb, which the change that removed it calls racy ("the skb may be
  // sent to the destructor before the requester can set the need_req_skb flag"); the REP went
  // out again in one run and never in another. "RDMA/rxe: Get rid of pkt resend on err" (Bob
  // Pearson, linux-rdma 2024-03-29) removed it; 6.12.117 is the first release measured
  // without it (docs/findings/rxe-local-send-error-kills-qp1.md), hence the bound.
  d.refused_send_races_before = {6, 12};
  // rxe sets no .disassociate_ucontext (6.1, 7.2): uverbs_main.c ib_uverbs_remove_one waits in
  // wait_for_completion until every user closes the device, and raises nothing (Q3).
  d.disassociates = false;
  // semantics.md E (rxe triggers), measured in the VM lab (vmlab.md): no QP_FATAL, COMM_EST or
  // LAST_WQE_REACHED.
  d.raises = {Ev::CQ_ERR, Ev::PORT_ERR, Ev::PORT_ACTIVE, Ev::SRQ_LIMIT_REACHED, Ev::SQ_DRAINED};
  d.raises_checked = true;
  return d;
}

DriverFacts siw() {
  DriverFacts d = row("siw", "iwarp-siw");
  // User QPs, which rdmalab drives: libsiw writes WRs into the mapped SQ with no system call,
  // so a WR posted in ERROR is never flushed (siw-user-posts-in-error-are-never-flushed;
  // kernel QPs would be kFlushAtOnce, siw_post_send).
  d.err_post = ErrPostPolicy::kStrand;
  // siw_verbs.c siw_query_qp sets no qp_state before v6.8 ("RDMA/siw: Set qp_state in
  // siw_query_qp"; siw-query-qp-reports-no-state).
  d.reports_qp_state_since = {6, 8};
  // qpn_policy unknown: siw_qp.c siw_qp_add takes xa_alloc's lowest free number, neither policy.
  d.disassociates = false;  // no .disassociate_ucontext in 6.1 or 7.2 (Q3)
  // siw_qp_tx.c siw_qp_sq_process: a signalled SEND/WRITE completes once its last FPDU is
  // accepted by the local TCP socket, not when acknowledged (Q4).
  d.send_completes_on_handoff = true;
  // siw_cm.c siw_connect: a blocking kernel_bindconnect in the caller's rdma_connect; a refused
  // or unanswered TCP connect fails the call (ECONNREFUSED / ETIMEDOUT), no event (Q6).
  d.connect_is_synchronous = true;
  // siw_cm.c siw_qp_cm_drop(qp, 0): IW_CM_EVENT_CLOSE(0) at once, the socket released (Q5).
  d.iw_close_timeout_s = 0;
  // semantics.md E (siw triggers); SRQ_LIMIT_REACHED: siw_qp_rx.c siw_rqe_get ->
  // siw_srq_event (an armed SRQ below its limit).
  d.raises = {Ev::QP_FATAL,    Ev::QP_REQ_ERR, Ev::SQ_DRAINED, Ev::CQ_ERR,
              Ev::PORT_ACTIVE, Ev::PORT_ERR,   Ev::LID_CHANGE, Ev::SRQ_LIMIT_REACHED};
  d.raises_checked = true;
  // The verbs backend's list has said DEVICE_FATAL since 2626d53; Q3 found that only uverbs
  // disassociation raises it, and siw has no .disassociate_ucontext.
  d.raises_unsettled = {Ev::DEVICE_FATAL};
  return d;
}

DriverFacts cxgb4() {
  DriverFacts d = row("cxgb4", "iwarp-cxgb4");
  d.err_post = ErrPostPolicy::kRefuse;  // semantics.md C: libcxgb4 returns EINVAL in ERR
  d.disassociates = false;              // no .disassociate_ucontext in 6.1 or 7.2 (Q3)
  // cm.c:111 ep_timeout_secs = 60: c4iw_ep_disconnect starts the ep timer; process_timeout in
  // CLOSING/MORIBUND: QP to ERROR, close_complete_upcall(ep, -ETIMEDOUT), then an abort (Q5).
  d.iw_close_timeout_s = 60;
  // (model) iw_cxgb4 posts QP_FATAL/QP_REQ_ERR/QP_ACCESS_ERR from its error CQEs, and port
  // events. SRQ_LIMIT_REACHED: qp.c c4iw_dispatch_srq_limit_reached_event (from c4iw_poll_cq's
  // simulated notification, cq.c, and the firmware's with T4_SRQ_LIMIT_SUPPORT). No
  // DEVICE_FATAL: only uverbs disassociation raises it (Q3).
  d.raises = {Ev::QP_FATAL,    Ev::QP_REQ_ERR, Ev::QP_ACCESS_ERR,    Ev::CQ_ERR,
              Ev::PORT_ACTIVE, Ev::PORT_ERR,   Ev::SRQ_LIMIT_REACHED};
  return d;
}

DriverFacts mlx5() {
  DriverFacts d = row("mlx5", "ib");
  d.err_post = ErrPostPolicy::kFlush;    // semantics.md G: IB posts in ERR complete as flush
  d.qpn_policy = QpnPolicy::kIncrement;  // semantics.md E: mlx5's incrementing QPNs
  // main.c:3715 (6.1) .disassociate_ucontext: ib_uverbs_remove_one ->
  // ib_uverbs_free_hw_resources, RDMA_REMOVE_DRIVER_REMOVE queues DEVICE_FATAL (Q3).
  d.disassociates = true;
  // semantics.md E: mlx5 dispatches every QP, CQ, SRQ and port event.
  d.raises = {Ev::CQ_ERR,
              Ev::QP_FATAL,
              Ev::QP_REQ_ERR,
              Ev::QP_ACCESS_ERR,
              Ev::COMM_EST,
              Ev::SQ_DRAINED,
              Ev::PATH_MIG,
              Ev::PATH_MIG_ERR,
              Ev::DEVICE_FATAL,
              Ev::PORT_ACTIVE,
              Ev::PORT_ERR,
              Ev::LID_CHANGE,
              Ev::PKEY_CHANGE,
              Ev::SM_CHANGE,
              Ev::SRQ_ERR,
              Ev::SRQ_LIMIT_REACHED,
              Ev::QP_LAST_WQE_REACHED,
              Ev::CLIENT_REREGISTER,
              Ev::GID_CHANGE};
  return d;
}

DriverFacts mlx4() {
  DriverFacts d = row("mlx4", "ib");   // semantics.md E: its event dispatch is mlx5's
  d.err_post = ErrPostPolicy::kFlush;  // semantics.md G: IB
  d.disassociates = true;              // .disassociate_ucontext in 6.1.192 (Q3)
  return d;
}

DriverFacts mana() {
  DriverFacts d = row("mana", "mana");
  d.err_post = ErrPostPolicy::kFlush;  // (model) a RoCE provider: semantics.md C's guess
  d.qpn_policy = QpnPolicy::kLifo;     // semantics.md E, seed 002: freed QPN to next create
  // 7.2 device.c:38 .disassociate_ucontext; 6.1.192 has none (Q3), nor the "mana" personality.
  d.disassociates = true;
  d.raises = {Ev::QP_FATAL};  // semantics.md E: mana_ib_event_handler, QP_FATAL only
  return d;
}

// Drivers whose one fact here is .disassociate_ucontext (Q3): in 6.1.192 (irdma, hns) or added
// by 7.2 (bnxt_re, erdma, ionic). No personality predicts them yet.
DriverFacts disassociating(const char* driver) {
  DriverFacts d = row(driver, "");
  d.disassociates = true;
  return d;
}

std::vector<DriverFacts> rows() {
  std::vector<DriverFacts> t = {rxe(), siw(), cxgb4(), mlx5(), mlx4(), mana()};
  for (const char* d : {"irdma", "bnxt_re", "hns", "erdma", "ionic"}) {
    t.push_back(disassociating(d));
  }
  return t;
}

}  // namespace

const std::vector<DriverFacts>& driver_facts() {
  static const std::vector<DriverFacts> table = rows();
  return table;
}

DriverFacts driver_facts(const std::string& driver) {
  const auto& t = driver_facts();
  auto it =
      std::find_if(t.begin(), t.end(), [&](const DriverFacts& d) { return d.driver == driver; });
  if (it != t.end()) return *it;
  DriverFacts unknown;
  unknown.driver = driver;
  return unknown;
}

std::optional<std::string> personality_of_driver(const std::string& driver) {
  const std::string p = driver_facts(driver).personality;
  if (p.empty()) return std::nullopt;
  return p;
}

ErrPostPolicy err_post_of(const DriverFacts& d, Transport t) {
  if (d.err_post) return *d.err_post;
  return t == Transport::iWARP ? ErrPostPolicy::kRefuse : ErrPostPolicy::kFlush;
}

void apply_driver_facts(const DriverFacts& d, DeviceCaps& caps) {
  caps.err_post = err_post_of(d, caps.transport);
  caps.retry_cnt_7_infinite = d.retry_cnt_7_infinite;
  caps.qpn_policy = d.qpn_policy;
  caps.disassociates = d.disassociates;
  caps.send_completes_on_handoff = d.send_completes_on_handoff;
  caps.connect_is_synchronous = d.connect_is_synchronous;
  caps.iw_close_timeout_s = d.iw_close_timeout_s;
  caps.raises = d.raises;
}

namespace {

// A release at or after bound; an unknown running kernel is before every bound.
bool reached(KernelRelease running, KernelRelease bound) {
  return running.known() && running >= bound;
}

}  // namespace

void apply_device_facts(const DriverFacts& d, KernelRelease running, DeviceCaps& caps) {
  caps.reports_qp_state =
      !d.reports_qp_state_since.known() || reached(running, d.reports_qp_state_since);
  caps.refused_send_resend_races =
      d.refused_send_races_before.known() && !reached(running, d.refused_send_races_before);
  caps.rts_needs_cm = caps.transport == Transport::iWARP;  // types.h: the iWARP CM's LLP handle
  caps.raises = device_raises(d);
}

std::vector<AsyncEventType> device_raises(const DriverFacts& d) {
  if (!d.raises_checked) return {};
  std::vector<AsyncEventType> r = d.raises;
  r.insert(r.end(), d.raises_unsettled.begin(), d.raises_unsettled.end());
  return r;
}

}  // namespace rdmalab
