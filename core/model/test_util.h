// Test helpers for the model's GoogleTests: a lab of named hosts, one process and context per
// host, and RC/UD/XRC QPs brought up the way a scenario does it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "rdmalab/error.h"
#include "rdmalab/model.h"

namespace rdmalab::model::testing {

inline std::shared_ptr<ModelLab> lab_of(
    const std::vector<std::pair<std::string, std::string>>& hosts, uint64_t seed = 1) {
  LabOptions o;
  o.seed = seed;
  for (const auto& [name, pers] : hosts) o.hosts.push_back(HostSpec{name, pers, std::nullopt});
  return make_lab(o);
}

// One process with a context, PD, CQ and a 4 KiB MR on a host.
struct Node {
  std::shared_ptr<Process> proc;
  std::shared_ptr<Context> ctx;
  std::shared_ptr<Pd> pd;
  std::shared_ptr<Cq> cq;
  std::shared_ptr<Mr> mr;

  static Node on(ModelLab& lab, const std::string& host, const std::string& proc_name = "p",
                 int cqe = 64) {
    Node n;
    n.proc = lab.host(host)->create_process(proc_name + "@" + host);
    n.ctx = n.proc->open_device("");
    n.pd = n.ctx->alloc_pd();
    n.cq = n.ctx->create_cq(cqe);
    n.mr =
        n.ctx->reg_mr(*n.pd, 4096, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ);
    return n;
  }

  std::shared_ptr<Qp> qp(QpType type = QpType::RC, std::shared_ptr<Srq> srq = nullptr,
                         QpCap cap = {}, bool sig_all = false) const {
    QpInitAttr a;
    a.qp_type = type;
    a.pd = pd;
    a.send_cq = cq;
    a.recv_cq = cq;
    a.srq = std::move(srq);
    a.cap = cap;
    a.sq_sig_all = sig_all;
    return ctx->create_qp(a);
  }
};

struct RcParams {
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 12;
  uint32_t access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
};

inline void to_init(Qp& qp, uint32_t access) {
  QpAttr a;
  a.qp_state = QpState::INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = access;
  qp.modify(a, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
}

inline void to_rtr(Qp& qp, const Gid& dgid, uint32_t dest_qpn, const RcParams& p,
                   bool xrc_send = false) {
  QpAttr a;
  a.qp_state = QpState::RTR;
  a.ah_attr.dgid = dgid;
  a.path_mtu = 1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = p.min_rnr_timer;
  uint32_t mask = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN;
  if (!xrc_send) mask |= QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
  qp.modify(a, mask);
}

inline void to_rts(Qp& qp, const RcParams& p, bool xrc_tgt = false) {
  QpAttr a;
  a.qp_state = QpState::RTS;
  a.timeout = p.timeout;
  a.retry_cnt = p.retry_cnt;
  a.rnr_retry = p.rnr_retry;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  qp.modify(a, xrc_tgt ? (QP_STATE | QP_TIMEOUT | QP_SQ_PSN)
                       : (QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN |
                          QP_MAX_QP_RD_ATOMIC));
}

// RESET -> INIT -> RTR -> RTS on both sides, each pointing at the other.
inline void connect(Qp& a, const Context& actx, Qp& b, const Context& bctx,
                    const RcParams& p = {}) {
  to_init(a, p.access);
  to_init(b, p.access);
  to_rtr(a, bctx.query_gid(1, 0), b.qp_num(), p);
  to_rtr(b, actx.query_gid(1, 0), a.qp_num(), p);
  to_rts(a, p);
  to_rts(b, p);
}

inline void modify_state(Qp& qp, QpState s, uint32_t extra_mask = 0, QpAttr a = {}) {
  a.qp_state = s;
  qp.modify(a, QP_STATE | extra_mask);
}

inline SendWr send_wr(uint64_t id, const Mr& mr, uint32_t len = 16, uint64_t off = 0,
                      bool signaled = true) {
  SendWr wr;
  wr.wr_id = id;
  wr.opcode = WrOpcode::SEND;
  wr.signaled = signaled;
  wr.sg_list = {Sge{mr.addr() + off, len, mr.lkey()}};
  return wr;
}

inline RecvWr recv_wr(uint64_t id, const Mr& mr, uint32_t len = 256, uint64_t off = 0) {
  RecvWr wr;
  wr.wr_id = id;
  wr.sg_list = {Sge{mr.addr() + off, len, mr.lkey()}};
  return wr;
}

// Polls cq until n completions arrived or the virtual deadline passed.
inline std::vector<WorkCompletion> wait_wcs(ModelLab& lab, Cq& cq, size_t n,
                                            TimeNs within = kNsPerSec) {
  std::vector<WorkCompletion> got;
  const TimeNs deadline = lab.runtime().now_ns() + within;
  lab.runtime().wait_until(
      [&] {
        for (auto& wc : cq.poll(64)) got.push_back(wc);
        return got.size() >= n;
      },
      deadline);
  return got;
}

inline std::vector<AsyncEvent> read_events(ModelLab& lab, Context& ctx, TimeNs within = kNsPerMs,
                                           bool ack = true) {
  std::vector<AsyncEvent> out;
  const TimeNs deadline = lab.runtime().now_ns() + within;
  while (auto ev = ctx.get_async_event(deadline)) {
    out.push_back(*ev);
    if (ack) ctx.ack_async_event(*ev);
  }
  return out;
}

inline std::vector<AsyncEventType> types_of(const std::vector<AsyncEvent>& evs) {
  std::vector<AsyncEventType> t;
  for (const auto& e : evs) t.push_back(e.type);
  return t;
}

inline std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

// The errno of what fn throws, or 0.
template <class F>
int err_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.err();
  }
  return 0;
}

inline size_t count_kind(ModelLab& lab, const std::string& kind) {
  size_t n = 0;
  for (const auto& r : lab.history().snapshot()) n += r.kind == kind;
  return n;
}

}  // namespace rdmalab::model::testing
