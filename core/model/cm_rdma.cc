// The rdma_cm id verbs (librdmacm cma.c / ucma.c): address and route resolution, listen,
// rdma_create_qp, connect/accept/reject/disconnect, destroy. Transport specifics live in
// cm_rdma_ib.cc and cm_rdma_iw.cc.
#include <sstream>

#include "model/cm_iw.h"
#include "model/cm_rdma.h"
#include "model/device.h"
#include "model/process.h"

namespace rdmalab::model {

const char* to_string(RdmaCmState s) {
  static const char* const names[] = {
      "IDLE",       "ADDR_QUERY", "ADDR_RESOLVED", "ROUTE_QUERY",    "ROUTE_RESOLVED", "CONNECT",
      "DISCONNECT", "ADDR_BOUND", "LISTEN",        "DEVICE_REMOVAL", "DESTROYING"};
  return names[static_cast<int>(s)];
}

ModelCmId::ModelCmId(ModelCmEventChannel& ch) : ModelObject(ch.state_of(), "cm_id"), ch_(ch) {
  // cma.c: the starting PSN is random, 24 bits.
  psn_ = static_cast<uint32_t>(env().runtime.rng().next() & 0xffffff);
}

bool ModelCmId::iwarp() const {
  return ch_.dev().caps.transport == Transport::iWARP;
}

std::string ModelCmId::protocol_state() const {
  if (iwarp()) return iw_id_ ? to_string(ch_.dev().iw_cm->state(iw_id_)) : "IDLE";
  return ib_id_ ? to_string(ch_.dev().ib_cm->state(ib_id_)) : "IDLE";
}

void ModelCmId::set_state(RdmaCmState to) {
  if (state_ == to) return;
  env().record_fields(st_.host, st_.label, "cm_state",
                      {{"layer", "rdma_cm"}, {"from", to_string(state_)}, {"to", to_string(to)}});
  state_ = to;
}

// cma_comp_exch: the transition happens only from the expected state.
bool ModelCmId::comp_exch(RdmaCmState from, RdmaCmState to) {
  if (state_ != from) return false;
  set_state(to);
  return true;
}

void ModelCmId::require(const std::string& verb, std::initializer_list<RdmaCmState> states) const {
  for (RdmaCmState s : states) {
    if (state_ == s) return;
  }
  throw Error(verb, EINVAL, st_.label + " in " + to_string(state_));
}

void ModelCmId::report(CmEventType type, int status, std::vector<uint8_t> private_data,
                       uint64_t owner, uint64_t new_id) {
  // MUTATION(missing_disconnected): the passive closer (its user never called rdma_disconnect)
  // is not told, on IB, RoCE and iWARP alike.
  if (type == CmEventType::DISCONNECTED && !disconnect_called_ &&
      env().mutated(Mutation::kMissingDisconnected)) {
    return;
  }
  CmEvent ev;
  ev.event = type;
  ev.status = status;
  ev.id = new_id ? new_id : st_.id;
  ev.listen_id = new_id ? st_.id : 0;
  ev.private_data = std::move(private_data);
  env().record_fields(st_.host, "cm_id:" + std::to_string(ev.id), "cm_event",
                      {{"event", to_string(type)},
                       {"status", status},
                       {"listen_id", ev.listen_id},
                       {"protocol_state", new_id ? std::string() : protocol_state()}});
  ch_.queue(ev, owner ? owner : st_.id);
}

// librdmacm opens the device contexts itself: one per process (model), shared by its ids.
void ModelCmId::bind_device() {
  if (!ctx_) ctx_ = ch_.proc().cm_context();
}

void ModelCmId::resolve_addr(const std::string& dst, uint16_t port, TimeNs timeout_ns) {
  enter("rdma_resolve_addr");
  require("rdma_resolve_addr", {RdmaCmState::IDLE, RdmaCmState::ADDR_BOUND});
  (void)timeout_ns;  // the model answers within kCmResolveNs
  dst_host_ = dst;
  port_ = port;
  set_state(RdmaCmState::ADDR_QUERY);
  env().record_fields(st_.host, st_.label, "verb",
                      {{"verb", "rdma_resolve_addr"}, {"dst", dst}, {"port", port}});
  std::weak_ptr<ModelCmId> weak = shared_from_this();
  env().runtime.schedule_after(kCmResolveNs, [weak] {
    auto self = weak.lock();
    if (!self || !self->st_.live() || self->state_ != RdmaCmState::ADDR_QUERY) return;
    Device* d = self->env().device(self->dst_host_);
    if (d == nullptr) {  // (model) errno unverified (semantics.md B)
      self->set_state(RdmaCmState::ADDR_BOUND);
      return self->report(CmEventType::ADDR_ERROR, -EHOSTUNREACH);
    }
    self->dgid_ = d->gid;
    self->bind_device();
    self->set_state(RdmaCmState::ADDR_RESOLVED);
    self->report(CmEventType::ADDR_RESOLVED, 0);
  });
}

void ModelCmId::resolve_route(TimeNs timeout_ns) {
  enter("rdma_resolve_route");
  require("rdma_resolve_route", {RdmaCmState::ADDR_RESOLVED});
  (void)timeout_ns;
  set_state(RdmaCmState::ROUTE_QUERY);
  env().record_fields(st_.host, st_.label, "verb", {{"verb", "rdma_resolve_route"}});
  std::weak_ptr<ModelCmId> weak = shared_from_this();
  env().runtime.schedule_after(kCmResolveNs, [weak] {
    auto self = weak.lock();
    if (!self || !self->st_.live() || self->state_ != RdmaCmState::ROUTE_QUERY) return;
    self->set_state(RdmaCmState::ROUTE_RESOLVED);
    self->report(CmEventType::ROUTE_RESOLVED, 0);
  });
}

void ModelCmId::listen(uint16_t port, int backlog) {
  enter("rdma_listen");
  require("rdma_listen", {RdmaCmState::IDLE, RdmaCmState::ADDR_BOUND});
  bind_device();
  port_ = port;
  backlog_ = backlog > 0 ? backlog : 1024;  // (model) librdmacm's default when 0
  if (iwarp()) {
    iw_listen();
  } else {
    ib_id_ = ib().create_id(ib_handler());
    try {
      ib().listen(ib_id_, cm_service_id(port));
    } catch (const Error& e) {
      ib().destroy_id(ib_id_);
      ib_id_ = 0;
      throw Error("rdma_listen", EADDRINUSE, "port " + std::to_string(port) + " in use");
    }
  }
  set_state(RdmaCmState::LISTEN);
  env().record_fields(st_.host, st_.label, "verb",
                      {{"verb", "rdma_listen"}, {"port", port}, {"backlog", backlog_}});
}

std::shared_ptr<Qp> ModelCmId::create_qp(Pd& pd, const QpInitAttr& attr_in) {
  const std::string verb = "rdma_create_qp";
  enter(verb);
  if (!ctx_) throw Error(verb, EINVAL, st_.label + " has no device yet");
  if (qp_) throw Error(verb, EINVAL, st_.label + " already has a QP");
  if (attr_in.qp_type != QpType::RC) throw Error(verb, EOPNOTSUPP, "model rdma_cm: RC only");
  check_owner(*ctx_, pd, verb, "pd");  // the id's device context: its PD and CQs only
  if (attr_in.send_cq) check_owner(*ctx_, *attr_in.send_cq, verb, "send_cq");
  if (attr_in.recv_cq) check_owner(*ctx_, *attr_in.recv_cq, verb, "recv_cq");
  if (attr_in.srq) check_owner(*ctx_, *attr_in.srq, verb, "srq");
  QpInitAttr a = attr_in;
  a.pd = std::shared_ptr<Pd>(std::shared_ptr<Pd>(), &pd);  // borrowed: create_qp keeps no ref
  if (!a.recv_cq) a.recv_cq = a.send_cq;
  auto qp = ctx_->create_qp(a);
  // ucma_init_qp / cma_init_qp_attr: RESET -> INIT at once.
  QpAttr init;
  init.qp_state = QpState::INIT;
  init.port_num = 1;
  init.qp_access_flags = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
  const uint32_t mask = iwarp() ? (QP_STATE | QP_ACCESS_FLAGS)
                                : (QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
  try {
    qp->modify(init, mask);
  } catch (...) {
    qp->destroy(0);
    throw;
  }
  qp_ = qp;
  env().record_fields(st_.host, st_.label, "verb", {{"verb", verb}, {"qp_num", qp->qp_num()}});
  return qp;
}

void ModelCmId::set_timing(const CmTiming& t) {
  enter("rdma_set_option");
  timing_ = t;
  env().record_fields(st_.host, st_.label, "verb",
                      {{"verb", "rdma_set_option"},
                       {"cm_response_timeout", t.cm_response_timeout},
                       {"max_cm_retries", t.max_cm_retries},
                       {"packet_life_time", t.packet_life_time}});
}

void ModelCmId::connect(const ConnParam& param) {
  enter("rdma_connect");
  require("rdma_connect", {RdmaCmState::ROUTE_RESOLVED});
  if (!qp_) throw Error("rdma_connect", EINVAL, st_.label + " has no QP (model)");
  param_ = param;
  env().record_fields(st_.host, st_.label, "verb",
                      {{"verb", "rdma_connect"}, {"dst", dst_host_}, {"port", port_}});
  set_state(RdmaCmState::CONNECT);
  if (iwarp()) return iw_connect();
  ib_connect();
}

void ModelCmId::accept(const ConnParam& param) {
  enter("rdma_accept");
  require("rdma_accept", {RdmaCmState::CONNECT});
  if (!qp_) throw Error("rdma_accept", EINVAL, st_.label + " has no QP (model)");
  param_ = param;
  env().record_fields(st_.host, st_.label, "verb", {{"verb", "rdma_accept"}});
  if (iwarp()) return iw_accept();
  ib_accept();
}

void ModelCmId::reject(const std::vector<uint8_t>& private_data) {
  enter("rdma_reject");
  env().record_fields(st_.host, st_.label, "verb", {{"verb", "rdma_reject"}});
  if (iwarp()) return iw_reject();
  if (!ib_id_) throw Error("rdma_reject", EINVAL, st_.label + " has no connection");
  try {
    ib().send_rej(ib_id_, REJ_CONSUMER_DEFINED, private_data);
  } catch (const Error& e) {
    throw Error("rdma_reject", e.err(), e.detail());
  }
}

void ModelCmId::disconnect() {
  enter("rdma_disconnect");
  env().record_fields(st_.host, st_.label, "verb", {{"verb", "rdma_disconnect"}});
  disconnect_called_ = true;
  if (iwarp()) return iw_disconnect();
  if (!ib_id_) throw Error("rdma_disconnect", EINVAL, st_.label + " has no connection");
  ib_disconnect();
}

QpAttr ModelCmId::rtr_attr(uint32_t dest_qpn, uint32_t rq_psn, uint8_t responder_resources) const {
  QpAttr a;
  a.ah_attr.dgid = peer_gid_;
  a.ah_attr.port_num = 1;
  a.path_mtu = 1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = responder_resources;
  a.min_rnr_timer = 0;  // ib_cm_init_qp_attr leaves it 0 for RC
  return a;
}

void ModelCmId::modify_qp(QpState to, const QpAttr& attr_in, uint32_t mask) {
  QpAttr a = attr_in;
  a.qp_state = to;
  qp_->modify(a, mask);
}

// cma_modify_qp_err.
void ModelCmId::qp_to_err() {
  if (!qp_ || qp_->destroyed() || qp_->state() == QpState::ERR) return;
  try {
    modify_qp(QpState::ERR, QpAttr{}, QP_STATE);
  } catch (const Error& e) {
    env().record_fields(st_.host, st_.label, "cm_qp_error",
                        {{"err", e.err()}, {"detail", e.detail()}});
  }
}

// rdma_destroy_id: wait (with a deadline) until every event read for this id was acked.
void ModelCmId::destroy(TimeNs deadline_ns) {
  enter("rdma_destroy_id");
  auto self = shared_from_this();
  // MUTATION(destroy_ignores_unacked): destroy does not wait for the acks of events read.
  const bool acked = env().mutated(Mutation::kDestroyIgnoresUnacked) ||
                     env().runtime.wait_until(
                         [this] { return !st_.live() || ch_.unacked(st_.id) == 0; }, deadline_ns);
  st_.check("rdma_destroy_id");
  if (!acked) {
    const uint64_t n = ch_.unacked(st_.id);
    env().record_fields(st_.host, st_.label, "verb",
                        {{"verb", "rdma_destroy_id"}, {"err", EBUSY}, {"unacked", n}});
    throw Error("rdma_destroy_id", EBUSY,
                st_.label + ": " + std::to_string(n) + " events read and not acked");
  }
  release(Release::kVerb, deadline_ns);
}

void ModelCmId::release(Release why, std::optional<TimeNs> deadline_ns) {
  if (!st_.live()) return;
  auto self = shared_from_this();
  set_state(RdmaCmState::DESTROYING);
  if (iwarp()) {
    iw_destroy(deadline_ns);
    if (!st_.live()) return;  // killed while iw_destroy_cm_id waited: ended there
  } else if (ib_id_) {
    ib().destroy_id(ib_id_);
  }
  st_.end(why, "rdma_destroy_id", {{"qp_num", qp_ ? qp_->qp_num() : 0}});
  ch_.forget(st_.id);  // after end(): events raised on the way out are not queued
}

std::string ModelCmId::dump() const {
  std::ostringstream out;
  out << "      " << st_.label << " rdma_cm " << to_string(state_) << " "
      << (iwarp() ? "iw_cm " : "ib_cm ") << protocol_state();
  if (qp_) out << " qpn " << qp_->qp_num();
  if (!dst_host_.empty()) out << " dst " << dst_host_;
  if (!peer_host_.empty()) out << " peer " << peer_host_;
  if (state_ == RdmaCmState::LISTEN) out << " port " << port_;
  out << "\n";
  return out.str();
}

}  // namespace rdmalab::model
