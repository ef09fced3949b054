// rdma_cm over the iWARP CM: cma_connect_iw, cma_accept_iw, iw_cm_disconnect with abrupt = 0,
// and the event mapping of cma_iw_handler / iw_conn_req_handler (semantics.md B and F).
#include "model/cm_iw.h"
#include "model/cm_rdma.h"
#include "model/device.h"
#include "model/process.h"
#include "model/qp.h"

namespace rdmalab::model {
namespace {

QpCore* core_of(const std::shared_ptr<Qp>& qp) {
  auto* m = dynamic_cast<ModelQp*>(qp.get());
  return m ? m->core().get() : nullptr;
}

}  // namespace

IwCm& ModelCmId::iw() const {
  return *ch_.dev().iw_cm;
}

std::function<void(const IwCmEvent&)> ModelCmId::iw_handler() {
  std::weak_ptr<ModelCmId> weak = shared_from_this();
  return [weak](const IwCmEvent& ev) {
    if (auto self = weak.lock(); self && self->st_.live()) self->on_iw_event(ev);
  };
}

void ModelCmId::iw_listen() {
  iw_id_ = iw().create_id(iw_handler());
  try {
    iw().listen(iw_id_, port_);
  } catch (const Error&) {
    iw().destroy_id(iw_id_);
    iw_id_ = 0;
    throw Error("rdma_listen", EADDRINUSE, "port " + std::to_string(port_) + " in use");
  }
}

// cma_modify_qp_rtr on iWARP takes only STATE and ACCESS_FLAGS (iw_cm_init_qp_attr); the
// provider moves the QP to RTS when the connection is made.
void ModelCmId::iw_qp_rtr() {
  QpAttr a;
  a.qp_access_flags = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
  modify_qp(QpState::RTR, a, QP_STATE | QP_ACCESS_FLAGS);
}

void ModelCmId::iw_connect() {
  iw_qp_rtr();
  iw_id_ = iw().create_id(iw_handler());
  try {
    iw().connect(iw_id_, dst_host_, port_, core_of(qp_), param_.private_data);
  } catch (const Error& e) {
    // cma_connect_iw: iw_destroy_cm_id; rdma_connect_locked: back to ROUTE_RESOLVED (Q6).
    iw().destroy_id(iw_id_);
    iw_id_ = 0;
    set_state(RdmaCmState::ROUTE_RESOLVED);
    throw Error("rdma_connect", e.err(), e.detail());
  }
}

void ModelCmId::iw_accept() {
  iw_qp_rtr();
  try {
    iw().accept(iw_id_, core_of(qp_), param_.private_data);
  } catch (const Error& e) {
    throw Error("rdma_accept", e.err(), e.detail());
  }
}

void ModelCmId::iw_reject() {
  try {
    iw().reject(iw_id_, {});
  } catch (const Error& e) {
    throw Error("rdma_reject", e.err(), e.detail());
  }
}

// rdma_disconnect: librdmacm moves an iWARP QP to SQD (ucma_shutdown), the kernel calls
// iw_cm_disconnect(id, 0), which does the same through the CM.
void ModelCmId::iw_disconnect() {
  if (!iw_id_) throw Error("rdma_disconnect", EINVAL, st_.label + " has no connection");
  try {
    iw().disconnect(iw_id_, false);
  } catch (const Error& e) {
    throw Error("rdma_disconnect", e.err(), e.detail());
  }
}

// cma's state is DESTROYING first: a CONNECT_REPLY while iw_destroy_cm_id waits is ignored.
void ModelCmId::iw_destroy(std::optional<TimeNs> deadline_ns) {
  if (iw_id_) iw().destroy_id(iw_id_, deadline_ns);
}

// cma_iw_handler (events only in CONNECT) and iw_conn_req_handler on the listener.
void ModelCmId::on_iw_event(const IwCmEvent& ev) {
  if (ev.type == IwCmEventType::CONNECT_REQUEST) return on_iw_req(ev);
  if (state_ != RdmaCmState::CONNECT) {
    env().record_fields(st_.host, st_.label, "cm_event_ignored",
                        {{"iw_event", to_string(ev.type)}, {"state", to_string(state_)}});
    return;
  }
  switch (ev.type) {
    case IwCmEventType::CLOSE:
      return report(CmEventType::DISCONNECTED, ev.status);
    case IwCmEventType::CONNECT_REPLY:
      switch (ev.status) {
        case 0:
          return report(CmEventType::ESTABLISHED, 0, ev.private_data);
        case -ECONNRESET:
        case -ECONNREFUSED:
          qp_to_err();  // librdmacm moves the QP to ERR on REJECTED
          return report(CmEventType::REJECTED, ev.status, ev.private_data);
        case -ETIMEDOUT:
          return report(CmEventType::UNREACHABLE, ev.status);
        default:
          return report(CmEventType::CONNECT_ERROR, ev.status);
      }
    case IwCmEventType::ESTABLISHED:
      return report(CmEventType::ESTABLISHED, 0);
    default:
      return;
  }
}

void ModelCmId::on_iw_req(const IwCmEvent& ev) {
  if (state_ != RdmaCmState::LISTEN) return iw().destroy_id(ev.id);
  if (ch_.unread_connect_requests(st_.id) >= static_cast<size_t>(backlog_)) {
    env().record_fields(st_.host, st_.label, "cm_backlog_full", {{"backlog", backlog_}});
    return iw().destroy_id(ev.id);  // rejected on the caller's behalf
  }
  auto conn = ch_.adopt_passive();
  conn->ctx_ = ctx_;
  conn->iw_id_ = ev.id;
  conn->port_ = port_;
  conn->peer_qpn_ = ev.remote_qpn;
  conn->peer_host_ = ev.remote_host;
  conn->state_ = RdmaCmState::CONNECT;
  env().record_fields(st_.host, conn->label(), "cm_create",
                      {{"layer", "rdma_cm"},
                       {"listen_id", st_.id},
                       {"peer", ev.remote_host},
                       {"peer_qpn", ev.remote_qpn}});
  iw().set_handler(ev.id, conn->iw_handler());
  report(CmEventType::CONNECT_REQUEST, 0, ev.private_data, st_.id, conn->id());
}

}  // namespace rdmalab::model
