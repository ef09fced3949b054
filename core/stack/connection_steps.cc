// The lifecycle helpers of connection.h: librdmacm's connect, accept and teardown sequences
// over the pump, each wait a named sync point.
#include <exception>
#include <functional>

#include "rdmalab/error.h"
#include "stack/connection.h"

namespace rdmalab::stack {

namespace {

std::string states_of(const CmId& id) {
  try {
    return id.cm_state() + "/" + id.protocol_state();
  } catch (const Error& e) {
    return "?(" + e.verb() + " errno " + std::to_string(e.err()) + ")";
  }
}

// The errno an unwanted event stands for: its own negative status, ECONNREFUSED for a
// REJECTED carrying an IB REJ reason, EPROTO otherwise.
int event_errno(const CmEvent& ev) {
  if (ev.status < 0) return -ev.status;
  return ev.event == CmEventType::REJECTED ? ECONNREFUSED : EPROTO;
}

CmEvent await_event(CmEventPump& pump, CmId& id, CmEventType type,
                    const std::vector<CmEventType>& fail_on, TimeNs deadline_ns,
                    const std::string& side, const std::string& verb) {
  std::vector<CmEventType> types{type};
  for (auto t : fail_on) {
    if (t != type) types.push_back(t);
  }
  auto r = pump.wait_first(id.id(), types, deadline_ns);
  if (!r) {
    throw DeadlineExceeded(verb, side + " " + id.label() + " stuck in " + states_of(id) +
                                     " waiting for " + std::string(to_string(type)) +
                                     " (events: " + event_names(pump.events(id.id())) + ")");
  }
  if (r->event.event != type) {
    throw Error(verb, event_errno(r->event),
                side + " " + id.label() + ": " + std::string(to_string(r->event.event)) +
                    " (status " + std::to_string(r->event.status) + ") instead of " +
                    std::string(to_string(type)));
  }
  return r->event;
}

// Creates the PD, CQ and RC QP of a connection on the id's device.
void create_qp_on(CmConnection& c, const CmEndpointSpec& spec, const char* verb) {
  auto ctx = c.id->context();
  if (!ctx) throw Error(verb, EINVAL, c.id->label() + " has no device (address not resolved)");
  c.pd = ctx->alloc_pd();
  c.cq = ctx->create_cq(spec.cqe);
  QpInitAttr attr;
  attr.qp_type = QpType::RC;
  attr.pd = c.pd;
  attr.send_cq = c.cq;
  attr.recv_cq = c.cq;
  attr.cap = spec.cap;
  c.qp = c.id->create_qp(*c.pd, attr);
}

// Undoes what a failed helper made (verbs objects; the id too when `with_id`).
void discard(CmEventPump& pump, CmConnection& c, bool with_id) {
  if (!with_id) c.id = nullptr;
  try {
    cm_close(pump, c, pump.runtime().now_ns() + kNsPerSec);
  } catch (const Error&) {  // NOLINT(bugprone-empty-catch): the first error is what matters
  }
}

}  // namespace

std::string event_names(const std::vector<CmEventRecord>& events) {
  std::string out;
  for (const auto& r : events) {
    if (!out.empty()) out += ", ";
    out += to_string(r.event.event);
    if (r.event.status != 0) out += "(" + std::to_string(r.event.status) + ")";
  }
  return out.empty() ? "none" : out;
}

std::shared_ptr<CmId> cm_listen(CmEventPump& pump, uint16_t port, int backlog) {
  auto id = pump.channel().create_id();
  try {
    id->listen(port, backlog);
  } catch (const Error&) {
    CmConnection c{id, nullptr, nullptr, nullptr};
    discard(pump, c, true);
    throw;
  }
  return id;
}

CmConnection cm_connect(CmEventPump& pump, const CmEndpointSpec& spec, TimeNs deadline_ns) {
  CmConnection c;
  c.id = pump.channel().create_id();
  const std::string side = "active side";
  try {
    if (spec.timing) c.id->set_timing(*spec.timing);
    c.id->resolve_addr(spec.dst, spec.port, spec.resolve_timeout_ns);
    await_event(pump, *c.id, CmEventType::ADDR_RESOLVED, {CmEventType::ADDR_ERROR}, deadline_ns,
                side, "rdma_resolve_addr");
    c.id->resolve_route(spec.resolve_timeout_ns);
    await_event(pump, *c.id, CmEventType::ROUTE_RESOLVED, {CmEventType::ROUTE_ERROR}, deadline_ns,
                side, "rdma_resolve_route");
    create_qp_on(c, spec, "rdma_create_qp");
    c.id->connect(spec.param);
  } catch (const Error&) {
    discard(pump, c, true);
    throw;
  }
  return c;
}

CmConnection cm_accept(CmEventPump& pump, std::shared_ptr<CmId> id, const CmEndpointSpec& spec) {
  if (!id) throw Error("rdma_accept", EINVAL, "no id");
  check_owner(pump.channel(), *id, "rdma_accept", "cm_id");
  CmConnection c{std::move(id), nullptr, nullptr, nullptr};
  c.qp = c.id->qp();
  const bool made_qp = !c.qp;
  try {
    if (made_qp) create_qp_on(c, spec, "rdma_accept");
    if (spec.timing) c.id->set_timing(*spec.timing);
    c.id->accept(spec.param);
  } catch (const Error&) {
    if (made_qp) discard(pump, c, false);  // the id stays the caller's (reject or destroy it)
    throw;
  }
  return c;
}

CmEvent cm_await(CmEventPump& pump, CmId& id, CmEventType type, TimeNs deadline_ns,
                 const std::string& side, const std::vector<CmEventType>& fail_on) {
  check_owner(pump.channel(), id, "cm_await", "cm_id");  // its events come to its own pump
  return await_event(pump, id, type, fail_on, deadline_ns, side, "rdma_get_cm_event");
}

void cm_close(CmEventPump& pump, CmConnection& conn, TimeNs deadline_ns) {
  // The id of this pump's channel; its CQ and PD of its QP's context.
  if (conn.id) check_owner(pump.channel(), *conn.id, "cm_close", "cm_id");
  if (conn.qp && conn.cq) check_owner(*conn.qp, *conn.cq, "cm_close", "cq");
  if (conn.qp && conn.pd) check_owner(*conn.qp, *conn.pd, "cm_close", "pd");
  std::exception_ptr first;  // keeps DeadlineExceeded a DeadlineExceeded
  auto step = [&first](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error&) {
      if (!first) first = std::current_exception();
    }
  };
  if (conn.qp && !conn.qp->destroyed()) step([&] { conn.qp->destroy(deadline_ns); });
  if (conn.cq && !conn.cq->destroyed()) step([&] { conn.cq->destroy(deadline_ns); });
  if (conn.id && !conn.id->destroyed()) step([&] { pump.destroy_id(*conn.id, deadline_ns); });
  if (conn.pd && !conn.pd->destroyed()) step([&] { conn.pd->dealloc(); });
  if (first) std::rethrow_exception(first);
}

}  // namespace rdmalab::stack
