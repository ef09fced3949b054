// The RC, UD and XRC wire protocol of the model (IBA chapter 9.7): one packet per message,
// PSNs, cumulative ACKs, go-back-N retransmission on the local ACK timeout bounded by
// retry_cnt, RNR NAK with min_rnr_timer bounded by rnr_retry, NAK sequence error, and the
// remote errors that put both QPs in ERR.
#include "model/transport.h"

#include <algorithm>
#include <array>

#include "model/cm_iw.h"
#include "model/device.h"
#include "model/qp.h"

namespace rdmalab::model {
namespace {

constexpr uint32_t kGrhBytes = 40;  // UD receive buffers start with room for the GRH

uint64_t sge_total(const std::vector<Sge>& sges) {
  uint64_t n = 0;
  for (const Sge& s : sges) n += s.length;
  return n;
}

bool any_in_flight(const std::deque<SendWqe>& queue) {
  return std::any_of(queue.begin(), queue.end(), [](const SendWqe& w) { return w.sent; });
}

}  // namespace

const char* request_opcode_name(WrOpcode op) {
  switch (op) {
    case WrOpcode::SEND:
      return "SEND_ONLY";
    case WrOpcode::SEND_WITH_IMM:
      return "SEND_ONLY_WITH_IMMEDIATE";
    case WrOpcode::RDMA_WRITE:
      return "RDMA_WRITE_ONLY";
    case WrOpcode::RDMA_WRITE_WITH_IMM:
      return "RDMA_WRITE_ONLY_WITH_IMMEDIATE";
    case WrOpcode::RDMA_READ:
      return "RDMA_READ_REQUEST";
  }
  return "SEND_ONLY";
}

TimeNs rnr_timer_ns(uint8_t code) {
  // IBA table 45, in units of 10 us: code 0 is 655.36 ms, 1 is 0.01 ms ... 31 is 491.52 ms.
  static constexpr std::array<uint32_t, 32> k10us = {
      65536, 1,    2,    3,    4,    6,     8,     12,    16,    24,   32,
      48,    64,   96,   128,  192,  256,   384,   512,   768,   1024, 1536,
      2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
  return static_cast<TimeNs>(k10us[code & 31]) * 10 * kNsPerUs;
}

namespace {

std::vector<uint8_t> gather(Device& dev, const std::vector<Sge>& sges) {
  std::vector<uint8_t> out;
  for (const Sge& s : sges) {
    if (s.length == 0) continue;
    ModelMr* mr = dev.find_mr(s.lkey);
    const uint8_t* p = mr->data() + s.addr;
    out.insert(out.end(), p, p + s.length);
  }
  return out;
}

void scatter(Device& dev, const std::vector<Sge>& sges, const std::vector<uint8_t>& bytes,
             uint64_t skip) {
  uint64_t src = 0;
  for (const Sge& s : sges) {
    if (src >= bytes.size()) return;
    uint64_t off = 0;
    if (skip >= s.length) {
      skip -= s.length;
      continue;
    }
    off = skip;
    skip = 0;
    const uint64_t n = std::min<uint64_t>(s.length - off, bytes.size() - src);
    ModelMr* mr = dev.find_mr(s.lkey);
    std::copy_n(bytes.begin() + static_cast<ptrdiff_t>(src), n, mr->data() + s.addr + off);
    src += n;
  }
}

}  // namespace

// ================================================================ requester

void QpCore::kick() {
  if (kick_pending_) return;
  kick_pending_ = true;
  env.runtime.schedule_after(0, [self = shared_from_this()] {
    self->kick_pending_ = false;
    if (!self->destroyed) self->process_sq();
  });
}

// Starts WQEs in posting order (RTS) and resends rewound ones (RTS, and SQD for WRs already
// started). A WQE with a local error fences the queue until it is the head.
void QpCore::process_sq() {
  if ((state != QpState::RTS && state != QpState::SQD) || rnr_waiting_ || dead_) return;
  const bool may_start = state == QpState::RTS;
  for (SendWqe& w : sq_) {
    if (w.sent) continue;
    if (w.local_error) break;
    if (!w.psn_assigned && !may_start) break;
    if (!dev.port_up && dev.pers.send_port_down_loc_qp_op_err) {
      w.local_error = WcStatus::LOC_QP_OP_ERR;  // rxe, vmlab.md: a send while the link is down
    } else {
      w.local_error = check_local_sges(w.wr.sg_list, w.wr.opcode == WrOpcode::RDMA_READ);
    }
    if (w.local_error) break;
    transmit(w);
  }
  advance_head();
  arm_retransmit();
}

void QpCore::transmit(SendWqe& w) {
  if (!w.psn_assigned) {
    w.psn = next_psn_;
    next_psn_ = psn_next(next_psn_);
    w.psn_assigned = true;
  }
  w.sent = true;
  Frame f;
  f.qp_type = type;
  f.op = w.wr.opcode;
  f.pkt.opcode = request_opcode_name(w.wr.opcode);
  f.pkt.src_qpn = qpn;
  f.pkt.dest_qpn = type == QpType::UD ? w.wr.remote_qpn : attr.dest_qp_num;
  f.pkt.psn = w.psn;
  if (w.wr.opcode == WrOpcode::RDMA_READ) {
    f.dma_len = static_cast<uint32_t>(sge_total(w.wr.sg_list));
    f.pkt.length = f.dma_len;
  } else {
    f.payload = gather(dev, w.wr.sg_list);
    f.pkt.length = static_cast<uint32_t>(f.payload.size());
  }
  f.remote_addr = w.wr.remote_addr;
  f.rkey = w.wr.rkey;
  f.has_imm =
      w.wr.opcode == WrOpcode::SEND_WITH_IMM || w.wr.opcode == WrOpcode::RDMA_WRITE_WITH_IMM;
  f.imm = w.wr.imm_data;
  f.srqn = w.wr.remote_srqn;
  // IBA 10.2.5: a Q_Key with the high bit set means "use the QP's own Q_Key".
  f.qkey = (w.wr.remote_qkey & 0x80000000u) ? attr.qkey : w.wr.remote_qkey;
  dev.send(std::move(f), type == QpType::UD ? *w.wr.ah : attr.ah_attr);
}

// Completes what is done at the head: UD sends once on the wire, and a local error once every
// WQE before it has completed.
void QpCore::advance_head() {
  while (!sq_.empty()) {
    SendWqe& h = sq_.front();
    if (h.local_error) return fail_head(*h.local_error, "local error");
    if (type != QpType::UD || !h.sent) break;
    SendWqe w = std::move(h);
    sq_.pop_front();
    complete_send(w, WcStatus::SUCCESS, static_cast<uint32_t>(sge_total(w.wr.sg_list)));
  }
  // siw_qp_tx.c siw_qp_sq_process (Q4): a SEND/WRITE completes once its last FPDU is accepted
  // by the local TCP socket; in order, up to the first WR not yet sent or a READ (which
  // completes with its response).
  if (dev.caps.send_completes_on_handoff && type != QpType::UD) {
    for (SendWqe& w : sq_) {
      if (!w.sent || w.local_error || w.wr.opcode == WrOpcode::RDMA_READ) break;
      if (w.reported) continue;
      complete_send(w, WcStatus::SUCCESS, static_cast<uint32_t>(sge_total(w.wr.sg_list)));
      w.reported = true;
    }
  }
  check_sq_drained();
}

void QpCore::fail_head(WcStatus status, const std::string& why) {
  if (sq_.empty()) return;
  SendWqe w = std::move(sq_.front());
  sq_.pop_front();
  complete_send(w, status);
  to_error(why + " (" + std::string(to_string(status)) + ")");
}

void QpCore::arm_retransmit(bool restart) {
  if (type == QpType::UD) return;
  if (!any_in_flight(sq_) || rnr_waiting_) {
    env.runtime.cancel(rto_timer_);
    rto_timer_ = 0;
    return;
  }
  if (rto_timer_ != 0 && !restart) return;
  env.runtime.cancel(rto_timer_);
  rto_timer_ = 0;
  const TimeNs t = ack_timeout_ns(attr.timeout);
  if (t == 0) return;  // timeout 0: wait forever
  rto_timer_ = env.runtime.schedule_after(t, [self = shared_from_this()] {
    self->rto_timer_ = 0;
    if (!self->destroyed) self->on_retransmit_timeout();
  });
}

// IBA 9.7.6.1.3 / rxe_comp.c: retry_cnt retries after the first try; 7 is infinite on rxe.
bool QpCore::consume_retry(const char* cause) {
  const bool infinite = attr.retry_cnt == 7 && dev.caps.retry_cnt_7_infinite;
  if (!infinite) {
    if (retry_left_ == 0) {
      fail_head(WcStatus::RETRY_EXC_ERR, std::string(cause) + ", retry_cnt exhausted");
      return false;
    }
    --retry_left_;
  }
  return true;
}

void QpCore::on_retransmit_timeout() {
  if ((state != QpState::RTS && state != QpState::SQD) || !any_in_flight(sq_)) return;
  if (!consume_retry("local ACK timeout")) return;
  const uint32_t psn = sq_.front().psn;
  env.record_fields(
      dev.host, label(), "retransmit",
      {{"qp_num", qpn}, {"psn", psn}, {"cause", "timeout"}, {"retry_left", retry_left_}});
  go_back(psn);
}

// Go-back-N: every WQE from psn on is sent again, with its PSN.
void QpCore::go_back(uint32_t psn) {
  for (SendWqe& w : sq_) {
    if (w.sent && psn_diff(w.psn, psn) >= 0) w.sent = false;
  }
  process_sq();
  arm_retransmit(true);
}

// Completes WQEs acknowledged by a response for psn (inclusive) or before it. A READ completes
// only with its response data.
bool QpCore::ack_through(uint32_t psn, bool inclusive) {
  bool progress = false;
  while (!sq_.empty()) {
    SendWqe& h = sq_.front();
    if (!h.sent || h.wr.opcode == WrOpcode::RDMA_READ) break;
    const int32_t d = psn_diff(h.psn, psn);
    if (d > 0 || (d == 0 && !inclusive)) break;
    SendWqe w = std::move(h);
    sq_.pop_front();
    complete_send(w, WcStatus::SUCCESS, static_cast<uint32_t>(sge_total(w.wr.sg_list)));
    progress = true;
  }
  if (progress) {
    retry_left_ = attr.retry_cnt;
    rnr_left_ = attr.rnr_retry;
  }
  return progress;
}

void QpCore::on_response(const Frame& f) {
  if (state != QpState::RTS && state != QpState::SQD) return;
  const uint32_t psn = f.pkt.psn;
  if (f.pkt.opcode == kReadResponseOpcode) {
    ack_through(psn, false);
    if (sq_.empty() || !sq_.front().sent || sq_.front().psn != psn) return;  // stale response
    SendWqe& h = sq_.front();
    if (auto err = check_local_sges(h.wr.sg_list, true)) return fail_head(*err, "READ response");
    scatter(dev, h.wr.sg_list, f.payload, 0);
    SendWqe w = std::move(h);
    sq_.pop_front();
    complete_send(w, WcStatus::SUCCESS, static_cast<uint32_t>(f.payload.size()));
    retry_left_ = attr.retry_cnt;
    rnr_left_ = attr.rnr_retry;
  } else if (f.pkt.syndrome == "ACK") {
    ack_through(psn, true);
  } else if (dev.caps.transport == Transport::iWARP && f.pkt.syndrome != "RNR_NAK" &&
             f.pkt.syndrome != "NAK_SEQ") {
    // A TERMINATE (siw_proc_terminate -> -ECONNRESET -> siw_qp_cm_drop(qp, 1), Q7c): the head
    // fails where it is the WR named, the QP goes to ERR and the connection is dropped.
    ack_through(psn, false);
    if (!sq_.empty() && sq_.front().sent && sq_.front().psn == psn) {
      const WcStatus st = f.pkt.syndrome == "NAK_REM_ACCESS" ? WcStatus::REM_ACCESS_ERR
                          : f.pkt.syndrome == "NAK_INV_REQ"  ? WcStatus::REM_INV_REQ_ERR
                                                             : WcStatus::REM_OP_ERR;
      fail_head(st, "TERMINATE received");
    }
    return terminate("TERMINATE received");
  } else {
    ack_through(psn, false);
    if (sq_.empty() || !sq_.front().sent || sq_.front().psn != psn) return;  // stale NAK
    if (f.pkt.syndrome == "RNR_NAK") return on_rnr_nak(f);
    if (f.pkt.syndrome == "NAK_SEQ") {
      if (!consume_retry("NAK sequence error")) return;
      env.record_fields(
          dev.host, label(), "retransmit",
          {{"qp_num", qpn}, {"psn", psn}, {"cause", "NAK_SEQ"}, {"retry_left", retry_left_}});
      return go_back(psn);
    }
    if (f.pkt.syndrome == "NAK_REM_ACCESS")
      return fail_head(WcStatus::REM_ACCESS_ERR, "remote access error");
    if (f.pkt.syndrome == "NAK_INV_REQ")
      return fail_head(WcStatus::REM_INV_REQ_ERR, "remote invalid request");
    return fail_head(WcStatus::REM_OP_ERR, "remote operational error");
  }
  advance_head();
  arm_retransmit(true);
  process_sq();
}

// RNR NAK: wait the responder's min_rnr_timer, then resend from the NAKed PSN; rnr_retry 7 is
// infinite (IBA 9.7.5.2.8).
void QpCore::on_rnr_nak(const Frame& f) {
  if (attr.rnr_retry != 7) {
    if (rnr_left_ == 0) return fail_head(WcStatus::RNR_RETRY_EXC_ERR, "rnr_retry exhausted");
    --rnr_left_;
  }
  for (SendWqe& w : sq_) {
    if (w.sent && psn_diff(w.psn, f.pkt.psn) >= 0) w.sent = false;
  }
  rnr_waiting_ = true;
  arm_retransmit(true);  // cancels: no ACK timeout while waiting out the RNR timer
  const TimeNs wait = rnr_timer_ns(f.rnr_timer);
  env.record_fields(dev.host, label(), "retransmit",
                    {{"qp_num", qpn},
                     {"psn", f.pkt.psn},
                     {"cause", "RNR_NAK"},
                     {"rnr_left", rnr_left_},
                     {"wait_ns", wait}});
  rnr_timer_ = env.runtime.schedule_after(wait, [self = shared_from_this()] {
    self->rnr_timer_ = 0;
    self->rnr_waiting_ = false;
    if (self->destroyed) return;
    self->process_sq();
    self->arm_retransmit(true);
  });
}

// ================================================================ responder

void QpCore::on_frame(const Frame& f) {
  if (destroyed) return;
  if (f.pkt.opcode == kAckOpcode || f.pkt.opcode == kReadResponseOpcode) {
    if (type == QpType::RC || type == QpType::XRC_SEND) on_response(f);
    return;
  }
  const bool type_ok = (f.qp_type == QpType::RC && type == QpType::RC) ||
                       (f.qp_type == QpType::UD && type == QpType::UD) ||
                       (f.qp_type == QpType::XRC_SEND && type == QpType::XRC_RECV);
  if (!type_ok) return;
  on_request(f);
}

void QpCore::on_request(const Frame& f) {
  if (state != QpState::RTR && state != QpState::RTS && state != QpState::SQD &&
      state != QpState::SQE)
    return;
  if (type == QpType::UD) return on_ud(f);
  if (state == QpState::RTR && !comm_est_raised_) {
    comm_est_raised_ = true;  // IBA 11.6.3: first packet received in RTR
    dev.raise(AsyncEventType::COMM_EST, qpn);
  }
  const int32_t d = psn_diff(f.pkt.psn, epsn_);
  if (d > 0) {  // a gap: one NAK per sequence error (IBA 9.7.5.2.2)
    if (!nak_seq_sent_) {
      nak_seq_sent_ = true;
      respond(f, "NAK_SEQ", epsn_);
    }
    return;
  }
  if (d < 0) {  // duplicate: ACK again; a READ is executed again
    if (f.op == WrOpcode::RDMA_READ) {
      execute(f);
    } else {
      respond(f, "ACK", f.pkt.psn);
    }
    return;
  }
  if (execute(f)) {
    epsn_ = psn_next(epsn_);
    nak_seq_sent_ = false;
  }
}

void QpCore::respond(const Frame& req, const std::string& syndrome, uint32_t psn,
                     std::vector<uint8_t> data) {
  Frame r;
  r.qp_type = type;
  r.pkt.opcode = syndrome == "READ_RESPONSE" ? kReadResponseOpcode : kAckOpcode;
  if (syndrome != "READ_RESPONSE") r.pkt.syndrome = syndrome;
  r.pkt.src_qpn = qpn;
  r.pkt.dest_qpn = attr.dest_qp_num;
  r.pkt.psn = psn;
  r.pkt.length = static_cast<uint32_t>(data.size());
  r.payload = std::move(data);
  r.rnr_timer = attr.min_rnr_timer;
  dev.send(std::move(r), attr.ah_attr);
}

// A responder error (IBA 9.7.5.2.3-5): NAK, the affiliated event where the device raises it,
// and the responder QP to ERR.
void QpCore::responder_error(const Frame& f, const std::string& syndrome, const std::string& why) {
  respond(f, syndrome, f.pkt.psn);
  if (syndrome == "NAK_REM_ACCESS") dev.raise(AsyncEventType::QP_ACCESS_ERR, qpn);
  if (syndrome == "NAK_INV_REQ") dev.raise(AsyncEventType::QP_REQ_ERR, qpn);
  to_error("responder: " + why);
  // iWARP: the NAK stands for a TERMINATE, after which the provider drops the connection
  // (siw_tcp_rx_data -> siw_qp_cm_drop(qp, 1), Q7c).
  if (dev.caps.transport == Transport::iWARP) terminate("responder: " + why);
}

void QpCore::terminate(const std::string& why) {
  to_error(why);
  if (dev.iw_cm) dev.iw_cm->terminated(this);
}

ModelSrq* QpCore::xrc_srq(uint32_t srqn) const {
  auto it = dev.srq_table.find(srqn);
  if (it == dev.srq_table.end()) return nullptr;
  ModelSrq* s = it->second;
  return s->owned_live() && s->xrcd() == xrcd.get() ? s : nullptr;
}

bool QpCore::check_rkey(const Frame& f, ModelPd* rpd, uint32_t access, uint64_t len,
                        ModelMr** out) const {
  ModelMr* mr = dev.find_mr(f.rkey);
  if ((attr.qp_access_flags & access) == 0 || mr == nullptr || !mr->owned_live() ||
      mr->pd() != rpd || (mr->access() & access) == 0 || !mr->in_bounds(f.remote_addr, len)) {
    return false;
  }
  *out = mr;
  return true;
}

// Executes an in-order request; false when it was not accepted (RNR or error).
bool QpCore::execute(const Frame& f) {
  ModelSrq* use_srq = srq;
  ModelCq* cq = recv_cq;
  ModelPd* rpd = pd;
  if (type == QpType::XRC_RECV) {  // the XRCETH picks the SRQ within this QP's XRCD
    use_srq = xrc_srq(f.srqn);
    if (use_srq == nullptr) {
      responder_error(f, "NAK_INV_REQ", "no XRC SRQ " + std::to_string(f.srqn) + " in the XRCD");
      return false;
    }
    cq = use_srq->cq();
    rpd = use_srq->pd();
  }
  ModelMr* mr = nullptr;
  switch (f.op) {
    case WrOpcode::SEND:
    case WrOpcode::SEND_WITH_IMM:
      return deliver(f, use_srq, cq, rpd);
    case WrOpcode::RDMA_WRITE:
    case WrOpcode::RDMA_WRITE_WITH_IMM:
      if (!check_rkey(f, rpd, ACCESS_REMOTE_WRITE, f.payload.size(), &mr)) {
        responder_error(f, "NAK_REM_ACCESS", "RDMA WRITE: bad rkey, bounds or access");
        return false;
      }
      if (f.op == WrOpcode::RDMA_WRITE_WITH_IMM) {
        if (!has_recv(use_srq)) return no_recv(f);
        std::copy(f.payload.begin(), f.payload.end(), mr->data() + f.remote_addr);
        RecvWr wr = take_recv(use_srq);
        complete_recv(cq, wr, WcStatus::SUCCESS, static_cast<uint32_t>(f.payload.size()), &f);
      } else {
        std::copy(f.payload.begin(), f.payload.end(), mr->data() + f.remote_addr);
      }
      respond(f, "ACK", f.pkt.psn);
      return true;
    case WrOpcode::RDMA_READ:
      if (!check_rkey(f, rpd, ACCESS_REMOTE_READ, f.dma_len, &mr)) {
        responder_error(f, "NAK_REM_ACCESS", "RDMA READ: bad rkey, bounds or access");
        return false;
      }
      respond(
          f, "READ_RESPONSE", f.pkt.psn,
          std::vector<uint8_t>(mr->data() + f.remote_addr, mr->data() + f.remote_addr + f.dma_len));
      return true;
  }
  return false;
}

bool QpCore::has_recv(ModelSrq* use_srq) const {
  return use_srq ? use_srq->outstanding() > 0 : !rq_.empty();
}

RecvWr QpCore::take_recv(ModelSrq* use_srq) {
  if (use_srq) return *use_srq->take();
  RecvWr wr = std::move(rq_.front());
  rq_.pop_front();
  return wr;
}

// No receive WQE: RNR NAK on IB/RoCE; iWARP has no RNR, the stream is terminated.
bool QpCore::no_recv(const Frame& f) {
  if (dev.caps.transport == Transport::iWARP) {
    responder_error(f, "NAK_REM_OP", "no receive buffer (iWARP has no RNR)");
  } else {
    respond(f, "RNR_NAK", f.pkt.psn);
  }
  return false;
}

bool QpCore::deliver(const Frame& f, ModelSrq* use_srq, ModelCq* cq, ModelPd* rpd) {
  if (!has_recv(use_srq)) return no_recv(f);
  RecvWr wr = take_recv(use_srq);
  if (f.payload.size() > sge_total(wr.sg_list)) {
    complete_recv(cq, wr, WcStatus::LOC_LEN_ERR, 0, &f);
    responder_error(f, "NAK_INV_REQ", "message longer than the receive buffer");
    return false;
  }
  if (check_recv_sges(wr.sg_list, rpd)) {
    complete_recv(cq, wr, WcStatus::LOC_PROT_ERR, 0, &f);
    responder_error(f, "NAK_REM_OP", "receive buffer: bad lkey or bounds");
    return false;
  }
  scatter(dev, wr.sg_list, f.payload, 0);
  complete_recv(cq, wr, WcStatus::SUCCESS, static_cast<uint32_t>(f.payload.size()), &f);
  respond(f, "ACK", f.pkt.psn);
  return true;
}

// True when a receive SGE is unusable (lkey, PD, bounds or LOCAL_WRITE).
bool QpCore::check_recv_sges(const std::vector<Sge>& sges, ModelPd* rpd) const {
  for (const Sge& s : sges) {
    if (s.length == 0) continue;
    ModelMr* mr = dev.find_mr(s.lkey);
    if (mr == nullptr || !mr->owned_live() || mr->pd() != rpd || !mr->in_bounds(s.addr, s.length) ||
        (mr->access() & ACCESS_LOCAL_WRITE) == 0) {
      return true;
    }
  }
  return false;
}

// UD: delivered when the Q_Key matches and a receive is posted, else silently dropped.
void QpCore::on_ud(const Frame& f) {
  if (f.qkey != attr.qkey || !has_recv(srq)) return;
  RecvWr wr = take_recv(srq);
  ModelPd* rpd = srq ? srq->pd() : pd;
  if (f.payload.size() + kGrhBytes > sge_total(wr.sg_list)) {
    complete_recv(recv_cq, wr, WcStatus::LOC_LEN_ERR, 0, &f);
    return;
  }
  if (check_recv_sges(wr.sg_list, rpd)) {
    complete_recv(recv_cq, wr, WcStatus::LOC_PROT_ERR, 0, &f);
    return;
  }
  scatter(dev, wr.sg_list, f.payload, kGrhBytes);
  complete_recv(recv_cq, wr, WcStatus::SUCCESS, static_cast<uint32_t>(f.payload.size() + kGrhBytes),
                &f);
}

}  // namespace rdmalab::model
