// Turns one lab's history records into metric samples. Which record feeds what:
//
//   cm_event {event, status}             rdmalab_cm_events_total{event, status}
//   async_event {event}                  rdmalab_async_events_total{event}
//   wc {status}                          rdmalab_work_completions_total{status}
//   fault {fault}                        rdmalab_faults_total{kind}
//   fault on "fabric" (drop/delay/dup)   rdmalab_switch_frames_total{type, action} as well
//   drain_end {elapsed_ns, method}       rdmalab_drain_seconds{method}
//   workload, ulp_state, io, io_verify   a workload's metrics (workload.h)
//
// Latencies, on the lab's clock (virtual time in the model), per CM id (host + object label):
//   connect:        the id's rdma_connect call -> its ESTABLISHED event (the active side; a
//                   REJECTED, UNREACHABLE, CONNECT_ERROR or ADDR/ROUTE_ERROR ends it unmeasured)
//   disconnect:     the id's first rdma_disconnect call -> its DISCONNECTED event (an id that
//                   was disconnected by its peer first measures nothing here) and -> its
//                   TIMEWAIT_EXIT event (until="DISCONNECTED" / "TIMEWAIT_EXIT")
// The verbs backend records cm_event when the event is read, so there the latency includes
// the time the consumer took to read it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "metrics/metrics.h"
#include "metrics/workload.h"
#include "rdmalab/history.h"

namespace rdmalab::metrics {

// At most this many CM ids awaiting the end of a latency; the oldest goes first when full.
inline constexpr size_t kMaxPendingIds = 4096;

class Classifier {
 public:
  // devices: host name -> device label (the host's personality or provider).
  Classifier(std::shared_ptr<Metrics> metrics, std::string backend,
             std::map<std::string, std::string> devices, size_t max_pending = kMaxPendingIds);

  // Thread-safe: the verbs backend records from its event threads.
  void observe(const HistoryRecord& r);
  size_t pending() const;

 private:
  struct Pending {
    uint64_t seq = 0;  // when the entry was made, for eviction
    TimeNs connect_ns = -1;
    TimeNs disconnect_ns = -1;
  };

  Source source(const std::string& host) const;
  void on_cm_event(const HistoryRecord& r, const Source& s);
  void on_verb(const HistoryRecord& r);
  void on_fault(const HistoryRecord& r, const Source& s);
  Pending& pending_for(const HistoryRecord& r);  // mu_ held
  static std::string key(const HistoryRecord& r) { return r.host + '\x1f' + r.object; }

  std::shared_ptr<Metrics> metrics_;
  std::string backend_;
  std::map<std::string, std::string> devices_;
  WorkloadClassifier workloads_;
  size_t max_pending_;
  mutable std::mutex mu_;
  std::map<std::string, Pending> pending_;
};

// The frame type a model fabric fault names: the CM message for a MAD ("DREP"), else the
// packet's opcode ("SEND_ONLY", "MPA_REQUEST").
std::string frame_type(const nlohmann::json& packet);
// The switch action of a fabric fault: "drop" (also host_down_drop, port_down_drop), "delay",
// "duplicate"; "" for faults that are not about frames.
std::string frame_action(const std::string& fault);

}  // namespace rdmalab::metrics
