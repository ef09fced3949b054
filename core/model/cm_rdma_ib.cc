// rdma_cm over the IB CM: cma_connect_ib, cma_accept_ib, rdma_disconnect, and the event
// mapping of cma_ib_handler / cma_ib_req_handler (semantics.md B).
#include "model/cm_rdma.h"
#include "model/device.h"
#include "model/process.h"

namespace rdmalab::model {

IbCm& ModelCmId::ib() const {
  return *ch_.dev().ib_cm;
}

IbCm::Handler ModelCmId::ib_handler() {
  std::weak_ptr<ModelCmId> weak = shared_from_this();
  return [weak](const IbCmEvent& ev) {
    if (auto self = weak.lock(); self && self->st_.live()) self->on_ib_event(ev);
  };
}

void ModelCmId::ib_connect() {
  ib_id_ = ib().create_id(ib_handler());
  peer_gid_ = dgid_;
  IbCmReqParam p;
  p.service_id = cm_service_id(port_);
  p.dst_host = dst_host_;
  p.dgid = dgid_;
  p.qpn = qp_->qp_num();
  p.starting_psn = psn_;
  p.packet_life_time = timing_.packet_life_time;
  p.remote_cm_response_timeout = timing_.cm_response_timeout;
  p.local_cm_response_timeout = timing_.cm_response_timeout;
  p.max_cm_retries = timing_.max_cm_retries;
  p.responder_resources = param_.responder_resources;
  p.initiator_depth = param_.initiator_depth;
  p.retry_count = param_.retry_count;
  p.rnr_retry_count = param_.rnr_retry_count;
  p.private_data = param_.private_data;
  ib().send_req(ib_id_, p);
}

// cma_accept_ib: the QP to RTR and RTS from the REQ, then the REP.
void ModelCmId::ib_accept() {
  const IbCmState s = ib().state(ib_id_);
  if (s != IbCmState::REQ_RCVD && s != IbCmState::MRA_REQ_SENT)
    throw Error("rdma_accept", EINVAL, std::string("IB CM in ") + to_string(s));
  modify_qp(QpState::RTR, rtr_attr(peer_qpn_, peer_psn_, param_.responder_resources),
            QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC |
                QP_MIN_RNR_TIMER);
  QpAttr rts;
  rts.timeout = ib().av_timeout(ib_id_);
  rts.retry_cnt = peer_retry_count_;
  rts.rnr_retry = peer_rnr_retry_;
  rts.sq_psn = psn_;
  rts.max_rd_atomic = param_.initiator_depth;
  modify_qp(QpState::RTS, rts,
            QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC);
  IbCmRepParam rep;
  rep.qpn = qp_->qp_num();
  rep.starting_psn = psn_;
  rep.responder_resources = param_.responder_resources;
  rep.initiator_depth = param_.initiator_depth;
  rep.rnr_retry_count = param_.rnr_retry_count;
  rep.private_data = param_.private_data;
  ib().send_rep(ib_id_, rep);
}

// rdma_disconnect on IB: the QP to ERR, then a DREQ, or the DREP if the peer's DREQ came first.
void ModelCmId::ib_disconnect() {
  qp_to_err();
  try {
    ib().send_dreq(ib_id_);
    return;
  } catch (const Error&) {
  }
  try {
    ib().send_drep(ib_id_);
  } catch (const Error&) {
  }
}

// cma_rep_recv: RTR, RTS, RTU; on failure the QP to ERR and a REJ.
int ModelCmId::ib_rep_recv(const IbCmEvent& ev) {
  try {
    modify_qp(QpState::RTR,
              rtr_attr(ev.msg.local_qpn, ev.msg.starting_psn, param_.responder_resources),
              QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC |
                  QP_MIN_RNR_TIMER);
    QpAttr rts;
    rts.timeout = ib().av_timeout(ib_id_);
    rts.retry_cnt = param_.retry_count;
    rts.rnr_retry = ev.msg.rnr_retry_count;
    rts.sq_psn = psn_;
    rts.max_rd_atomic = param_.initiator_depth;
    modify_qp(
        QpState::RTS, rts,
        QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC);
    ib().send_rtu(ib_id_);
    return 0;
  } catch (const Error& e) {
    qp_to_err();
    try {
      ib().send_rej(ib_id_, REJ_CONSUMER_DEFINED, {});
    } catch (const Error&) {
    }
    return -e.err();
  }
}

// cma_ib_handler: non-TIMEWAIT events only in CONNECT, TIMEWAIT_EXIT only in DISCONNECT.
void ModelCmId::on_ib_event(const IbCmEvent& ev) {
  if (ev.type == IbCmEventType::REQ_RECEIVED) return on_ib_req(ev);
  const bool timewait = ev.type == IbCmEventType::TIMEWAIT_EXIT;
  if ((!timewait && state_ != RdmaCmState::CONNECT) ||
      (timewait && state_ != RdmaCmState::DISCONNECT)) {
    env().record_fields(st_.host, st_.label, "cm_event_ignored",
                        {{"ib_event", to_string(ev.type)}, {"state", to_string(state_)}});
    return;
  }
  switch (ev.type) {
    case IbCmEventType::REQ_ERROR:
    case IbCmEventType::REP_ERROR:
      return report(CmEventType::UNREACHABLE, -ETIMEDOUT);
    case IbCmEventType::REP_RECEIVED: {
      // CMA_CM_MRA_SETTING: MRA_REP_SENT, the MRA itself only if a duplicate REP comes.
      ib().send_mra(ib_id_, kCmaMraServiceTimeout, true);
      peer_qpn_ = ev.msg.local_qpn;
      peer_host_ = ev.remote_host;
      const int status = ib_rep_recv(ev);
      return report(status ? CmEventType::CONNECT_ERROR : CmEventType::ESTABLISHED, status,
                    ev.msg.private_data);
    }
    case IbCmEventType::RTU_RECEIVED:
    case IbCmEventType::USER_ESTABLISHED:
      return report(CmEventType::ESTABLISHED, 0);
    case IbCmEventType::DREQ_ERROR:
    case IbCmEventType::DREQ_RECEIVED:
    case IbCmEventType::DREP_RECEIVED:
      if (!comp_exch(RdmaCmState::CONNECT, RdmaCmState::DISCONNECT)) return;
      return report(CmEventType::DISCONNECTED,
                    ev.type == IbCmEventType::DREQ_ERROR ? -ETIMEDOUT : 0);
    case IbCmEventType::TIMEWAIT_EXIT:
      // MUTATION(double_timewait_exit): the user gets TIMEWAIT_EXIT twice.
      if (env().mutated(Mutation::kDoubleTimewaitExit)) report(CmEventType::TIMEWAIT_EXIT, 0);
      return report(CmEventType::TIMEWAIT_EXIT, 0);
    case IbCmEventType::MRA_RECEIVED:
      return;  // ignored by rdma_cm
    case IbCmEventType::REJ_RECEIVED:
      qp_to_err();
      return report(CmEventType::REJECTED, ev.reason, ev.msg.private_data);
    case IbCmEventType::REQ_RECEIVED:
      return;
  }
}

// cma_ib_req_handler on the listener: a new id in CONNECT, CONNECT_REQUEST to the user, then
// the delayed MRA. ucma's backlog: when that many requests are unread, the new id is dropped
// without a REJ (cm_destroy_id with -ENOMEM) so the active side retries.
void ModelCmId::on_ib_req(const IbCmEvent& ev) {
  if (state_ != RdmaCmState::LISTEN) {
    ib().destroy_id(ev.id);
    return;
  }
  if (ch_.unread_connect_requests(st_.id) >= static_cast<size_t>(backlog_)) {
    env().record_fields(st_.host, st_.label, "cm_backlog_full", {{"backlog", backlog_}});
    ib().destroy_id(ev.id, ENOMEM);
    return;
  }
  auto conn = ch_.adopt_passive();
  conn->ctx_ = ctx_;
  conn->ib_id_ = ev.id;
  conn->port_ = port_;
  conn->peer_qpn_ = ev.msg.local_qpn;
  conn->peer_psn_ = ev.msg.starting_psn;
  conn->peer_retry_count_ = ev.msg.retry_count;
  conn->peer_rnr_retry_ = ev.msg.rnr_retry_count;
  conn->peer_gid_ = ev.msg.src_gid;
  conn->peer_host_ = ev.remote_host;
  conn->state_ = RdmaCmState::CONNECT;
  env().record_fields(st_.host, conn->label(), "cm_create",
                      {{"layer", "rdma_cm"},
                       {"listen_id", st_.id},
                       {"peer", ev.remote_host},
                       {"peer_qpn", ev.msg.local_qpn}});
  ib().set_handler(ev.id, conn->ib_handler());
  report(CmEventType::CONNECT_REQUEST, 0, ev.msg.private_data, st_.id, conn->id());
  ib().send_mra(ev.id, kCmaMraServiceTimeout, true);
}

}  // namespace rdmalab::model
