// The engine's Prometheus metrics (core/metrics): the registry fed by a lab's history, the pull
// endpoint, the Pushgateway push and the device counters. Wrapping only; the Python API is
// rdmalab.run.metrics.
#include "metrics/metrics.h"
#include "bind.h"
#include "metrics/device_counters.h"

namespace rdmalab::bindings {

namespace {

using metrics::DeviceCounter;
using metrics::Metrics;
using metrics::Source;
using py::arg;

void bind_device_counters(py::module_& m) {
  Class<DeviceCounter>(m, "DeviceCounter")
      .def(py::init<>())
      .def(py::init([](std::string device, const IntArg<uint32_t>& port, std::string source,
                       std::string name, const IntArg<uint64_t>& value) {
             return DeviceCounter{std::move(device), int_of(port, "DeviceCounter", "port"),
                                  std::move(source), std::move(name),
                                  int_of(value, "DeviceCounter", "value")};
           }),
           arg("device"), arg("port"), arg("source"), arg("name"), arg("value"))
      .def_readwrite("device", &DeviceCounter::device)
      .def_readwrite("port", &DeviceCounter::port)
      .def_readwrite("source", &DeviceCounter::source)
      .def_readwrite("name", &DeviceCounter::name)
      .def_readwrite("value", &DeviceCounter::value);
  def_fn(
      m, "read_sysfs_counters",
      [](const std::string& root) { return metrics::read_sysfs_counters(root); }, arg("root"),
      kRelease);
  def_fn(
      m, "parse_rdma_statistic",
      [](const std::string& text) { return metrics::parse_rdma_statistic(text); }, arg("text"));
}

}  // namespace

void bind_metrics(py::module_& m) {
  bind_device_counters(m);
  // Destroyed without the GIL: stopping the pull endpoint joins its threads.
  Class<Metrics, std::shared_ptr<Metrics>>(m, "Metrics")
      .def(py::init([] { return gil_free_delete(Metrics::create()); }))
      .def(
          "attach", [](Metrics& self, Lab& lab) { self.attach(lab); }, arg("lab"), kRelease)
      .def(
          "scenario_outcome",
          [](Metrics& self, const std::string& backend, const std::string& device,
             const std::string& outcome) {
            self.scenario_outcome(Source{backend, device}, outcome);
          },
          arg("backend"), arg("device"), arg("outcome"), kRelease)
      .def(
          "declare_device",
          [](Metrics& self, const std::string& backend, const std::string& device) {
            self.declare_device(Source{backend, device});
          },
          arg("backend"), arg("device"), kRelease)
      .def("ingest", &Metrics::ingest, arg("backend"), arg("devices"), arg("history_jsonl"),
           kRelease)
      .def("count_frame", &Metrics::count_frame, arg("backend"), arg("type"), arg("action"),
           kRelease)
      .def("watch_device_counters", &Metrics::watch_device_counters, arg("root"), arg("host"),
           kRelease)
      .def("set_device_counters", &Metrics::set_device_counters, arg("host"), arg("counters"),
           kRelease)
      .def("serve", &Metrics::serve, arg("address"), arg("port"), kRelease)
      .def("stop_serving", &Metrics::stop_serving, kRelease)
      .def_property_readonly("port", &Metrics::port)
      .def("push", &Metrics::push, arg("url"), arg("job"), arg("grouping"),
           arg("timeout_ns") = metrics::kPushTimeoutNs, kRelease)
      .def("text", &Metrics::text, kRelease);
}

}  // namespace rdmalab::bindings
