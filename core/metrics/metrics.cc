#include "metrics/metrics.h"

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "metrics/classifier.h"
#include "rdmalab/error.h"

namespace rdmalab::metrics {

namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Histogram;
using prometheus::Labels;

bool is_label_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':' || c == '-';
}

Family<Counter>& counter(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

Family<Histogram>& histogram(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r);
}

Labels with(const Source& s, Labels more) {
  more.emplace("backend", bounded(s.backend));
  more.emplace("device", bounded(s.device));
  return more;
}

Labels with(const WorkloadSource& w, Labels more) {
  more.emplace("workload", bounded(w.workload));
  more.emplace("host", bounded(w.host));
  return with(w.source, std::move(more));
}

// IB CM REJ reasons (IBTA table 112) the stack names; rdmalab.api.cm_values.REJ_REASON has the same.
const char* rej_reason(int status) {
  switch (status) {
    case REJ_TIMEOUT:
      return "TIMEOUT";
    case REJ_INVALID_SERVICE_ID:
      return "INVALID_SERVICE_ID";
    case REJ_STALE_CONN:
      return "STALE_CONN";
    case REJ_CONSUMER_DEFINED:
      return "CONSUMER_DEFINED";
    default:
      return nullptr;
  }
}

}  // namespace

const std::vector<double>& latency_buckets() {
  static const std::vector<double> buckets = {1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 0.5, 1,
                                              2.5,  5,    10,   30,   60,   120, 300};
  return buckets;
}

std::string bounded(const std::string& value) {
  if (value.empty()) return "none";
  if (value.size() > 48 || !std::all_of(value.begin(), value.end(), is_label_char)) return "other";
  return value;
}

std::string cm_status_name(const std::string& event, int status) {
  if (status == 0) return "OK";
  if (status < 0) {
    const char* name = strerrorname_np(-status);
    return name != nullptr ? std::string(name) : "other";
  }
  if (event == "REJECTED") {
    if (const char* name = rej_reason(status)) return name;
  }
  return status < 256 ? std::to_string(status) : "other";
}

// Device counters: read from sysfs at every collection, or set from a snapshot.
class Metrics::Devices : public prometheus::Collectable {
 public:
  void watch(std::string root, std::string host) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.emplace_back(std::move(root), std::move(host));
  }
  void set(const std::string& host, std::vector<DeviceCounter> counters) {
    std::lock_guard<std::mutex> lock(mu_);
    snapshots_[host] = std::move(counters);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily f;
    f.name = "rdmalab_device_counter";
    f.help =
        "RDMA device counters as the kernel reports them (sysfs counters/hw_counters, "
        "rdma statistic); cumulative where the driver says so: use rate()";
    f.type = prometheus::MetricType::Gauge;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [root, host] : watched_) add(f, host, read_sysfs_counters(root));
    for (const auto& [host, counters] : snapshots_) add(f, host, counters);
    if (f.metric.empty()) return {};
    return {f};
  }

 private:
  static void add(prometheus::MetricFamily& f, const std::string& host,
                  const std::vector<DeviceCounter>& counters) {
    for (const DeviceCounter& c : counters) {
      prometheus::ClientMetric m;
      m.label = {{"counter", c.name},
                 {"device", bounded(c.device)},
                 {"host", bounded(host)},
                 {"port", std::to_string(c.port)},
                 {"source", c.source}};
      m.gauge.value = static_cast<double>(c.value);
      f.metric.push_back(std::move(m));
    }
  }

  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> watched_;
  std::map<std::string, std::vector<DeviceCounter>> snapshots_;
};

// What a scrape or a push sends: the registry and the device counters, as one collectable.
class Metrics::All : public prometheus::Collectable {
 public:
  All(std::shared_ptr<prometheus::Registry> r, std::shared_ptr<Devices> d)
      : registry_(std::move(r)), devices_(std::move(d)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    auto out = registry_->Collect();
    for (auto& f : devices_->Collect()) out.push_back(std::move(f));
    return out;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Devices> devices_;
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      devices_(std::make_shared<Devices>()),
      all_(std::make_shared<All>(registry_, devices_)),
      cm_events_(counter(*registry_, "rdmalab_cm_events_total",
                         "rdma_cm events by event type and status")),
      async_events_(counter(*registry_, "rdmalab_async_events_total", "Async events by type")),
      wcs_(counter(*registry_, "rdmalab_work_completions_total", "Work completions by status")),
      faults_(counter(*registry_, "rdmalab_faults_total", "Faults applied, by kind")),
      frames_(counter(*registry_, "rdmalab_switch_frames_total",
                      "Frames the fabric switch acted on, by frame type and action")),
      outcomes_(counter(*registry_, "rdmalab_scenario_outcomes_total",
                        "Scenario outcomes (passed, failed, error, skipped)")),
      connect_(histogram(*registry_, "rdmalab_cm_connect_seconds",
                         "rdma_connect to ESTABLISHED, on the lab's clock")),
      disconnect_(histogram(*registry_, "rdmalab_cm_disconnect_seconds",
                            "First rdma_disconnect to DISCONNECTED or TIMEWAIT_EXIT (until)")),
      drain_(histogram(*registry_, "rdmalab_drain_seconds", "QP drain, begin to end")),
      steps_(counter(*registry_, "rdmalab_workload_steps_total",
                     "Workload steps (set up, connect, I/O, tear down) by step and outcome")),
      ulp_states_(counter(*registry_, "rdmalab_ulp_state_changes_total",
                          "States a workload's kernel ULP unit entered, by state")),
      io_(counter(*registry_, "rdmalab_workload_io_total",
                  "A workload's I/O operations by op and result (ok, error)")),
      verify_(counter(*registry_, "rdmalab_workload_verify_blocks_total",
                      "Blocks a workload's read-back found matched, pending, lost or corrupt")),
      recovery_(histogram(*registry_, "rdmalab_ulp_recovery_seconds",
                          "A ULP unit out of its working state until working again")) {}

Metrics::~Metrics() {
  stop_serving();
}

std::shared_ptr<Metrics> Metrics::create() {
  return std::shared_ptr<Metrics>(new Metrics());
}

void Metrics::attach(Lab& lab) {
  std::map<std::string, std::string> devices;
  for (const auto& host : lab.hosts()) {
    const auto names = host->device_names();
    if (!names.empty()) devices[host->name()] = host->device_caps(names.front()).personality;
  }
  auto classifier = std::make_shared<Classifier>(shared_from_this(), lab.backend(), devices);
  for (const auto& [host, device] : devices) declare_device(Source{lab.backend(), device});
  History& h = lab.history();
  h.set_observer([previous = h.observer(), classifier](const HistoryRecord& r) {
    if (previous) previous(r);
    classifier->observe(r);
  });
}

void Metrics::ingest(const std::string& backend, const std::map<std::string, std::string>& devices,
                     const std::string& history_jsonl) {
  Classifier classifier(shared_from_this(), backend, devices);
  for (const auto& [host, device] : devices) declare_device(Source{backend, device});
  size_t line_no = 0;
  size_t start = 0;
  while (start < history_jsonl.size()) {
    size_t end = history_jsonl.find('\n', start);
    if (end == std::string::npos) end = history_jsonl.size();
    const std::string line = history_jsonl.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (line.empty()) continue;
    HistoryRecord r;
    try {
      r = HistoryRecord::from_json(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      throw Error("metrics_ingest", EINVAL,
                  "history line " + std::to_string(line_no) + ": " + e.what());
    }
    classifier.observe(r);
  }
}

void Metrics::cm_event(const Source& s, const std::string& event, const std::string& status) {
  cm_events_.Add(with(s, {{"event", bounded(event)}, {"status", bounded(status)}})).Increment();
}

void Metrics::async_event(const Source& s, const std::string& event) {
  async_events_.Add(with(s, {{"event", bounded(event)}})).Increment();
}

void Metrics::work_completion(const Source& s, const std::string& status) {
  wcs_.Add(with(s, {{"status", bounded(status)}})).Increment();
}

void Metrics::fault(const Source& s, const std::string& kind) {
  faults_.Add(with(s, {{"kind", bounded(kind)}})).Increment();
}

void Metrics::count_frame(const std::string& backend, const std::string& type,
                          const std::string& action) {
  frames_.Add({{"backend", bounded(backend)}, {"type", bounded(type)}, {"action", bounded(action)}})
      .Increment();
}

void Metrics::scenario_outcome(const Source& s, const std::string& outcome) {
  outcomes_.Add(with(s, {{"outcome", bounded(outcome)}})).Increment();
}

void Metrics::declare_device(const Source& s) {
  for (const char* o : {"passed", "failed", "error", "skipped"}) {
    outcomes_.Add(with(s, {{"outcome", o}}));
  }
  connect_.Add(with(s, {}), latency_buckets());
  for (const char* until : {"DISCONNECTED", "TIMEWAIT_EXIT"}) {
    disconnect_.Add(with(s, {{"until", until}}), latency_buckets());
  }
  for (const char* method : {"marker", "counting"}) {
    drain_.Add(with(s, {{"method", method}}), latency_buckets());
  }
}

void Metrics::connect_latency(const Source& s, double seconds) {
  connect_.Add(with(s, {}), latency_buckets()).Observe(seconds);
}

void Metrics::disconnect_latency(const Source& s, const std::string& until, double seconds) {
  disconnect_.Add(with(s, {{"until", bounded(until)}}), latency_buckets()).Observe(seconds);
}

void Metrics::drain_latency(const Source& s, const std::string& method, double seconds) {
  drain_.Add(with(s, {{"method", bounded(method)}}), latency_buckets()).Observe(seconds);
}

void Metrics::workload_step(const WorkloadSource& w, const std::string& step, bool ok) {
  // Both outcomes exist once the step is seen: a first failure shows as an increase.
  Counter& ok_steps = steps_.Add(with(w, {{"step", bounded(step)}, {"outcome", "ok"}}));
  Counter& failed = steps_.Add(with(w, {{"step", bounded(step)}, {"outcome", "failed"}}));
  (ok ? ok_steps : failed).Increment();
}

void Metrics::ulp_state(const WorkloadSource& w, const std::string& state) {
  ulp_states_.Add(with(w, {{"state", bounded(state)}})).Increment();
}

void Metrics::workload_io(const WorkloadSource& w, const std::string& op, double ok,
                          double errors) {
  io_.Add(with(w, {{"op", bounded(op)}, {"result", "ok"}})).Increment(std::max(ok, 0.0));
  io_.Add(with(w, {{"op", bounded(op)}, {"result", "error"}})).Increment(std::max(errors, 0.0));
}

void Metrics::verify_blocks(const WorkloadSource& w, const std::string& result, double blocks) {
  verify_.Add(with(w, {{"result", bounded(result)}})).Increment(std::max(blocks, 0.0));
}

void Metrics::declare_workload(const WorkloadSource& w) {
  recovery_.Add(with(w, {}), latency_buckets());
}

void Metrics::ulp_recovery(const WorkloadSource& w, double seconds) {
  recovery_.Add(with(w, {}), latency_buckets()).Observe(seconds);
}

void Metrics::watch_device_counters(const std::string& root, const std::string& host) {
  devices_->watch(root, host);
}

void Metrics::set_device_counters(const std::string& host, std::vector<DeviceCounter> counters) {
  devices_->set(host, std::move(counters));
}

int Metrics::serve(const std::string& address, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  if (exposer_)
    throw Error("metrics_serve", EALREADY, "already serving on " + std::to_string(port_));
  const bool v6 = address.find(':') != std::string::npos;
  const std::string where = (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(where, 2);
  } catch (const std::exception& e) {
    throw Error("metrics_serve", EADDRINUSE, where + ": " + e.what());
  }
  exposer_->RegisterCollectable(all_);
  const auto ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? port : ports.front();
  return port_;
}

void Metrics::stop_serving() {
  std::unique_ptr<prometheus::Exposer> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone = std::move(exposer_);
    port_ = 0;
  }
}

int Metrics::port() const {
  std::lock_guard<std::mutex> lock(mu_);
  return port_;
}

std::shared_ptr<prometheus::Collectable> Metrics::collectable() const {
  return all_;
}

std::string Metrics::text() const {
  return prometheus::TextSerializer().Serialize(all_->Collect());
}

}  // namespace rdmalab::metrics
