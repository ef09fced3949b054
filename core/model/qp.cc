// The QP state machine, posting rules and flush (semantics.md C and G; IBA 10.3.1, 11.6.2).
#include "model/qp.h"

#include <algorithm>

#include "model/cm_iw.h"
#include "model/context.h"
#include "model/device.h"
#include "model/qp_state_table.h"

namespace rdmalab::model {
namespace {

WcOpcode wc_opcode(WrOpcode op) {
  switch (op) {
    case WrOpcode::SEND:
    case WrOpcode::SEND_WITH_IMM:
      return WcOpcode::SEND;
    case WrOpcode::RDMA_WRITE:
    case WrOpcode::RDMA_WRITE_WITH_IMM:
      return WcOpcode::RDMA_WRITE;
    case WrOpcode::RDMA_READ:
      return WcOpcode::RDMA_READ;
  }
  return WcOpcode::SEND;
}

std::string state_name(QpState s) {
  return std::string(to_string(s));
}

}  // namespace

QpCore::QpCore(Device& d, uint64_t id_in, uint32_t qpn_in, const QpInitAttr& init, ModelPd* pd_in,
               ModelCq* send_cq_in, ModelCq* recv_cq_in, ModelSrq* srq_in,
               std::shared_ptr<XrcdCore> xrcd_in)
    : dev(d),
      env(d.env),
      id(id_in),
      qpn(qpn_in),
      type(init.qp_type),
      cap(init.cap),
      sq_sig_all(init.sq_sig_all),
      pd(pd_in),
      send_cq(send_cq_in),
      recv_cq(recv_cq_in),
      srq(srq_in),
      xrcd(std::move(xrcd_in)) {
  attr.cap = cap;
  if (pd) ++pd->usecnt;
  if (send_cq) ++send_cq->usecnt;
  if (recv_cq) ++recv_cq->usecnt;
  if (srq) ++srq->usecnt;
}

// ---------------------------------------------------------------- modify / query

void QpCore::modify(const QpAttr& a, uint32_t mask) {
  const QpState cur = state;
  const QpState next = (mask & QP_STATE) ? a.qp_state : cur;
  if ((mask & QP_CUR_STATE) && a.cur_qp_state != cur) {
    throw Error(
        "ibv_modify_qp", EINVAL,
        "cur_qp_state " + state_name(a.cur_qp_state) + " but the QP is in " + state_name(cur));
  }
  const std::string why =
      check_modify(cur, next, type, mask, dev.caps.transport == Transport::iWARP);
  if (!why.empty()) throw Error("ibv_modify_qp", EINVAL, why);
  if ((mask & QP_PORT) && (a.port_num == 0 || a.port_num > dev.caps.phys_port_cnt)) {
    throw Error("ibv_modify_qp", EINVAL, "no port " + std::to_string(a.port_num));
  }
  if ((mask & QP_TIMEOUT) && a.timeout > 31) throw Error("ibv_modify_qp", EINVAL, "timeout > 31");
  if ((mask & QP_RETRY_CNT) && a.retry_cnt > 7)
    throw Error("ibv_modify_qp", EINVAL, "retry_cnt > 7");
  if ((mask & QP_RNR_RETRY) && a.rnr_retry > 7)
    throw Error("ibv_modify_qp", EINVAL, "rnr_retry > 7");
  if ((mask & QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31)
    throw Error("ibv_modify_qp", EINVAL, "min_rnr_timer > 31");
  if ((mask & QP_DEST_QPN) && a.dest_qp_num > 0xffffff)
    throw Error("ibv_modify_qp", EINVAL, "dest_qp_num > 24 bits");

  if (mask & QP_ACCESS_FLAGS) attr.qp_access_flags = a.qp_access_flags;
  if (mask & QP_PKEY_INDEX) attr.pkey_index = a.pkey_index;
  if (mask & QP_PORT) attr.port_num = a.port_num;
  if (mask & QP_QKEY) attr.qkey = a.qkey;
  if (mask & QP_AV) attr.ah_attr = a.ah_attr;
  if (mask & QP_PATH_MTU) attr.path_mtu = a.path_mtu;
  if (mask & QP_TIMEOUT) attr.timeout = a.timeout;
  if (mask & QP_RETRY_CNT) attr.retry_cnt = a.retry_cnt;
  if (mask & QP_RNR_RETRY) attr.rnr_retry = a.rnr_retry;
  if (mask & QP_RQ_PSN) attr.rq_psn = epsn_ = a.rq_psn & 0xffffff;
  if (mask & QP_SQ_PSN) attr.sq_psn = next_psn_ = a.sq_psn & 0xffffff;
  if (mask & QP_MAX_QP_RD_ATOMIC) attr.max_rd_atomic = a.max_rd_atomic;
  if (mask & QP_MAX_DEST_RD_ATOMIC) attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & QP_MIN_RNR_TIMER) attr.min_rnr_timer = a.min_rnr_timer;
  if (mask & QP_DEST_QPN) attr.dest_qp_num = a.dest_qp_num;
  if (mask & QP_EN_SQD_ASYNC_NOTIFY) attr.en_sqd_async_notify = sqd_notify_ = a.en_sqd_async_notify;
  if (next != cur) set_state(next, "ibv_modify_qp");
  // iWARP: RTS -> ERR by the user ends the connection (siw drop_conn, cxgb4 abort).
  if (cur == QpState::RTS && next == QpState::ERR && dev.iw_cm) dev.iw_cm->qp_error(this);
}

QpAttr QpCore::query() const {
  QpAttr a = attr;
  a.qp_state = state;
  a.cur_qp_state = state;
  a.cap = cap;
  a.sq_draining =
      state == QpState::SQD &&
      std::any_of(sq_.begin(), sq_.end(), [](const SendWqe& w) { return w.psn_assigned; });
  return a;
}

// ---------------------------------------------------------------- states

void QpCore::set_state(QpState to, const std::string& why) {
  const QpState from = state;
  if (from == to) return;
  // seed 000: an iWARP QP moved to CLOSING with SQ WRs outstanding goes to ERROR instead.
  // On a handoff device (siw) a WR handed to TCP is done: tx_wqe idle, an orderly CLOSING.
  if (to == QpState::SQD && dev.pers.iwarp_closing &&
      std::any_of(sq_.begin(), sq_.end(), [](const SendWqe& w) { return !w.reported; })) {
    to = QpState::ERR;
  }
  state = to;
  env.record_fields(
      dev.host, label(), "qp_state",
      {{"from", state_name(from)}, {"to", state_name(to)}, {"qp_num", qpn}, {"why", why}});
  enter_state(from, to);
}

void QpCore::enter_state(QpState from, QpState to) {
  switch (to) {
    case QpState::RESET:
      reset_queues();
      return;
    case QpState::INIT:
    case QpState::RTR:
      return;
    case QpState::RTS:
      if (from == QpState::RTR) {
        retry_left_ = attr.retry_cnt;
        rnr_left_ = attr.rnr_retry;
      }
      kick();
      return;
    case QpState::SQD:
      if (from == QpState::RTS && dev.pers.iwarp_closing && dev.pers.closing_flushes_rq) {
        flush_rq_now();
      }
      check_sq_drained();
      return;
    case QpState::SQE:
      return;
    case QpState::ERR:
      env.runtime.cancel(rto_timer_);
      env.runtime.cancel(rnr_timer_);
      rto_timer_ = rnr_timer_ = 0;
      rnr_waiting_ = false;
      if (dead_) return;
      schedule_flush();
      // IBA 11.6.3: an SRQ-attached QP in error reports its last WQE (mlx5; not rxe).
      if (srq) dev.raise(AsyncEventType::QP_LAST_WQE_REACHED, qpn);
      return;
  }
}

void QpCore::reset_queues() {
  env.runtime.cancel(rto_timer_);
  env.runtime.cancel(rnr_timer_);
  rto_timer_ = rnr_timer_ = 0;
  sq_.clear();
  rq_.clear();
  rnr_waiting_ = false;
  sqd_notify_ = false;
  nak_seq_sent_ = false;
  comm_est_raised_ = false;
  next_psn_ = attr.sq_psn;
  epsn_ = attr.rq_psn;
}

void QpCore::bind_peer(const Gid& dgid, uint32_t dest_qpn, uint32_t sq_psn, uint32_t rq_psn) {
  attr.ah_attr.dgid = dgid;
  attr.dest_qp_num = dest_qpn;
  attr.sq_psn = next_psn_ = sq_psn & 0xffffff;
  attr.rq_psn = epsn_ = rq_psn & 0xffffff;
  env.record_fields(dev.host, label(), "qp_peer",
                    {{"qp_num", qpn}, {"dest_qp_num", dest_qpn}, {"dgid", dgid.str()}});
}

void QpCore::device_fatal() {
  dead_ = true;
  set_state(QpState::ERR, "device fatal");
}

// RTS->SQD with en_sqd_async_notify: SQ_DRAINED once no WR is in flight any more.
void QpCore::check_sq_drained() {
  if (state != QpState::SQD || !sqd_notify_) return;
  if (std::any_of(sq_.begin(), sq_.end(), [](const SendWqe& w) { return w.psn_assigned; })) return;
  sqd_notify_ = false;
  dev.raise(AsyncEventType::SQ_DRAINED, qpn);
}

// ---------------------------------------------------------------- flush

void QpCore::schedule_flush() {
  if (flush_pending_) return;
  flush_pending_ = true;
  env.runtime.schedule_after(0, [self = shared_from_this()] {
    self->flush_pending_ = false;
    if (!self->destroyed && self->state == QpState::ERR && !self->dead_) self->flush_now();
  });
}

// Every outstanding WR, signaled or not, completes with WR_FLUSH_ERR, in posting order per queue.
void QpCore::flush_now() {
  // MUTATION(lost_flush_completion): the QP's first flushed WR that would make a CQE makes none.
  auto lose = [this](bool makes_cqe) {
    if (!makes_cqe || flush_lost_ || !env.mutated(Mutation::kLostFlushCompletion)) return false;
    flush_lost_ = true;
    return true;
  };
  while (!sq_.empty()) {
    SendWqe w = std::move(sq_.front());
    sq_.pop_front();
    if (w.stranded) continue;  // no flush reaches it (siw_sq_flush walks the kernel's SQ)
    if (!lose(!w.reported && send_cq != nullptr)) complete_send(w, WcStatus::WR_FLUSH_ERR);
  }
  while (!rq_.empty()) {
    RecvWr wr = std::move(rq_.front());
    rq_.pop_front();
    if (!lose(recv_cq != nullptr)) complete_recv(recv_cq, wr, WcStatus::WR_FLUSH_ERR, 0, nullptr);
  }
}

void QpCore::flush_rq_now() {
  while (!rq_.empty()) {
    RecvWr wr = std::move(rq_.front());
    rq_.pop_front();
    complete_recv(recv_cq, wr, WcStatus::WR_FLUSH_ERR, 0, nullptr);
  }
}

// ---------------------------------------------------------------- completions

void QpCore::complete_send(const SendWqe& w, WcStatus status, uint32_t byte_len) {
  if (w.reported) return;  // completed when handed to the transport (siw)
  if (status == WcStatus::SUCCESS && !w.signaled) return;  // unsignaled: no CQE
  if (send_cq == nullptr) return;
  WorkCompletion wc;
  wc.wr_id = w.wr.wr_id;
  wc.status = status;
  wc.opcode = wc_opcode(w.wr.opcode);
  wc.byte_len = byte_len;
  wc.qp_num = qpn;
  send_cq->push(wc, label());
}

void QpCore::complete_recv(ModelCq* cq, const RecvWr& wr, WcStatus status, uint32_t byte_len,
                           const Frame* f) {
  if (cq == nullptr) return;
  WorkCompletion wc;
  wc.wr_id = wr.wr_id;
  wc.status = status;
  wc.opcode = WcOpcode::RECV;
  wc.byte_len = byte_len;
  wc.qp_num = qpn;
  if (f) {
    wc.src_qp = f->pkt.src_qpn;
    wc.with_imm = f->has_imm;
    wc.imm_data = f->imm;
    if (f->op == WrOpcode::RDMA_WRITE_WITH_IMM) wc.opcode = WcOpcode::RECV_RDMA_WITH_IMM;
  }
  cq->push(wc, label());
}

// ---------------------------------------------------------------- posting (IBA 10.3.1)

bool QpCore::can_post_send(const std::string& verb) {
  switch (state) {
    case QpState::RESET:
    case QpState::INIT:
    case QpState::RTR:
      throw Error(verb, EINVAL, label() + ": send queue not ready in " + state_name(state));
    case QpState::RTS:
      return true;
    case QpState::SQD:
      // libsiw (kStrand) writes the mapped SQ first: post_send decides (stranded).
      if (dev.pers.iwarp_closing && dev.caps.err_post != ErrPostPolicy::kStrand) {
        throw Error(verb, EINVAL, label() + ": iWARP QP in CLOSING");
      }
      return true;  // accepted; processed once back in RTS
    case QpState::SQE:
    case QpState::ERR:
      if (dev.caps.err_post == ErrPostPolicy::kRefuse) {
        throw Error(verb, EINVAL, label() + ": post to a QP in " + state_name(state) + " refused");
      }
      return true;
  }
  return true;
}

bool QpCore::can_post_recv(const std::string& verb) {
  switch (state) {
    case QpState::RESET:
      throw Error(verb, EINVAL, label() + ": receive queue not ready in RESET");
    case QpState::SQD:
      if (dev.pers.iwarp_closing && dev.caps.err_post != ErrPostPolicy::kStrand) {
        throw Error(verb, EINVAL, label() + ": iWARP QP in CLOSING");
      }
      // kStrand: libsiw's post_recv only writes the mapped RQ, no system call, so nothing
      // refuses it (vm:siw 6.1, swarm seed 3); the move to ERROR flushes it (siw_rq_flush).
      // A SEND in CLOSING stays refused: libsiw rings the doorbell, siw_post_send says
      // ENOTCONN, and what libsiw returns then is unverified.
      return true;
    case QpState::SQE:
    case QpState::ERR:
      if (dev.caps.err_post == ErrPostPolicy::kRefuse) {
        throw Error(verb, EINVAL, label() + ": post to a QP in " + state_name(state) + " refused");
      }
      return true;
    default:
      return true;
  }
}

void QpCore::post_send(const SendWr& wr) {
  const std::string verb = "ibv_post_send";
  if (type == QpType::XRC_RECV)
    throw Error(verb, EINVAL, label() + ": an XRC TGT QP has no send queue");
  can_post_send(verb);
  if (type == QpType::UD) {
    if (wr.opcode != WrOpcode::SEND && wr.opcode != WrOpcode::SEND_WITH_IMM) {
      throw Error(verb, EINVAL, std::string(to_string(wr.opcode)) + " is not valid on a UD QP");
    }
    if (!wr.ah) throw Error(verb, EINVAL, "UD send without an address handle");
  }
  if (wr.sg_list.size() > cap.max_send_sge)
    throw Error(verb, EINVAL, "more SGEs than max_send_sge");
  if (sq_.size() >= cap.max_send_wr) throw Error(verb, ENOMEM, label() + ": send queue full");
  SendWqe w;
  w.wr = wr;
  w.seq = next_wqe_seq_++;
  w.signaled = wr.signaled || sq_sig_all;
  const bool closing = state == QpState::SQD && dev.pers.iwarp_closing;
  w.stranded = dev.caps.err_post == ErrPostPolicy::kStrand &&
               (closing || state == QpState::ERR || state == QpState::SQE);
  // libsiw rings the doorbell (a post_send of no WR) only when the previous SQE is free, and
  // siw_post_send answers it -ENOTCONN in CLOSING; the SQE stays VALID either way (vm:siw,
  // swarm seed 8: the first post in CLOSING ENOTCONN, the next ones 0).
  const bool refused = w.stranded && closing && (sq_.empty() || !sq_.back().stranded);
  sq_.push_back(w);
  if (refused) throw Error(verb, ENOTCONN, label() + ": iWARP QP in CLOSING (the doorbell)");
  env.record_fields(dev.host, label(), "post",
                    {{"queue", "send"},
                     {"wr_id", wr.wr_id},
                     {"signaled", w.signaled},
                     {"qp_num", qpn},
                     {"opcode", std::string(to_string(wr.opcode))}});
  if (state == QpState::RTS) {
    kick();
  } else if (state == QpState::ERR || state == QpState::SQE) {
    post_in_error();
  }
}

// A WR posted to a QP already in ERR (or SQE): flushed, at once or soon, or, with kStrand
// (user-space siw: the WR sits in the mapped queue and no system call tells the kernel,
// finding siw-user-posts-in-error-are-never-flushed), never completed at all.
void QpCore::post_in_error() {
  if (dev.caps.err_post == ErrPostPolicy::kStrand) return;
  if (dev.caps.err_post == ErrPostPolicy::kFlushAtOnce) {
    flush_now();
  } else if (!dead_) {
    schedule_flush();
  }
}

void QpCore::post_recv(const RecvWr& wr) {
  const std::string verb = "ibv_post_recv";
  if (type == QpType::XRC_SEND || type == QpType::XRC_RECV) {
    throw Error(verb, EINVAL, label() + ": an XRC QP has no receive queue");
  }
  if (srq) throw Error(verb, EINVAL, label() + ": the QP receives through an SRQ");
  can_post_recv(verb);
  if (wr.sg_list.size() > cap.max_recv_sge)
    throw Error(verb, EINVAL, "more SGEs than max_recv_sge");
  if (rq_.size() >= cap.max_recv_wr) throw Error(verb, ENOMEM, label() + ": receive queue full");
  rq_.push_back(wr);
  env.record_fields(dev.host, label(), "post",
                    {{"queue", "recv"}, {"wr_id", wr.wr_id}, {"signaled", true}, {"qp_num", qpn}});
  if (state == QpState::ERR || state == QpState::SQE) post_in_error();
}

std::optional<WcStatus> QpCore::check_local_sges(const std::vector<Sge>& sges,
                                                 bool need_write) const {
  for (const Sge& s : sges) {
    if (s.length == 0) continue;
    ModelMr* mr = dev.find_mr(s.lkey);
    if (mr == nullptr || !mr->owned_live() || mr->pd() != pd || !mr->in_bounds(s.addr, s.length)) {
      return WcStatus::LOC_PROT_ERR;
    }
    if (need_write && (mr->access() & ACCESS_LOCAL_WRITE) == 0) return WcStatus::LOC_PROT_ERR;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- destroy

void QpCore::destroy() {
  if (destroyed) return;
  auto self = shared_from_this();  // the XRCD's map may hold the last reference
  // iWARP: a connected QP is moved to ERROR first, which ends its connection as the user's
  // move does (siw_destroy_qp -> siw_qp_modify ERROR; c4iw_destroy_qp -> c4iw_modify_qp
  // ERROR, not internal; vm:siw swarm seed 7: DISCONNECTED on the id whose QP went).
  if (state == QpState::RTS && dev.iw_cm) dev.iw_cm->qp_error(this);
  destroyed = true;
  dev.qp_table.erase(qpn);      // first: the driver can no longer find it (mana_table_remove_qp)
  dev.drain_eqes_for_qpn(qpn);  // pending EQEs now find nothing and are dropped
  env.runtime.cancel(rto_timer_);
  env.runtime.cancel(rnr_timer_);
  rto_timer_ = rnr_timer_ = 0;
  sq_.clear();
  rq_.clear();
  if (pd) --pd->usecnt;
  if (send_cq) --send_cq->usecnt;
  if (recv_cq) --recv_cq->usecnt;
  if (srq) --srq->usecnt;
  if (xrcd) {
    auto x = xrcd;
    x->tgt_qps.erase(qpn);
    x->maybe_destroy();
  }
  dev.free_qpn(qpn);  // last: a LIFO device may hand it to the next create
}

// ---------------------------------------------------------------- the handle

ModelQp::ModelQp(ModelContext& ctx, std::shared_ptr<QpCore> core, bool open_handle)
    : ModelObject(ctx.state_of(), "qp"),
      ctx_(ctx),
      core_(std::move(core)),
      open_handle_(open_handle) {}

void ModelQp::check_device(const std::string& verb) const {
  if (core_->destroyed) throw Error(verb, EBADF, st_.label + ": the real QP is destroyed");
  if (ctx_.dead()) throw Error(verb, EIO, st_.label + ": device fatal");
}

void ModelQp::modify(const QpAttr& attr, uint32_t attr_mask) {
  enter("ibv_modify_qp", core_->qpn);
  check_device("ibv_modify_qp");
  const std::string mask = attr_mask_names(attr_mask);
  try {
    core_->modify(attr, attr_mask);
  } catch (const Error& e) {
    nlohmann::json data = {{"verb", "ibv_modify_qp"}, {"qp_num", core_->qpn}, {"mask", mask}};
    if (attr_mask & QP_STATE) data["qp_state"] = std::string(to_string(attr.qp_state));
    data["err"] = e.err();
    data["detail"] = e.detail();
    env().record(st_.host, st_.label, "verb", data);
    throw;
  }
  if (attr_mask & QP_STATE) {
    env().record_fields(st_.host, st_.label, "verb",
                        {{"verb", "ibv_modify_qp"},
                         {"qp_num", core_->qpn},
                         {"mask", mask},
                         {"qp_state", to_string(attr.qp_state)}});
  } else {
    env().record_fields(st_.host, st_.label, "verb",
                        {{"verb", "ibv_modify_qp"}, {"qp_num", core_->qpn}, {"mask", mask}});
  }
}

QpAttr ModelQp::query() const {
  st_.check("ibv_query_qp");
  if (core_->destroyed)
    throw Error("ibv_query_qp", EBADF, st_.label + ": the real QP is destroyed");
  return core_->query();
}

const DeviceCaps& ModelQp::device_caps() const {
  return core_->dev.caps;
}

void ModelQp::post_send(const SendWr& wr) {
  enter("ibv_post_send", core_->qpn);
  check_device("ibv_post_send");
  core_->post_send(wr);
}

void ModelQp::post_recv(const RecvWr& wr) {
  enter("ibv_post_recv", core_->qpn);
  check_device("ibv_post_recv");
  core_->post_recv(wr);
}

// rdma-core ibv_cmd_destroy_qp: wait until every event read for this QP has been acked.
void ModelQp::destroy(TimeNs deadline_ns) {
  enter("ibv_destroy_qp", core_->qpn);
  const bool acked =
      env().runtime.wait_until([this] { return !st_.live() || ctx_.acked(st_.id); }, deadline_ns);
  st_.check("ibv_destroy_qp");
  if (!acked) {
    const uint64_t n = ctx_.unacked(st_.id);
    env().record_fields(
        st_.host, st_.label, "verb",
        {{"verb", "ibv_destroy_qp"}, {"qp_num", core_->qpn}, {"err", EBUSY}, {"unacked", n}});
    throw Error("ibv_destroy_qp", EBUSY,
                st_.label + ": " + std::to_string(n) + " async events read and not acked");
  }
  release(Release::kVerb);
}

void ModelQp::release(Release why) {
  if (!st_.live()) return;
  ctx_.forget_object(st_.id);  // unread events of this handle are discarded
  auto& hs = core_->handles;
  hs.erase(std::remove(hs.begin(), hs.end(), this), hs.end());
  st_.end(why, "ibv_destroy_qp", {{"qp_num", core_->qpn}, {"open_handle", open_handle_}});
  if (!core_->destroyed) {
    if (!core_->is_tgt()) {
      core_->destroy();
    } else if (hs.empty() && core_->dev.caps.xrc_tgt_lifetime != XrcTgtLifetime::kXrcd) {
      // Today's rule (kHandle): the TGT QP ends with its last handle, whatever holds the XRCD.
      env().record_fields(st_.host, core_->label(), "tgt_qp_destroyed",
                          {{"qp_num", core_->qpn}, {"reason", "last handle"}});
      core_->destroy();
    }
  }
  ctx_.drop_owned(st_.id);
}

}  // namespace rdmalab::model
