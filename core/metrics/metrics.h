// The engine's Prometheus metrics (prometheus-cpp): what the labs did, by backend and device,
// for dashboards that show per device and over time what passed, which faults were applied and
// how long CM and drain took, and what a workload (a kernel ULP) did and how long its units
// took to recover. Fed by a lab's history (attach) and by the controller (scenario
// outcomes, switch frames); exposed by a pull endpoint (serve, loopback by default) for long
// runs or pushed to a Pushgateway (push) for batch runs. Both are off until asked for.
//
// Labels stay bounded: backend, device (the personality or provider: "ib", "rxe"), event type,
// status, kind, outcome. No QPN, id or time is ever a label; per-id state for latencies lives in
// the classifier (classifier.h), in a bounded map.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "metrics/device_counters.h"
#include "rdmalab/lab.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace rdmalab::metrics {

// Where a sample comes from: the lab's backend and the device (personality / provider name).
struct Source {
  std::string backend;
  std::string device;
};

// A workload's samples (workload.h): the source, the workload ("nvme") and the host it ran on.
struct WorkloadSource {
  Source source;
  std::string workload;
  std::string host;
};

// Latency buckets in seconds: from a model connect (microseconds) to a DREQ given up after 16
// retries (minutes); the same for every latency so the dashboards can compare them.
const std::vector<double>& latency_buckets();

inline constexpr TimeNs kPushTimeoutNs = 10 * kNsPerSec;

// The Pushgateway URL of a group: <url>/metrics/job/<job>/<name>/<value>... Error(EINVAL)
// unless url is http(s)://host:port and job and grouping are plain names.
std::string push_uri(const std::string& url, const std::string& job,
                     const std::map<std::string, std::string>& grouping);

// A label value that keeps the label set bounded: "none" for "", "other" for anything that is
// not a short name ([A-Za-z0-9_.:-], at most 48 characters).
std::string bounded(const std::string& value);

// The CM event status as a bounded name, as rdmalab.api.cm_values.status_name does: "OK", an errno name
// ("ETIMEDOUT"), an IB REJ reason on REJECTED ("STALE_CONN"), else the number.
std::string cm_status_name(const std::string& event, int status);

class Metrics : public std::enable_shared_from_this<Metrics> {
 public:
  // Always owned by a shared_ptr: an attached lab's history observer keeps it alive.
  static std::shared_ptr<Metrics> create();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Feeds the lab's history into these metrics from now on (History::set_observer; an observer
  // set before keeps being called first). Labels: the lab's backend, each host's device
  // personality. Attach a lab once.
  void attach(Lab& lab);
  // Feeds a finished history (JSON lines, as Lab.history exports it) of a lab whose records
  // live elsewhere (the VM lab's guests) through the same classifier. devices: host -> device
  // label. A malformed line raises Error(EINVAL) naming it; lines before it are counted.
  void ingest(const std::string& backend, const std::map<std::string, std::string>& devices,
              const std::string& history_jsonl);

  // -- samples (the classifier and the controller call these)
  void cm_event(const Source& s, const std::string& event, const std::string& status);
  void async_event(const Source& s, const std::string& event);
  void work_completion(const Source& s, const std::string& status);
  void fault(const Source& s, const std::string& kind);
  // A frame the fabric switch handled: type (CM message "DREP", BTH opcode "SEND_ONLY", iWARP
  // "MPA_REQUEST"), action ("forward", "drop", "delay", "duplicate").
  void count_frame(const std::string& backend, const std::string& type, const std::string& action);
  void scenario_outcome(const Source& s, const std::string& outcome);
  // Creates the series every device has (outcomes, latency histograms) at 0, so that a first
  // sample shows in Prometheus as an increase (a series born at 1 has no rate).
  void declare_device(const Source& s);
  void connect_latency(const Source& s, double seconds);
  void disconnect_latency(const Source& s, const std::string& until, double seconds);
  void drain_latency(const Source& s, const std::string& method, double seconds);

  // -- workloads (workload.h says which record feeds which)
  void workload_step(const WorkloadSource& w, const std::string& step, bool ok);
  void ulp_state(const WorkloadSource& w, const std::string& state);
  void workload_io(const WorkloadSource& w, const std::string& op, double ok, double errors);
  // Blocks the read-back found: result "matched", "pending", "lost", "corrupt".
  void verify_blocks(const WorkloadSource& w, const std::string& result, double blocks);
  // Creates the workload's recovery histogram at 0 (see declare_device).
  void declare_workload(const WorkloadSource& w);
  void ulp_recovery(const WorkloadSource& w, double seconds);

  // -- device counters, exported as rdmalab_device_counter{host,device,port,source,counter}
  // Reads root at every collection (scrape, push, text); a missing root exports nothing.
  void watch_device_counters(const std::string& root, const std::string& host);
  // A snapshot read elsewhere (a VM guest): replaces what was set for host before.
  void set_device_counters(const std::string& host, std::vector<DeviceCounter> counters);

  // -- exposure
  // Starts the pull endpoint on "address:port" (port 0 picks a free one); returns the port.
  // Error(EADDRINUSE) if it cannot listen, Error(EALREADY) if already serving.
  int serve(const std::string& address, int port);
  void stop_serving();
  int port() const;  // 0 when not serving
  // PUTs every metric to a Pushgateway (url "http://host:port") under job and grouping
  // labels, replacing that group's previous push (push.cc). Error(EIO) when the gateway
  // refuses or cannot be reached, Error(ETIMEDOUT) at the deadline, Error(EINVAL) for a job or
  // grouping label that is not a plain name.
  void push(const std::string& url, const std::string& job,
            const std::map<std::string, std::string>& grouping, TimeNs timeout_ns = kPushTimeoutNs);
  std::string text() const;  // the exposition text (what a scrape returns)

  // The registry and the device counters as one collectable (for another exposer).
  std::shared_ptr<prometheus::Collectable> collectable() const;

 private:
  Metrics();
  class All;
  class Devices;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Devices> devices_;
  std::shared_ptr<All> all_;
  prometheus::Family<prometheus::Counter>& cm_events_;
  prometheus::Family<prometheus::Counter>& async_events_;
  prometheus::Family<prometheus::Counter>& wcs_;
  prometheus::Family<prometheus::Counter>& faults_;
  prometheus::Family<prometheus::Counter>& frames_;
  prometheus::Family<prometheus::Counter>& outcomes_;
  prometheus::Family<prometheus::Histogram>& connect_;
  prometheus::Family<prometheus::Histogram>& disconnect_;
  prometheus::Family<prometheus::Histogram>& drain_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& ulp_states_;
  prometheus::Family<prometheus::Counter>& io_;
  prometheus::Family<prometheus::Counter>& verify_;
  prometheus::Family<prometheus::Histogram>& recovery_;

  mutable std::mutex mu_;  // the exposer
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace rdmalab::metrics
