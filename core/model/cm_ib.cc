// The IB CM: names, the MAD send path with mad.c's retries, TIMEWAIT and the
// remote tables (semantics.md A). The receive handlers are in cm_ib_recv.cc.
#include "model/cm_ib.h"

#include <cstdio>

#include "model/device.h"
#include "model/fabric.h"
#include "rdmalab/kernel_timer.h"

namespace rdmalab::model {

const char* cm_msg_name(CmMsgType t) {
  const char* name = cm_attr_name(static_cast<uint16_t>(t));
  return name != nullptr ? name : "?";
}

const char* to_string(IbCmState s) {
  static const char* const names[] = {
      "IDLE",      "LISTEN",   "REQ_SENT",      "REQ_RCVD",     "MRA_REQ_SENT", "MRA_REQ_RCVD",
      "REP_SENT",  "REP_RCVD", "MRA_REP_SENT",  "MRA_REP_RCVD", "ESTABLISHED",  "DREQ_SENT",
      "DREQ_RCVD", "TIMEWAIT", "SIDR_REQ_SENT", "SIDR_REQ_RCVD"};
  return names[static_cast<int>(s)];
}

const char* to_string(IbCmEventType t) {
  static const char* const names[] = {"REQ_ERROR",     "REQ_RECEIVED",  "REP_ERROR",
                                      "REP_RECEIVED",  "RTU_RECEIVED",  "USER_ESTABLISHED",
                                      "DREQ_ERROR",    "DREQ_RECEIVED", "DREP_RECEIVED",
                                      "TIMEWAIT_EXIT", "MRA_RECEIVED",  "REJ_RECEIVED"};
  return names[static_cast<int>(t)];
}

// MAD size on the wire (IBA 13.4: 256-byte MADs).
constexpr uint32_t kMadBytes = 256;

IbCm::IbCm(Device& dev) : dev_(dev), env_(dev.env) {
  random_operand_ = static_cast<uint32_t>(env_.runtime.rng().next());
}

std::string IbCm::label(uint32_t id) const {
  char buf[24];
  std::snprintf(buf, sizeof buf, "ib_cm:%08x", id);
  return buf;
}

IbCm::Id& IbCm::get(const std::string& verb, uint32_t id) {
  auto it = ids_.find(id);
  if (it == ids_.end()) throw Error(verb, EINVAL, "no IB CM id " + label(id));
  return *it->second;
}

// cm_acquire_id(local_id, remote_id): with a remote_id the id must have that remote ID too
// (0 while no REP or REQ told it), which is how a duplicate REP misses the REQ_SENT lookup.
IbCm::Id* IbCm::find(uint32_t local_id, std::optional<uint32_t> remote_id) {
  auto it = ids_.find(local_id);
  if (it == ids_.end()) return nullptr;
  if (remote_id && it->second->remote_id != *remote_id) return nullptr;
  return it->second.get();
}

IbCmState IbCm::state(uint32_t id) const {
  auto it = ids_.find(id);
  return it == ids_.end() ? IbCmState::IDLE : it->second->state;
}

uint8_t IbCm::av_timeout(uint32_t id) const {
  auto it = ids_.find(id);
  return it == ids_.end() ? 0 : it->second->av_timeout;
}

void IbCm::set_state(Id& id, IbCmState to) {
  if (id.state == to) return;
  env_.record_fields(dev_.host, label(id.local_id), "cm_state",
                     {{"layer", "ib_cm"}, {"from", to_string(id.state)}, {"to", to_string(to)}});
  id.state = to;
}

void IbCm::deliver(uint32_t id, IbCmEvent ev) {
  Id* p = find(id, std::nullopt);
  if (p == nullptr || !p->handler) return;
  ev.id = id;
  Handler h = p->handler;  // the handler may destroy the id
  h(ev);
}

void IbCm::unexpected(const CmMsg& m, const Id* id, const std::string& why) {
  ++unexpected_;
  env_.record_fields(dev_.host, id ? label(id->local_id) : "ib_cm", "cm_unexpected",
                     {{"msg", cm_msg_name(m.type)},
                      {"state", id ? to_string(id->state) : "none"},
                      {"local_comm_id", m.local_comm_id},
                      {"remote_comm_id", m.remote_comm_id},
                      {"why", why}});
}

// ---------------------------------------------------------------- the wire

void IbCm::transmit(const std::string& dst_host, CmMsg m, const std::string& object, int attempt) {
  m.src_gid = dev_.gid;
  env_.record_fields(dev_.host, object, "cm_send",
                     {{"msg", cm_msg_name(m.type)},
                      {"dst", dst_host},
                      {"local_comm_id", m.local_comm_id},
                      {"remote_comm_id", m.remote_comm_id},
                      {"qpn", m.type == CmMsgType::DREQ ? m.remote_qpn : m.local_qpn},
                      {"attempt", attempt}});
  Packet pkt;
  pkt.src_host = dev_.host;
  pkt.dst_host = dst_host;
  pkt.opcode = "MAD";
  pkt.dest_qpn = 1;
  pkt.src_qpn = 1;
  pkt.length = kMadBytes;
  pkt.mad_attr_id = static_cast<uint16_t>(m.type);
  auto msg = std::make_shared<const CmMsg>(std::move(m));
  Env* env = &env_;
  dev_.fabric.send(pkt, [env, msg](const Packet& p) {
    Device* d = env->device(p.dst_host);
    if (d != nullptr && d->ib_cm) d->ib_cm->on_mad(*msg, p.src_host);
  });
}

void IbCm::send_on(Id& id, CmMsg m) {
  m.local_comm_id = id.local_id;
  m.remote_comm_id = id.remote_id;
  transmit(id.remote_host, std::move(m), label(id.local_id));
}

// mad.c and cm.c arm their timers with msecs_to_jiffies(ms) on the kernel's timer wheel, which
// runs them at the end of a tick bucket, later than ms (rdmalab/kernel_timer.h).
int64_t IbCm::kernel_delay_ns(int64_t ms) const {
  return kernel_timer_delay_ns(env_.runtime.now_ns(), static_cast<uint64_t>(ms),
                               dev_.pers.caps.kernel_hz);
}

// One MAD that expects an answer: retries = max_cm_retries, each waits timeout_ms (mad.c
// timeout_sends; retries + 1 sends in all), then cm_process_send_error.
void IbCm::send_with_retry(Id& id, CmMsg m) {
  cancel_mad(id);
  m.local_comm_id = id.local_id;
  m.remote_comm_id = id.remote_id;
  Pending p;
  p.msg = m;
  p.retries_left = id.max_cm_retries;
  p.timeout_ms = id.timeout_ms;
  id.pending = p;
  transmit(id.remote_host, std::move(m), label(id.local_id));
  arm_timer(id);
}

void IbCm::arm_timer(Id& id) {
  Pending& p = *id.pending;
  env_.runtime.cancel(p.timer);
  const uint32_t local_id = id.local_id;
  const uint64_t epoch = epoch_;
  p.timer = env_.runtime.schedule_after(kernel_delay_ns(p.timeout_ms),
                                        [this, local_id, epoch] { on_mad_timeout(local_id, epoch); });
}

void IbCm::cancel_mad(Id& id) {
  if (!id.pending) return;
  env_.runtime.cancel(id.pending->timer);
  id.pending.reset();
}

void IbCm::on_mad_timeout(uint32_t local_id, uint64_t epoch) {
  if (epoch != epoch_) return;
  Id* id = find(local_id, std::nullopt);
  if (id == nullptr || !id->pending) return;
  Pending& p = *id->pending;
  p.timer = 0;
  if (p.retries_left > 0) {
    --p.retries_left;
    ++p.attempt;
    env_.record_fields(dev_.host, label(local_id), "cm_retry",
                       {{"msg", cm_msg_name(p.msg.type)},
                        {"attempt", p.attempt},
                        {"timeout_ms", p.timeout_ms},
                        {"retries_left", p.retries_left}});
    transmit(id->remote_host, p.msg, label(local_id), p.attempt);
    arm_timer(*id);
    return;
  }
  env_.record_fields(
      dev_.host, label(local_id), "cm_timeout",
      {{"msg", cm_msg_name(p.msg.type)}, {"attempts", p.attempt}, {"timeout_ms", p.timeout_ms}});
  id->pending.reset();
  process_send_error(*id);
}

// cm_process_send_error: the answer never came (IB_WC_RESP_TIMEOUT_ERR).
void IbCm::process_send_error(Id& id) {
  IbCmEvent ev;
  switch (id.state) {
    case IbCmState::REQ_SENT:
    case IbCmState::MRA_REQ_RCVD:
      reset_to_idle(id);
      ev.type = IbCmEventType::REQ_ERROR;
      break;
    case IbCmState::REP_SENT:
    case IbCmState::MRA_REP_RCVD:
      reset_to_idle(id);
      ev.type = IbCmEventType::REP_ERROR;
      break;
    case IbCmState::DREQ_SENT:
      enter_timewait(id);
      ev.type = IbCmEventType::DREQ_ERROR;
      break;
    default:
      return;  // the state moved on since the send: discarded
  }
  deliver(id.local_id, ev);
}

void IbCm::reset_to_idle(Id& id) {
  set_state(id, IbCmState::IDLE);
  remove_remote(id);
}

// cm_enter_timewait: TIMEWAIT for cm_convert_to_ms(av.timeout), then IDLE and TIMEWAIT_EXIT.
void IbCm::enter_timewait(Id& id) {
  cancel_mad(id);
  set_state(id, IbCmState::TIMEWAIT);
  remove_remote(id);
  const int64_t wait_ms = cm_convert_to_ms(id.av_timeout);
  env_.record_fields(dev_.host, label(id.local_id), "cm_timewait",
                     {{"av_timeout", id.av_timeout}, {"wait_ms", wait_ms}});
  env_.runtime.cancel(id.timewait_timer);
  const uint32_t local_id = id.local_id;
  const uint64_t epoch = epoch_;
  id.timewait_timer = env_.runtime.schedule_after(
      kernel_delay_ns(wait_ms), [this, local_id, epoch] { on_timewait_expired(local_id, epoch); });
}

void IbCm::on_timewait_expired(uint32_t local_id, uint64_t epoch) {
  if (epoch != epoch_) return;
  Id* id = find(local_id, std::nullopt);
  if (id == nullptr) return;  // destroyed during TIMEWAIT: no event (cm_timewait_handler)
  id->timewait_timer = 0;
  if (id->state != IbCmState::TIMEWAIT) return;
  set_state(*id, IbCmState::IDLE);
  IbCmEvent ev;
  ev.type = IbCmEventType::TIMEWAIT_EXIT;
  deliver(local_id, ev);
}

void IbCm::insert_remote(Id& id) {
  remote_id_table_[{id.remote_id, id.remote_ca_guid}] = id.local_id;
  remote_qp_table_[{id.remote_qpn, id.remote_ca_guid}] = id.local_id;
  id.in_remote_tables = true;
}

void IbCm::remove_remote(Id& id) {
  if (!id.in_remote_tables) return;
  id.in_remote_tables = false;
  auto drop = [&](std::map<Key, uint32_t>& t, Key k) {
    auto it = t.find(k);
    if (it != t.end() && it->second == id.local_id) t.erase(it);
  };
  drop(remote_id_table_, {id.remote_id, id.remote_ca_guid});
  drop(remote_qp_table_, {id.remote_qpn, id.remote_ca_guid});
}

// cm_format_rej: REQ states answer a REQ, REP states a REP, the rest OTHER.
CmMsg IbCm::rej_for(const Id& id, int reason, const std::vector<uint8_t>& private_data) const {
  CmMsg m;
  m.type = CmMsgType::REJ;
  m.reason = reason;
  m.private_data = private_data;
  m.local_ca_guid = dev_.caps.node_guid;  // the ARI of REJ TIMEOUT (cm_destroy_id)
  switch (id.state) {
    case IbCmState::REQ_RCVD:
    case IbCmState::MRA_REQ_SENT:
      m.msg_rejected = CmMsgResponse::REQ;
      break;
    case IbCmState::REP_RCVD:
    case IbCmState::MRA_REP_SENT:
      m.msg_rejected = CmMsgResponse::REP;
      break;
    default:
      m.msg_rejected = CmMsgResponse::OTHER;
      break;
  }
  return m;
}

}  // namespace rdmalab::model
