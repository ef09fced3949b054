// The IB CM's consumer verbs (ib_create_cm_id, ib_cm_listen, ib_send_cm_*, ib_cm_notify,
// ib_destroy_cm_id) with the state checks cm.c makes, and the host reset of a reboot.
#include <sstream>

#include "model/cm_ib.h"
#include "model/device.h"

namespace rdmalab::model {

uint32_t IbCm::create_id(Handler handler) {
  // cm_alloc_id: a cyclic index XOR the random operand, never 0 and never in use.
  uint32_t local_id = 0;
  do {
    local_id = (next_index_++) ^ random_operand_;
  } while (local_id == 0 || ids_.count(local_id));
  auto id = std::make_unique<Id>();
  id->local_id = local_id;
  id->handler = std::move(handler);
  ids_[local_id] = std::move(id);
  env_.record_fields(dev_.host, label(local_id), "cm_create", {{"layer", "ib_cm"}});
  return local_id;
}

void IbCm::set_handler(uint32_t id, Handler handler) {
  get("ib_cm_set_handler", id).handler = std::move(handler);
}

void IbCm::listen(uint32_t id_in, uint64_t service_id) {
  Id& id = get("ib_cm_listen", id_in);
  if (id.state != IbCmState::IDLE) throw Error("ib_cm_listen", EINVAL, "not IDLE");
  if (listeners_.count(service_id))
    throw Error("ib_cm_listen", EBUSY, "service ID already listened on");
  id.service_id = service_id;
  listeners_[service_id] = id.local_id;
  set_state(id, IbCmState::LISTEN);
}

void IbCm::send_req(uint32_t id_in, const IbCmReqParam& p) {
  Id& id = get("ib_send_cm_req", id_in);
  if (id.state != IbCmState::IDLE) throw Error("ib_send_cm_req", EINVAL, "not IDLE");
  id.service_id = p.service_id;
  id.remote_host = p.dst_host;
  id.remote_gid = p.dgid;
  id.local_qpn = p.qpn;
  id.max_cm_retries = p.max_cm_retries;
  // ib_send_cm_req: 2 * packet lifetime + the remote's CM response time.
  id.timeout_ms =
      2 * cm_convert_to_ms(p.packet_life_time) + cm_convert_to_ms(p.remote_cm_response_timeout);
  id.av_timeout = static_cast<uint8_t>(p.packet_life_time + 1);  // cm_init_av_by_path
  CmMsg m;
  m.type = CmMsgType::REQ;
  m.service_id = p.service_id;
  m.local_ca_guid = dev_.caps.node_guid;
  m.local_qpn = p.qpn;
  m.starting_psn = p.starting_psn;
  m.remote_cm_response_timeout = p.remote_cm_response_timeout;
  m.local_cm_response_timeout = p.local_cm_response_timeout;
  m.max_cm_retries = p.max_cm_retries;
  m.packet_life_time = p.packet_life_time;
  m.primary_local_ack_timeout =
      cm_ack_timeout(dev_.pers.caps.local_ca_ack_delay, p.packet_life_time);
  m.responder_resources = p.responder_resources;
  m.initiator_depth = p.initiator_depth;
  m.retry_count = p.retry_count;
  m.rnr_retry_count = p.rnr_retry_count;
  m.private_data = p.private_data;
  set_state(id, IbCmState::REQ_SENT);
  send_with_retry(id, std::move(m));
}

void IbCm::send_rep(uint32_t id_in, const IbCmRepParam& p) {
  Id& id = get("ib_send_cm_rep", id_in);
  if (id.state != IbCmState::REQ_RCVD && id.state != IbCmState::MRA_REQ_SENT)
    throw Error("ib_send_cm_rep", EINVAL, std::string("in ") + to_string(id.state));
  id.local_qpn = p.qpn;
  CmMsg m;
  m.type = CmMsgType::REP;
  m.local_ca_guid = dev_.caps.node_guid;
  m.local_qpn = p.qpn;
  m.starting_psn = p.starting_psn;
  m.target_ack_delay = dev_.pers.caps.local_ca_ack_delay;
  m.responder_resources = p.responder_resources;
  m.initiator_depth = p.initiator_depth;
  m.rnr_retry_count = p.rnr_retry_count;
  m.private_data = p.private_data;
  set_state(id, IbCmState::REP_SENT);
  send_with_retry(id, std::move(m));
}

void IbCm::send_rtu(uint32_t id_in) {
  Id& id = get("ib_send_cm_rtu", id_in);
  if (id.state != IbCmState::REP_RCVD && id.state != IbCmState::MRA_REP_SENT)
    throw Error("ib_send_cm_rtu", EINVAL, std::string("in ") + to_string(id.state));
  CmMsg m;
  m.type = CmMsgType::RTU;
  set_state(id, IbCmState::ESTABLISHED);
  send_on(id, std::move(m));
}

// ib_send_cm_mra; with the DELAY flag (rdma_cm's CMA_CM_MRA_SETTING) only the state changes and
// the MRA goes out when a duplicate arrives (cm_dup_req_handler).
void IbCm::send_mra(uint32_t id_in, uint8_t service_timeout, bool delay) {
  Id& id = get("ib_send_cm_mra", id_in);
  CmMsg m;
  m.type = CmMsgType::MRA;
  m.service_timeout = service_timeout;
  switch (id.state) {
    case IbCmState::REQ_RCVD:
      m.msg_mraed = CmMsgResponse::REQ;
      set_state(id, IbCmState::MRA_REQ_SENT);
      break;
    case IbCmState::REP_RCVD:
      m.msg_mraed = CmMsgResponse::REP;
      set_state(id, IbCmState::MRA_REP_SENT);
      break;
    default:
      throw Error("ib_send_cm_mra", EINVAL, std::string("in ") + to_string(id.state));
  }
  id.service_timeout = service_timeout;
  if (!delay) send_on(id, std::move(m));
}

void IbCm::send_rej(uint32_t id_in, int reason, const std::vector<uint8_t>& private_data) {
  Id& id = get("ib_send_cm_rej", id_in);
  CmMsg m = rej_for(id, reason, private_data);
  switch (id.state) {
    case IbCmState::REQ_SENT:
    case IbCmState::MRA_REQ_RCVD:
    case IbCmState::REQ_RCVD:
    case IbCmState::MRA_REQ_SENT:
    case IbCmState::REP_RCVD:
    case IbCmState::MRA_REP_SENT:
      cancel_mad(id);
      reset_to_idle(id);
      break;
    case IbCmState::REP_SENT:
    case IbCmState::MRA_REP_RCVD:
      enter_timewait(id);
      break;
    default:
      throw Error("ib_send_cm_rej", EINVAL, std::string("in ") + to_string(id.state));
  }
  send_on(id, std::move(m));
}

void IbCm::send_dreq(uint32_t id_in) {
  Id& id = get("ib_send_cm_dreq", id_in);
  if (id.state != IbCmState::ESTABLISHED)
    throw Error("ib_send_cm_dreq", EINVAL, std::string("in ") + to_string(id.state));
  CmMsg m;
  m.type = CmMsgType::DREQ;
  m.remote_qpn = id.remote_qpn;
  set_state(id, IbCmState::DREQ_SENT);
  send_with_retry(id, std::move(m));
}

// ib_send_cm_drep: DREQ_RCVD -> TIMEWAIT, whether or not the DREP gets out.
void IbCm::send_drep(uint32_t id_in) {
  Id& id = get("ib_send_cm_drep", id_in);
  if (id.state != IbCmState::DREQ_RCVD)
    throw Error("ib_send_cm_drep", EINVAL, std::string("in ") + to_string(id.state));
  CmMsg m;
  m.type = CmMsgType::DREP;
  send_on(id, std::move(m));
  enter_timewait(id);
}

// cm_establish: data arrived before the RTU.
void IbCm::notify_comm_est(uint32_t id_in) {
  Id& id = get("ib_cm_notify", id_in);
  switch (id.state) {
    case IbCmState::REP_SENT:
    case IbCmState::MRA_REP_RCVD:
      break;
    case IbCmState::ESTABLISHED:
      throw Error("ib_cm_notify", EISCONN, "already ESTABLISHED");
    default:
      throw Error("ib_cm_notify", EINVAL, std::string("in ") + to_string(id.state));
  }
  cancel_mad(id);
  set_state(id, IbCmState::ESTABLISHED);
  IbCmEvent ev;
  ev.type = IbCmEventType::USER_ESTABLISHED;
  deliver(id.local_id, ev);
}

// (model) The consumer's QP event handler calling rdma_notify/ib_cm_notify on COMM_EST, as the
// kernel ULPs do: only an id still waiting for its RTU is moved.
void IbCm::on_comm_est_qp(uint32_t qpn) {
  for (auto& [local_id, id] : ids_) {
    if (id->local_qpn == qpn &&
        (id->state == IbCmState::REP_SENT || id->state == IbCmState::MRA_REP_RCVD)) {
      notify_comm_est(local_id);
      return;
    }
  }
}

// cm_destroy_id: what each state sends on the way out; no event reaches the consumer after.
void IbCm::destroy_id(uint32_t id_in, int err) {
  Id* p = find(id_in, std::nullopt);
  if (p == nullptr) return;
  Id& id = *p;
  id.handler = nullptr;
  for (bool again = true; again;) {
    again = false;
    switch (id.state) {
      case IbCmState::LISTEN:
        listeners_.erase(id.service_id);
        set_state(id, IbCmState::IDLE);
        break;
      case IbCmState::REQ_SENT:
      case IbCmState::MRA_REQ_RCVD:
        cancel_mad(id);
        send_rej(id.local_id, REJ_TIMEOUT, {});
        break;
      case IbCmState::REQ_RCVD:
        if (err == ENOMEM) {
          reset_to_idle(id);
          break;
        }
        send_rej(id.local_id, REJ_CONSUMER_DEFINED, {});
        break;
      case IbCmState::MRA_REQ_SENT:
      case IbCmState::REP_RCVD:
      case IbCmState::MRA_REP_SENT:
        send_rej(id.local_id, REJ_CONSUMER_DEFINED, {});
        break;
      case IbCmState::REP_SENT:
      case IbCmState::MRA_REP_RCVD:
        send_rej(id.local_id, REJ_CONSUMER_DEFINED, {});  // -> TIMEWAIT
        again = true;
        break;
      case IbCmState::ESTABLISHED: {
        // One DREQ, cancelled at once: no retries, no DREP awaited (cm_send_dreq_locked).
        send_dreq(id.local_id);
        cancel_mad(id);
        enter_timewait(id);
        again = true;
        break;
      }
      case IbCmState::DREQ_SENT:
        cancel_mad(id);
        enter_timewait(id);
        again = true;
        break;
      case IbCmState::DREQ_RCVD:
        send_drep(id.local_id);
        again = true;
        break;
      default:  // TIMEWAIT (the timer finds no id), IDLE
        break;
    }
  }
  cancel_mad(id);
  remove_remote(id);
  env_.runtime.cancel(id.timewait_timer);
  env_.record_fields(dev_.host, label(id_in), "cm_destroy",
                     {{"layer", "ib_cm"}, {"state", to_string(id.state)}});
  ids_.erase(id_in);
}

void IbCm::reset() {
  for (auto& [local_id, id] : ids_) {
    if (id->pending) env_.runtime.cancel(id->pending->timer);
    env_.runtime.cancel(id->timewait_timer);
  }
  env_.record_fields(dev_.host, "ib_cm", "cm_reset", {{"ids_lost", ids_.size()}});
  ids_.clear();
  listeners_.clear();
  remote_id_table_.clear();
  remote_qp_table_.clear();
  ++epoch_;
  next_index_ = 1;
  random_operand_ = static_cast<uint32_t>(env_.runtime.rng().next());
}

std::string IbCm::dump() const {
  std::ostringstream out;
  for (const auto& [local_id, id] : ids_) {
    out << "    " << label(local_id) << " " << to_string(id->state) << " qpn " << id->local_qpn
        << " remote " << id->remote_host << " qpn " << id->remote_qpn
        << (id->pending ? std::string(" awaiting answer to ") + cm_msg_name(id->pending->msg.type)
                        : std::string())
        << "\n";
  }
  return out.str();
}

}  // namespace rdmalab::model
