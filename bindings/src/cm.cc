// rdma_cm (cm.h) and the connection helpers of core/stack/connection.h. Every engine call
// releases the GIL (bind.h): a CM verb may hand the baton to the pump's threads, whose
// handlers call back into Python. Objects handed out are destroyed without the GIL.
#include "rdmalab/cm.h"
#include "bind.h"
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

  py::class_<CmEvent>(m, "CmEvent")
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

  py::class_<CmTiming>(m, "CmTiming")
      .def(py::init<>())
      .def_readwrite("cm_response_timeout", &CmTiming::cm_response_timeout)
      .def_readwrite("max_cm_retries", &CmTiming::max_cm_retries)
      .def_readwrite("packet_life_time", &CmTiming::packet_life_time);

  py::class_<ConnParam>(m, "ConnParam")
      .def(py::init<>())
      .def_property(
          "private_data", [](const ConnParam& p) { return to_bytes(p.private_data); },
          [](ConnParam& p, const py::bytes& b) { p.private_data = from_bytes(b); })
      .def_readwrite("responder_resources", &ConnParam::responder_resources)
      .def_readwrite("initiator_depth", &ConnParam::initiator_depth)
      .def_readwrite("retry_count", &ConnParam::retry_count)
      .def_readwrite("rnr_retry_count", &ConnParam::rnr_retry_count);

  py::class_<CmEventRecord>(m, "CmEventRecord")
      .def_readonly("event", &CmEventRecord::event)
      .def_readonly("read_ns", &CmEventRecord::read_ns);
}

void bind_cm_objects(py::module_& m) {
  const auto child = py::keep_alive<0, 1>();
  py::class_<CmId, Object, std::shared_ptr<CmId>>(m, "CmId")
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

  py::class_<CmEventChannel, Object, std::shared_ptr<CmEventChannel>>(m, "CmEventChannel")
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
  py::class_<CmEndpointSpec>(m, "CmEndpointSpec")
      .def(py::init<>())
      .def_readwrite("dst", &CmEndpointSpec::dst)
      .def_readwrite("port", &CmEndpointSpec::port)
      .def_readwrite("cap", &CmEndpointSpec::cap)
      .def_readwrite("cqe", &CmEndpointSpec::cqe)
      .def_readwrite("param", &CmEndpointSpec::param)
      .def_readwrite("timing", &CmEndpointSpec::timing)
      .def_readwrite("resolve_timeout_ns", &CmEndpointSpec::resolve_timeout_ns);

  py::class_<CmConnection>(m, "CmConnection")
      .def(py::init([](std::shared_ptr<CmId> id, std::shared_ptr<Pd> pd, std::shared_ptr<Cq> cq,
                       std::shared_ptr<Qp> qp) {
             return CmConnection{std::move(id), std::move(pd), std::move(cq), std::move(qp)};
           }),
           arg("id"), arg("pd") = nullptr, arg("cq") = nullptr, arg("qp") = nullptr)
      .def_property_readonly("id", member(&CmConnection::id))
      .def_property_readonly("pd", member(&CmConnection::pd))
      .def_property_readonly("cq", member(&CmConnection::cq))
      .def_property_readonly("qp", member(&CmConnection::qp));

  m.def("cm_listen", &cm_listen, arg("pump"), arg("port"), arg("backlog") = 16, kRelease);
  m.def("cm_connect", &cm_connect, arg("pump"), arg("spec"), arg("deadline_ns"), kRelease);
  m.def("cm_accept", &cm_accept, arg("pump"), arg("id"), arg("spec"), kRelease);
  m.def("cm_close", &cm_close, arg("pump"), arg("conn"), arg("deadline_ns"), kRelease);
  m.def("cm_event_names", &event_names, arg("events"));
}

void bind_pump(py::module_& m) {
  py::class_<CmPumpStats>(m, "CmPumpStats")
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
  py::class_<CmEventPump, std::shared_ptr<CmEventPump>>(m, "CmEventPump")
      .def(py::init([](const std::shared_ptr<Lab>& lab, std::shared_ptr<CmEventChannel> channel,
                       const std::string& host, int workers) {
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
}

}  // namespace rdmalab::bindings
