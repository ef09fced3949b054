// The IB CM receive path (cm.c cm_recv_handler -> cm_<msg>_handler): one handler per message,
// each opening with a switch over the states where that message is allowed. Anything else is
// counted and recorded as "cm_unexpected" (the kernel's counters and trace points).
#include "model/cm_ib.h"

#include "model/device.h"

namespace rdmalab::model {

void IbCm::on_mad(const CmMsg& m, const std::string& src) {
  env_.record_fields(dev_.host, "ib_cm", "cm_recv",
                     {{"msg", cm_msg_name(m.type)},
                      {"src", src},
                      {"local_comm_id", m.local_comm_id},
                      {"remote_comm_id", m.remote_comm_id},
                      {"qpn", m.type == CmMsgType::DREQ ? m.remote_qpn : m.local_qpn}});
  switch (m.type) {
    case CmMsgType::REQ:
      return on_req(m, src);
    case CmMsgType::MRA:
      return on_mra(m);
    case CmMsgType::REJ:
      return on_rej(m);
    case CmMsgType::REP:
      return on_rep(m, src);
    case CmMsgType::RTU:
      return on_rtu(m);
    case CmMsgType::DREQ:
      return on_dreq(m, src);
    case CmMsgType::DREP:
      return on_drep(m);
  }
}

// cm_issue_rej: a REJ with no id behind it, the comm IDs swapped from the message.
void IbCm::issue_rej(const std::string& dst, const CmMsg& rcv, int reason, CmMsgResponse what) {
  CmMsg m;
  m.type = CmMsgType::REJ;
  m.reason = reason;
  m.msg_rejected = what;
  m.local_comm_id = rcv.remote_comm_id;
  m.remote_comm_id = rcv.local_comm_id;
  m.local_ca_guid = dev_.caps.node_guid;
  transmit(dst, std::move(m), "ib_cm");
}

// cm_issue_drep: a DREQ for a connection this side does not know still gets its DREP.
void IbCm::issue_drep(const std::string& dst, const CmMsg& dreq) {
  CmMsg m;
  m.type = CmMsgType::DREP;
  m.local_comm_id = dreq.remote_comm_id;
  m.remote_comm_id = dreq.local_comm_id;
  transmit(dst, std::move(m), "ib_cm");
}

// cm_req_handler + cm_match_req: duplicate, then stale connection, then the listener.
void IbCm::on_req(const CmMsg& m, const std::string& src) {
  const Key remote_id{m.local_comm_id, m.local_ca_guid};
  const Key remote_qp{m.local_qpn, m.local_ca_guid};
  if (auto it = remote_id_table_.find(remote_id); it != remote_id_table_.end()) {
    if (Id* cur = find(it->second, std::nullopt)) dup_req(*cur, m);
    return;
  }
  if (auto it = remote_qp_table_.find(remote_qp); it != remote_qp_table_.end()) {
    // IBA 12.9.8.3.1: REJ the REQ, then DREQ the old connection (remote QPN = the stale QPN).
    const uint32_t cur = it->second;
    env_.record_fields(
        dev_.host, label(cur), "cm_stale",
        {{"msg", "REQ"}, {"remote_qpn", m.local_qpn}, {"remote_guid", m.local_ca_guid}});
    issue_rej(src, m, REJ_STALE_CONN, CmMsgResponse::REQ);
    if (Id* p = find(cur, std::nullopt); p != nullptr && p->state == IbCmState::ESTABLISHED)
      send_dreq(cur);
    return;
  }
  auto lit = listeners_.find(m.service_id);
  if (lit == listeners_.end()) {
    issue_rej(src, m, REJ_INVALID_SERVICE_ID, CmMsgResponse::REQ);
    return;
  }
  Id* listener = find(lit->second, std::nullopt);
  const uint32_t local_id = create_id(listener->handler);
  Id& id = *ids_.at(local_id);
  id.remote_id = m.local_comm_id;
  id.remote_ca_guid = m.local_ca_guid;
  id.remote_qpn = m.local_qpn;
  id.remote_host = src;
  id.remote_gid = m.src_gid;
  id.service_id = m.service_id;
  // cm_req_handler: the passive side times its answers by the REQ's local response timeout
  // and takes the REQ's retries; av.timeout is the REQ's primary local ACK timeout.
  id.timeout_ms = cm_convert_to_ms(m.local_cm_response_timeout);
  id.max_cm_retries = m.max_cm_retries;
  id.av_timeout = m.primary_local_ack_timeout;
  insert_remote(id);
  set_state(id, IbCmState::REQ_RCVD);
  IbCmEvent ev;
  ev.type = IbCmEventType::REQ_RECEIVED;
  ev.listen_id = lit->second;
  ev.msg = m;
  ev.remote_host = src;
  deliver(local_id, ev);
}

void IbCm::dup_req(Id& id, const CmMsg& m) {
  switch (id.state) {
    case IbCmState::REQ_RCVD:
      env_.record_fields(dev_.host, label(id.local_id), "cm_duplicate",
                         {{"msg", "REQ"}, {"action", "drop"}});
      return;
    case IbCmState::MRA_REQ_SENT: {
      env_.record_fields(dev_.host, label(id.local_id), "cm_duplicate",
                         {{"msg", "REQ"}, {"action", "MRA"}});
      CmMsg mra;
      mra.type = CmMsgType::MRA;
      mra.msg_mraed = CmMsgResponse::REQ;
      mra.service_timeout = id.service_timeout;
      send_on(id, std::move(mra));
      return;
    }
    case IbCmState::TIMEWAIT: {
      CmMsg rej = rej_for(id, REJ_STALE_CONN, {});
      send_on(id, std::move(rej));
      return;
    }
    default:
      env_.record_fields(dev_.host, label(id.local_id), "cm_duplicate",
                         {{"msg", "REQ"}, {"action", "drop"}, {"state", to_string(id.state)}});
      (void)m;
      return;
  }
}

// cm_mra_handler: the answer is late; wait service_timeout + av.timeout from now.
void IbCm::on_mra(const CmMsg& m) {
  Id* id = find(m.remote_comm_id, std::nullopt);
  if (id == nullptr) return unexpected(m, nullptr, "no such id");
  switch (id->state) {
    case IbCmState::REQ_SENT:
      if (m.msg_mraed != CmMsgResponse::REQ || !id->pending)
        return unexpected(m, id, "MRA not for REQ");
      set_state(*id, IbCmState::MRA_REQ_RCVD);
      break;
    case IbCmState::REP_SENT:
      if (m.msg_mraed != CmMsgResponse::REP || !id->pending)
        return unexpected(m, id, "MRA not for REP");
      set_state(*id, IbCmState::MRA_REP_RCVD);
      break;
    default:
      return unexpected(m, id, "MRA in this state");
  }
  // ib_modify_mad: the pending send keeps its retries and waits the new timeout.
  id->pending->timeout_ms = cm_convert_to_ms(m.service_timeout) + cm_convert_to_ms(id->av_timeout);
  arm_timer(*id);
  IbCmEvent ev;
  ev.type = IbCmEventType::MRA_RECEIVED;
  ev.msg = m;
  deliver(id->local_id, ev);
}

// cm_rej_handler (cm_acquire_rejected_id for the lookup).
void IbCm::on_rej(const CmMsg& m) {
  Id* id = nullptr;
  if (m.reason == REJ_TIMEOUT) {  // from cm_destroy_id in REQ_SENT: find it by (remote ID, GUID)
    auto it = remote_id_table_.find({m.local_comm_id, m.local_ca_guid});
    if (it != remote_id_table_.end()) id = find(it->second, std::nullopt);
  } else if (m.msg_rejected == CmMsgResponse::REQ) {
    id = find(m.remote_comm_id, 0u);
  } else {
    id = find(m.remote_comm_id, m.local_comm_id);
  }
  if (id == nullptr) return unexpected(m, nullptr, "no such id");
  switch (id->state) {
    case IbCmState::REQ_SENT:
    case IbCmState::MRA_REQ_RCVD:
    case IbCmState::REP_SENT:
    case IbCmState::MRA_REP_RCVD:
    case IbCmState::REQ_RCVD:
    case IbCmState::MRA_REQ_SENT:
      cancel_mad(*id);
      if (m.reason == REJ_STALE_CONN) {
        enter_timewait(*id);
      } else {
        reset_to_idle(*id);
      }
      break;
    case IbCmState::DREQ_SENT:
    case IbCmState::REP_RCVD:
    case IbCmState::MRA_REP_SENT:
    case IbCmState::ESTABLISHED:
      enter_timewait(*id);
      break;
    default:
      return unexpected(m, id, "REJ in this state");
  }
  IbCmEvent ev;
  ev.type = IbCmEventType::REJ_RECEIVED;
  ev.reason = m.reason;
  ev.msg = m;
  deliver(id->local_id, ev);
}

// cm_rep_handler. The REQ_SENT id is found only while it has no remote ID yet; a REP for an id
// that already has one is a duplicate (cm_dup_rep_handler).
void IbCm::on_rep(const CmMsg& m, const std::string& src) {
  Id* id = find(m.remote_comm_id, 0u);
  if (id == nullptr) return dup_rep(m);
  switch (id->state) {
    case IbCmState::REQ_SENT:
    case IbCmState::MRA_REQ_RCVD:
      break;
    default:
      return unexpected(m, id, "REP in this state");
  }
  const Key remote_id{m.local_comm_id, m.local_ca_guid};
  const Key remote_qp{m.local_qpn, m.local_ca_guid};
  if (remote_id_table_.count(remote_id)) return unexpected(m, id, "REP duplicates a connection");
  if (auto it = remote_qp_table_.find(remote_qp); it != remote_qp_table_.end()) {
    const uint32_t cur = it->second;
    env_.record_fields(
        dev_.host, label(cur), "cm_stale",
        {{"msg", "REP"}, {"remote_qpn", m.local_qpn}, {"remote_guid", m.local_ca_guid}});
    issue_rej(src, m, REJ_STALE_CONN, CmMsgResponse::REP);
    if (Id* p = find(cur, std::nullopt); p != nullptr && p->state == IbCmState::ESTABLISHED)
      send_dreq(cur);
    return;
  }
  id->remote_id = m.local_comm_id;
  id->remote_ca_guid = m.local_ca_guid;
  id->remote_qpn = m.local_qpn;
  insert_remote(*id);
  cancel_mad(*id);
  // cm_rep_handler: av.timeout from the target's ACK delay and the path's packet lifetime.
  id->av_timeout = cm_ack_timeout(m.target_ack_delay, static_cast<uint8_t>(id->av_timeout - 1));
  set_state(*id, IbCmState::REP_RCVD);
  IbCmEvent ev;
  ev.type = IbCmEventType::REP_RECEIVED;
  ev.msg = m;
  ev.remote_host = src;
  deliver(id->local_id, ev);
}

void IbCm::dup_rep(const CmMsg& m) {
  Id* id = find(m.remote_comm_id, m.local_comm_id);
  if (id == nullptr) return unexpected(m, nullptr, "no such id");
  switch (id->state) {
    case IbCmState::ESTABLISHED: {
      env_.record_fields(dev_.host, label(id->local_id), "cm_duplicate",
                         {{"msg", "REP"}, {"action", "RTU"}});
      CmMsg rtu;
      rtu.type = CmMsgType::RTU;
      return send_on(*id, std::move(rtu));
    }
    case IbCmState::MRA_REP_SENT: {
      env_.record_fields(dev_.host, label(id->local_id), "cm_duplicate",
                         {{"msg", "REP"}, {"action", "MRA"}});
      CmMsg mra;
      mra.type = CmMsgType::MRA;
      mra.msg_mraed = CmMsgResponse::REP;
      mra.service_timeout = id->service_timeout;
      return send_on(*id, std::move(mra));
    }
    default:
      return unexpected(m, id, "duplicate REP in this state");
  }
}

// cm_rtu_handler.
void IbCm::on_rtu(const CmMsg& m) {
  Id* id = find(m.remote_comm_id, m.local_comm_id);
  if (id == nullptr) return unexpected(m, nullptr, "no such id");
  switch (id->state) {
    case IbCmState::REP_SENT:
    case IbCmState::MRA_REP_RCVD:
      break;
    default:
      return unexpected(m, id, "RTU in this state");
  }
  cancel_mad(*id);
  set_state(*id, IbCmState::ESTABLISHED);
  IbCmEvent ev;
  ev.type = IbCmEventType::RTU_RECEIVED;
  ev.msg = m;
  deliver(id->local_id, ev);
}

// cm_dreq_handler.
void IbCm::on_dreq(const CmMsg& m, const std::string& src) {
  Id* id = find(m.remote_comm_id, m.local_comm_id);
  if (id == nullptr) return issue_drep(src, m);
  if (id->local_qpn != m.remote_qpn) return unexpected(m, id, "DREQ for another QPN");
  switch (id->state) {
    case IbCmState::REP_SENT:
    case IbCmState::DREQ_SENT:
    case IbCmState::ESTABLISHED:
    case IbCmState::MRA_REP_RCVD:
      cancel_mad(*id);
      break;
    case IbCmState::TIMEWAIT: {
      env_.record_fields(dev_.host, label(id->local_id), "cm_duplicate",
                         {{"msg", "DREQ"}, {"action", "DREP"}});
      CmMsg drep;
      drep.type = CmMsgType::DREP;
      return send_on(*id, std::move(drep));
    }
    default:
      return unexpected(m, id, "DREQ in this state");
  }
  set_state(*id, IbCmState::DREQ_RCVD);
  IbCmEvent ev;
  ev.type = IbCmEventType::DREQ_RECEIVED;
  ev.msg = m;
  deliver(id->local_id, ev);
}

// cm_drep_handler.
void IbCm::on_drep(const CmMsg& m) {
  Id* id = find(m.remote_comm_id, m.local_comm_id);
  if (id == nullptr) return unexpected(m, nullptr, "no such id");
  switch (id->state) {
    case IbCmState::DREQ_SENT:
    case IbCmState::DREQ_RCVD:
      break;
    default:
      return unexpected(m, id, "DREP in this state");
  }
  enter_timewait(*id);
  IbCmEvent ev;
  ev.type = IbCmEventType::DREP_RECEIVED;
  ev.msg = m;
  deliver(id->local_id, ev);
}

}  // namespace rdmalab::model
