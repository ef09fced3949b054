#include "metrics/workload.h"

#include <utility>

namespace rdmalab::metrics {

namespace workload_fields {  // its own: the sources compile in batches

constexpr double kSecondsPerNs = 1e-9;
// The state of a unit that went (rdmalab.workloads.records.GONE).
constexpr const char* kGone = "gone";

// The states the kernel's units work in: an NVMe controller's "live" (nvme/host/core.c
// nvme_ctrl_state_show), an iSCSI session's "LOGGED_IN" (scsi_transport_iscsi.c
// iscsi_session_state_names), a SCSI disk's "running" (scsi_sysfs.c sdev_states).
bool working(const std::string& state) {
  return state == "live" || state == "LOGGED_IN" || state == "running";
}

std::string text(const nlohmann::json& data, const char* key) {
  auto it = data.find(key);
  return it != data.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double count(const nlohmann::json& data, const char* key) {
  auto it = data.find(key);
  if (it == data.end()) return 0;
  if (it->is_array()) return static_cast<double>(it->size());
  return it->is_number() ? it->get<double>() : 0;
}

// io_verify names its lost and corrupt blocks (at most 20) and counts them in <name>_count.
double blocks(const nlohmann::json& data, const std::string& name) {
  const std::string counted = name + "_count";
  return data.contains(counted) ? count(data, counted.c_str()) : count(data, name.c_str());
}

bool is_label_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == ':' || c == '-';
}

}  // namespace workload_fields

namespace wf = workload_fields;

std::string state_label(const std::string& state) {
  std::string out;
  for (char c : state) {
    if (wf::is_label_char(c)) {
      out += c;
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return bounded(out);
}

WorkloadClassifier::WorkloadClassifier(std::shared_ptr<Metrics> metrics, size_t max_units)
    : metrics_(std::move(metrics)), max_units_(max_units > 0 ? max_units : 1) {}

void WorkloadClassifier::evict_oldest_but(const std::string& unit) {
  auto oldest = not_working_.end();
  for (auto p = not_working_.begin(); p != not_working_.end(); ++p) {
    if (p->first != unit && (oldest == not_working_.end() || p->second < oldest->second))
      oldest = p;
  }
  not_working_.erase(oldest);
}

size_t WorkloadClassifier::units_not_working() const {
  std::lock_guard<std::mutex> lock(mu_);
  return not_working_.size();
}

bool WorkloadClassifier::counts(const std::string& kind) {
  return kind == "workload" || kind == "ulp_state" || kind == "io" || kind == "io_verify";
}

void WorkloadClassifier::observe(const HistoryRecord& r, const Source& s) {
  const std::string& k = r.kind;
  const WorkloadSource w{s, r.object, r.host};
  if (k == "workload") {
    auto ok = r.data.find("ok");
    metrics_->workload_step(w, wf::text(r.data, "step"), ok == r.data.end() || *ok == true);
  } else if (k == "ulp_state") {
    on_state(r, w);
  } else if (k == "io") {
    metrics_->workload_io(w, wf::text(r.data, "op"), wf::count(r.data, "ok"),
                          wf::count(r.data, "errors"));
  } else {
    on_verify(r, w);
  }
}

void WorkloadClassifier::on_verify(const HistoryRecord& r, const WorkloadSource& w) {
  metrics_->verify_blocks(w, "matched", wf::count(r.data, "matched"));
  metrics_->verify_blocks(w, "pending", wf::count(r.data, "pending"));
  metrics_->verify_blocks(w, "lost", wf::blocks(r.data, "lost"));
  metrics_->verify_blocks(w, "corrupt", wf::blocks(r.data, "corrupt"));
}

// A unit leaving its working state starts its recovery clock; working again ends it; gone
// forgets it.
void WorkloadClassifier::on_state(const HistoryRecord& r, const WorkloadSource& w) {
  const std::string state = wf::text(r.data, "state");
  metrics_->ulp_state(w, state_label(state));
  metrics_->declare_workload(w);
  const std::string unit = r.host + '\x1f' + r.object + '\x1f' + wf::text(r.data, "unit");
  double recovered_s = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = not_working_.find(unit);
    if (it != not_working_.end() && (wf::working(state) || state == wf::kGone)) {
      if (wf::working(state)) {
        recovered_s = static_cast<double>(r.t_ns - it->second) * wf::kSecondsPerNs;
      }
      not_working_.erase(it);
    } else if (!wf::working(state) && state != wf::kGone &&
               wf::working(wf::text(r.data, "previous"))) {
      not_working_[unit] = r.t_ns;
      if (not_working_.size() > max_units_) evict_oldest_but(unit);
    }
  }
  if (recovered_s >= 0) metrics_->ulp_recovery(w, recovered_s);
}

}  // namespace rdmalab::metrics
