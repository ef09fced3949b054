#include "metrics/classifier.h"

#include <array>
#include <string_view>
#include <utility>

#include "rdmalab/types.h"

namespace rdmalab::metrics {

namespace {

constexpr double kSecondsPerNs = 1e-9;

// Events that end a connection attempt without ESTABLISHED (rdmalab.api.cm_values.FAILURE_EVENTS).
constexpr std::array<std::string_view, 6> kConnectFailures = {
    "ADDR_ERROR", "ROUTE_ERROR", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "DEVICE_REMOVAL"};

bool is_connect_failure(const std::string& event) {
  for (std::string_view f : kConnectFailures) {
    if (event == f) return true;
  }
  return false;
}

std::string str(const nlohmann::json& data, const char* key) {
  auto it = data.find(key);
  return it != data.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t num(const nlohmann::json& data, const char* key, int64_t fallback) {
  auto it = data.find(key);
  return it != data.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

// The CM message a MAD carries (rdmalab/types.h kCmAttrs); "MAD" for any other attribute ID.
std::string cm_message(int64_t attr_id) {
  const char* name =
      attr_id >= 0 && attr_id <= 0xFFFF ? cm_attr_name(static_cast<uint16_t>(attr_id)) : nullptr;
  return name != nullptr ? name : "MAD";
}

}  // namespace

std::string frame_type(const nlohmann::json& packet) {
  const std::string opcode = str(packet, "opcode");
  if (opcode == "MAD") return cm_message(num(packet, "mad_attr_id", 0));
  return bounded(opcode);
}

std::string frame_action(const std::string& fault) {
  if (fault == "drop" || fault == "host_down_drop" || fault == "port_down_drop") return "drop";
  if (fault == "delay" || fault == "duplicate") return fault;
  return "";
}

Classifier::Classifier(std::shared_ptr<Metrics> metrics, std::string backend,
                       std::map<std::string, std::string> devices, size_t max_pending)
    : metrics_(std::move(metrics)),
      backend_(std::move(backend)),
      devices_(std::move(devices)),
      workloads_(metrics_),
      max_pending_(max_pending > 0 ? max_pending : 1) {}

Source Classifier::source(const std::string& host) const {
  auto it = devices_.find(host);
  return Source{backend_, it != devices_.end() ? it->second : std::string()};
}

size_t Classifier::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

void Classifier::observe(const HistoryRecord& r) {
  const std::string& k = r.kind;
  if (k == "cm_event") return on_cm_event(r, source(r.host));
  if (k == "verb" || k == "destroyed_by_kill" || k == "destroyed_by_close") return on_verb(r);
  if (k == "async_event") return metrics_->async_event(source(r.host), str(r.data, "event"));
  if (k == "wc") return metrics_->work_completion(source(r.host), str(r.data, "status"));
  if (k == "fault") return on_fault(r, source(r.host));
  if (WorkloadClassifier::counts(k)) return workloads_.observe(r, source(r.host));
  if (k == "drain_end") {
    const double s = static_cast<double>(num(r.data, "elapsed_ns", 0)) * kSecondsPerNs;
    metrics_->drain_latency(source(r.host), str(r.data, "method"), s);
  }
}

void Classifier::on_fault(const HistoryRecord& r, const Source& s) {
  const std::string fault = str(r.data, "fault");
  metrics_->fault(s, fault);
  const std::string action = frame_action(fault);
  if (r.object == "fabric" && !action.empty()) {
    metrics_->count_frame(backend_, frame_type(r.data), action);
  }
}

Classifier::Pending& Classifier::pending_for(const HistoryRecord& r) {
  auto [it, inserted] = pending_.try_emplace(key(r));
  if (inserted) {
    it->second.seq = r.seq;
    if (pending_.size() > max_pending_) {  // evict the oldest other entry
      auto oldest = pending_.end();
      for (auto p = pending_.begin(); p != pending_.end(); ++p) {
        if (p != it && (oldest == pending_.end() || p->second.seq < oldest->second.seq)) {
          oldest = p;
        }
      }
      pending_.erase(oldest);
    }
  }
  return it->second;
}

// rdma_connect and the first rdma_disconnect start a latency; the id's end forgets it.
void Classifier::on_verb(const HistoryRecord& r) {
  const std::string verb = str(r.data, "verb");
  if (r.kind == "verb" && verb.rfind("rdma_", 0) != 0) return;  // not an rdma_cm verb
  const bool failed = r.data.contains("err");
  std::lock_guard<std::mutex> lock(mu_);
  if (r.kind != "verb" || (verb == "rdma_destroy_id" && !failed)) {
    pending_.erase(key(r));
  } else if (verb == "rdma_connect" && !failed) {
    pending_for(r).connect_ns = r.t_ns;
  } else if (verb == "rdma_disconnect" && !failed) {
    Pending& p = pending_for(r);
    if (p.disconnect_ns < 0) p.disconnect_ns = r.t_ns;
  }
}

void Classifier::on_cm_event(const HistoryRecord& r, const Source& s) {
  const std::string event = str(r.data, "event");
  metrics_->cm_event(s, event, cm_status_name(event, static_cast<int>(num(r.data, "status", 0))));
  double connect_s = -1;
  double disconnect_s = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(key(r));
    if (it == pending_.end()) return;
    Pending& p = it->second;
    if (event == "ESTABLISHED" && p.connect_ns >= 0) {
      connect_s = static_cast<double>(r.t_ns - p.connect_ns) * kSecondsPerNs;
      p.connect_ns = -1;
    } else if (is_connect_failure(event)) {
      p.connect_ns = -1;
    } else if ((event == "DISCONNECTED" || event == "TIMEWAIT_EXIT") && p.disconnect_ns >= 0) {
      disconnect_s = static_cast<double>(r.t_ns - p.disconnect_ns) * kSecondsPerNs;
    }
    // TIMEWAIT_EXIT: the id's connection is over; an entry with nothing pending goes too.
    if (event == "TIMEWAIT_EXIT" || (p.connect_ns < 0 && p.disconnect_ns < 0)) pending_.erase(it);
  }
  if (connect_s >= 0) metrics_->connect_latency(s, connect_s);
  if (disconnect_s >= 0) metrics_->disconnect_latency(s, event, disconnect_s);
}

}  // namespace rdmalab::metrics
