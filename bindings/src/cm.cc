// rdma_cm (cm.h) and the connection helpers of core/stack (connection.h, cm_pair.h). Every engine
// call releases the GIL (bind.h): a CM verb may hand the baton to the pump's threads, whose
// handlers call back into Python. Objects handed out are destroyed without the GIL.
#include "rdmalab/cm.h"

#include <tuple>

#include "bind.h"
#include "stack/cm_pair.h"
#include "stack/connection.h"

namespace rdmalab::bindings {

namespace {

using py::arg;
using namespace rdmalab::stack;  // NOLINT(google-build-using-namespace): names as in the header

py::bytes to_bytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size()};
}

std::vector<uint8_t> from_bytes(const py::bytes& b) {
  const std::string s = b;
  return {s.begin(), s.end()};
}

void bind_cm_values(py::module_& m) {
  bind_enum<CmEventType>(m, "CmEventType", static_cast<int>(CmEventType::TIMEWAIT_EXIT) + 1);
  m.attr("CM_REJ_REASON") = py::dict(
      py::arg("TIMEOUT") = +REJ_TIMEOUT, py::arg("INVALID_SERVICE_ID") = +REJ_INVALID_SERVICE_ID,
      py::arg("STALE_CONN") = +REJ_STALE_CONN, py::arg("CONSUMER_DEFINED") = +REJ_CONSUMER_DEFINED);

  Class<CmEvent>(m, "CmEvent")
      .def(py::init<>())
      .def_readwrite("event", &CmEvent::event)
      .def_readwrite("status", &CmEvent::status)
      .def_readwrite("id", &CmEvent::id)
      .def_readwrite("listen_id", &CmEvent::listen_id)
      .def_property(
          "private_data", [](const CmEvent& e) { return to_bytes(e.private_data); },
          [](CmEvent& e, const py::bytes& b) { e.private_data = from_bytes(b); })
      .def_readwrite("seq", &CmEvent::seq)
      // The spec name as a str: a Python enum object costs a registered instance and a hash.
      .def_property_readonly("event_name",
                             [](const CmEvent& e) { return std::string(to_string(e.event)); })
      .def("__repr__", [](const CmEvent& e) {
        return "<CmEvent " + std::string(to_string(e.event)) +
               " status=" + std::to_string(e.status) + " id=" + std::to_string(e.id) + ">";
      });

  Class<CmTiming>(m, "CmTiming")
      .verb("rdma_set_option")
      .def(py::init<>())
      .def_readwrite("cm_response_timeout", &CmTiming::cm_response_timeout)
      .def_readwrite("max_cm_retries", &CmTiming::max_cm_retries)
      .def_readwrite("packet_life_time", &CmTiming::packet_life_time);

  Class<ConnParam>(m, "ConnParam")
      .verb("rdma_connect")
      .def(py::init<>())
      .def_property(
          "private_data", [](const ConnParam& p) { return to_bytes(p.private_data); },
          [](ConnParam& p, const py::bytes& b) { p.private_data = from_bytes(b); })
      .def_readwrite("responder_resources", &ConnParam::responder_resources)
      .def_readwrite("initiator_depth", &ConnParam::initiator_depth)
      .def_readwrite("retry_count", &ConnParam::retry_count)
      .def_readwrite("rnr_retry_count", &ConnParam::rnr_retry_count);

  Class<CmEventRecord>(m, "CmEventRecord")
      .def_readonly("event", &CmEventRecord::event)
      .def_readonly("read_ns", &CmEventRecord::read_ns);
}

void bind_cm_objects(py::module_& m) {
  const auto child = py::keep_alive<0, 1>();
  Class<CmId, Object, std::shared_ptr<CmId>>(m, "CmId")
      .def_property_readonly("cm_state", py::cpp_function(&CmId::cm_state, kRelease))
      .def_property_readonly("protocol_state", py::cpp_function(&CmId::protocol_state, kRelease))
      .def("resolve_addr", &CmId::resolve_addr, arg("dst"), arg("port"), arg("timeout_ns"),
           kRelease)
      .def("resolve_route", &CmId::resolve_route, arg("timeout_ns"), kRelease)
      .def("listen", &CmId::listen, arg("port"), arg("backlog"), kRelease)
      .def(
          "context", [](const CmId& id) { return gil_free_delete(id.context()); }, kRelease, child)
      .def(
          "create_qp",
          [](CmId& id, Pd& pd, const QpInitAttr& attr) {
            return gil_free_delete(id.create_qp(pd, attr));
          },
          arg("pd"), arg("attr"), kRelease, child)
      .def(
          "qp", [](const CmId& id) { return gil_free_delete(id.qp()); }, kRelease, child)
      .def("set_timing", &CmId::set_timing, arg("timing"), kRelease)
      .def("connect", &CmId::connect, arg("param"), kRelease)
      .def("accept", &CmId::accept, arg("param"), kRelease)
      .def(
          "reject",
          [](CmId& id, const py::bytes& data) {
            auto bytes = from_bytes(data);
            py::gil_scoped_release release;
            id.reject(bytes);
          },
          arg("private_data"))
      .def("disconnect", &CmId::disconnect, kRelease)
      .def("destroy", &CmId::destroy, arg("deadline_ns"), kRelease);

  Class<CmEventChannel, Object, std::shared_ptr<CmEventChannel>>(m, "CmEventChannel")
      .def(
          "create_id", [](CmEventChannel& c) { return gil_free_delete(c.create_id()); }, kRelease,
          child)
      .def("get_event", &CmEventChannel::get_event, arg("deadline_ns"), kRelease)
      .def("ack_event", &CmEventChannel::ack_event, arg("event"), kRelease)
      .def(  // CmEventChannel::find_id; "id" is the engine id of the channel itself (Object)
          "cm_id",
          [](const CmEventChannel& c, uint64_t id_object) {
            return gil_free_delete(c.find_id(id_object));
          },
          arg("id_object"), kRelease, child)
      .def("destroy", &CmEventChannel::destroy, kRelease);
}

// The connection's objects, each wrapped for GIL-free destruction.
template <typename T>
auto member(std::shared_ptr<T> CmConnection::*field) {
  return [field](const CmConnection& c) { return gil_free_delete(c.*field); };
}

void bind_connection(py::module_& m) {
  Class<CmEndpointSpec>(m, "CmEndpointSpec")
      .verb("rdma_connect")
      .def(py::init<>())
      .def_readwrite("dst", &CmEndpointSpec::dst)
      .def_readwrite("port", &CmEndpointSpec::port)
      .def_readwrite("cap", &CmEndpointSpec::cap)
      .def_readwrite("cqe", &CmEndpointSpec::cqe)
      .def_readwrite("param", &CmEndpointSpec::param)
      .def_readwrite("timing", &CmEndpointSpec::timing)
      .def_readwrite("resolve_timeout_ns", &CmEndpointSpec::resolve_timeout_ns);

  Class<CmConnection>(m, "CmConnection")
      .def(py::init([](std::shared_ptr<CmId> id, std::shared_ptr<Pd> pd, std::shared_ptr<Cq> cq,
                       std::shared_ptr<Qp> qp) {
             return CmConnection{std::move(id), std::move(pd), std::move(cq), std::move(qp)};
           }),
           arg("id"), arg("pd") = nullptr, arg("cq") = nullptr, arg("qp") = nullptr)
      .def_property_readonly("id", member(&CmConnection::id))
      .def_property_readonly("pd", member(&CmConnection::pd))
      .def_property_readonly("cq", member(&CmConnection::cq))
      .def_property_readonly("qp", member(&CmConnection::qp));

  def_fn(m, "cm_listen", &cm_listen, arg("pump"), arg("port"), arg("backlog") = 16, kRelease);
  def_fn(m, "cm_connect", &cm_connect, arg("pump"), arg("spec"), arg("deadline_ns"), kRelease);
  def_fn(m, "cm_accept", &cm_accept, arg("pump"), arg("id"), arg("spec"), kRelease);
  def_fn(m, "cm_close", &cm_close, arg("pump"), arg("conn"), arg("deadline_ns"), kRelease);
  def_fn(m, "cm_event_names", &event_names, arg("events"));
}

// cm_channel_close's connections, as Python passes them: (id, pd, cq, qp).
using ConnParts = std::tuple<std::shared_ptr<CmId>, std::shared_ptr<Pd>, std::shared_ptr<Cq>,
                             std::shared_ptr<Qp>>;

// (id, context, pd, cq, qp) of a side cm_pair_up made, as CmId._adopt takes them.
py::object side_parts(const std::optional<CmConnection>& c, const std::shared_ptr<Context>& ctx) {
  if (!c) return py::none();
  py::object id = py::cast(gil_free_delete(c->id));
  py::object context = py::cast(gil_free_delete(ctx));
  py::detail::keep_alive_impl(context, id);  // as CmId.context() (keep_alive<0, 1>)
  return py::make_tuple(id, context, py::cast(gil_free_delete(c->pd)),
                        py::cast(gil_free_delete(c->cq)), py::cast(gil_free_delete(c->qp)));
}

void bind_pair(py::module_& m) {
  auto conn = [](std::optional<CmConnection> CmPairUp::*field) {
    return [field](const CmPairUp& s) -> py::object {
      const auto& c = s.*field;
      if (!c) return py::none();
      return py::cast(CmConnection{gil_free_delete(c->id), gil_free_delete(c->pd),
                                   gil_free_delete(c->cq), gil_free_delete(c->qp)});
    };
  };
  Class<CmPairUp>(m, "CmPairUp")
      .def(py::init<>())
      .def_property_readonly("listener",
                             [](const CmPairUp& s) { return gil_free_delete(s.listener); })
      .def_property_readonly("client", conn(&CmPairUp::client))
      .def_readonly("request", &CmPairUp::request)
      .def_readonly("request_ns", &CmPairUp::request_ns)
      .def_property_readonly("server", conn(&CmPairUp::server))
      .def_property_readonly("client_parts",
                             [](const CmPairUp& s) { return side_parts(s.client, s.client_ctx); })
      .def_property_readonly("server_parts",
                             [](const CmPairUp& s) { return side_parts(s.server, s.server_ctx); })
      .def_readonly("client_established", &CmPairUp::client_established)
      .def_readonly("server_established", &CmPairUp::server_established)
      .def_readonly("client_waited", &CmPairUp::client_waited)
      .def_readonly("server_waited", &CmPairUp::server_waited)
      .def_readonly("ok", &CmPairUp::ok);
  Class<CmPairDown>(m, "CmPairDown")
      .def(py::init<>())
      .def_readonly("server_disconnected", &CmPairDown::server_disconnected)
      .def_readonly("client_disconnected", &CmPairDown::client_disconnected)
      .def_readonly("server_waited", &CmPairDown::server_waited)
      .def_readonly("client_waited", &CmPairDown::client_waited)
      .def_readonly("ok", &CmPairDown::ok);
  def_fn(
      m, "cm_pair_up",
      [](CmPairUp& st, Lab& lab, CmEventPump& server, CmEventPump& client, uint16_t port,
         const std::string& dst, std::optional<CmEndpointSpec> connect_spec,
         std::optional<CmEndpointSpec> accept_spec, TimeNs timeout_ns,
         const std::vector<CmEventType>& established) {
        cm_pair_up(st, lab.runtime(), server, client, port, dst, std::move(connect_spec),
                   std::move(accept_spec), timeout_ns, established);
      },
      arg("state"), arg("lab"), arg("server"), arg("client"), arg("port"), arg("dst"),
      arg("connect_spec"), arg("accept_spec"), arg("timeout_ns"), arg("established"), kRelease);
  Class<CmChannelClose>(m, "CmChannelClose")
      .def(py::init<>())
      .def_readonly("stopped", &CmChannelClose::stopped);
  def_fn(
      m, "cm_channel_close",
      [](CmChannelClose& st, Lab& lab, CmEventPump& pump, const std::vector<ConnParts>& parts,
         const std::vector<uint64_t>& listeners, TimeNs timeout_ns) {
        std::vector<CmConnection> conns;
        conns.reserve(parts.size());
        for (const auto& [id, pd, cq, qp] : parts) conns.push_back(CmConnection{id, pd, cq, qp});
        return cm_channel_close(st, lab.runtime(), pump, conns, listeners, timeout_ns);
      },
      arg("state"), arg("lab"), arg("pump"), arg("conns"), arg("listeners"), arg("timeout_ns"),
      kRelease);
  def_fn(
      m, "cm_pair_disconnect",
      [](CmPairDown& st, Lab& lab, CmEventPump& client, CmId& client_id, CmEventPump& server,
         CmId& server_id, TimeNs timeout_ns, const std::vector<CmEventType>& disconnected) {
        cm_pair_disconnect(st, lab.runtime(), client, client_id, server, server_id, timeout_ns,
                           disconnected);
      },
      arg("state"), arg("lab"), arg("client"), arg("client_id"), arg("server"), arg("server_id"),
      arg("timeout_ns"), arg("disconnected"), kRelease);
}

void bind_pump(py::module_& m) {
  Class<CmPumpStats>(m, "CmPumpStats")
      .def_readonly("read", &CmPumpStats::read)
      .def_readonly("delivered", &CmPumpStats::delivered)
      .def_readonly("unhandled", &CmPumpStats::unhandled)
      .def_readonly("dropped", &CmPumpStats::dropped)
      .def_readonly("handler_errors", &CmPumpStats::handler_errors)
      .def_readonly("max_concurrent_per_id", &CmPumpStats::max_concurrent_per_id);

  // A raising Python handler is parked (bind.h) and counts in handler_errors.
  auto handler = [](const py::object& fn, const std::string& where) {
    auto cb = make_callback(fn, where, {});
    if (!cb) throw py::type_error(where + ": handler must be callable");
    return CmHandler([cb](const CmEvent& ev) { cb->call_or_throw(ev); });
  };
  Class<CmEventPump, std::shared_ptr<CmEventPump>>(m, "CmEventPump")
      .def(py::init([](const std::shared_ptr<Lab>& lab, std::shared_ptr<CmEventChannel> channel,
                       const std::string& host, const IntArg<int>& workers_arg) {
             const int workers = int_of(workers_arg, "CmEventPump", "workers");
             py::gil_scoped_release release;
             return gil_free_delete(std::make_shared<CmEventPump>(
                 lab->runtime(), std::move(channel), &lab->history(), host, workers));
           }),
           arg("lab"), arg("channel"), arg("host") = "", arg("workers") = 2, py::keep_alive<1, 2>())
      .def("start", &CmEventPump::start, kRelease)
      .def("stop", &CmEventPump::stop, arg("deadline_ns"), kRelease)
      .def_property_readonly("running", py::cpp_function(&CmEventPump::running, kRelease))
      .def_property_readonly("channel",
                             [](const CmEventPump& p) { return gil_free_delete(p.channel_ptr()); })
      .def(
          "watch",
          [handler](CmEventPump& p, const CmId& id, const py::object& fn) {
            CmHandler h = handler(fn, "CM handler of " + id.label());
            py::gil_scoped_release release;
            p.watch(id, std::move(h));
          },
          arg("id"), arg("handler"))
      .def(
          "set_default_handler",
          [handler](CmEventPump& p, const py::object& fn) {
            CmHandler h = fn.is_none() ? CmHandler{} : handler(fn, "default CM handler");
            py::gil_scoped_release release;
            p.set_default_handler(std::move(h));
          },
          arg("handler"))
      .def("events", &CmEventPump::events, arg("id_object"), kRelease)
      .def("wait_event", &CmEventPump::wait_event, arg("id_object"), arg("type"),
           arg("deadline_ns"), arg("min_count") = 1, kRelease)
      .def("wait_first", &CmEventPump::wait_first, arg("id_object"), arg("types"),
           arg("deadline_ns"), arg("from_index") = 0, kRelease)
      .def("next_connect_request", &CmEventPump::next_connect_request, arg("listen_id"),
           arg("deadline_ns"), kRelease)
      .def("destroy_id", &CmEventPump::destroy_id, arg("id"), arg("deadline_ns"), kRelease)
      .def("pause_reading", &CmEventPump::pause_reading, arg("deadline_ns"), kRelease)
      .def("resume_reading", &CmEventPump::resume_reading, kRelease)
      .def("hold_acks", &CmEventPump::hold_acks, arg("id"), kRelease)
      .def("release_acks", &CmEventPump::release_acks, arg("id_object"), kRelease)
      .def("held_acks", &CmEventPump::held_acks, arg("id_object"), kRelease)
      .def("stats", &CmEventPump::stats, kRelease);
}

}  // namespace

void bind_cm(py::module_& m) {
  bind_cm_values(m);
  bind_cm_objects(m);
  bind_connection(m);
  bind_pump(m);
  bind_pair(m);
}

}  // namespace rdmalab::bindings
