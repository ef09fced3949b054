// A workload's history records as metric samples (rdmalab.workloads.records: kernel ULPs such
// as NVMe over Fabrics driven across two hosts), per workload (the record's object, "nvme") and
// host, beside the backend and device every sample has:
//
//   workload {step, ok}             rdmalab_workload_steps_total{workload, host, step, outcome}
//                                   (outcome "ok" or "failed")
//   ulp_state {state}               rdmalab_ulp_state_changes_total{workload, host, state}: each
//                                   state a unit entered (state_label: "deleting (no IO)" as
//                                   deleting_no_IO)
//   io {op, ok, errors}             rdmalab_workload_io_total{workload, host, op, result}: the
//                                   record's ok and errors counts (result "ok" / "error")
//   io_verify {matched, pending,    rdmalab_workload_verify_blocks_total{workload, host, result}
//     lost_count, corrupt_count}    (result matched, pending, lost, corrupt)
//   ulp_state leaving a working     rdmalab_ulp_recovery_seconds{workload, host}: a unit's time
//     state -> working again        out of its working state (an NVMe controller's live, an
//                                   iSCSI session's LOGGED_IN, a SCSI disk's running), on the
//                                   lab's clock; a unit that goes ("gone") measures nothing
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "metrics/metrics.h"
#include "rdmalab/history.h"

namespace rdmalab::metrics {

// At most this many units out of their working state at once; the one out longest goes first
// when full.
inline constexpr size_t kMaxUnitsNotWorking = 256;

class WorkloadClassifier {
 public:
  explicit WorkloadClassifier(std::shared_ptr<Metrics> metrics,
                              size_t max_units = kMaxUnitsNotWorking);

  // Whether records of this kind are a workload's (observe counts them).
  static bool counts(const std::string& kind);
  // Counts a workload record. Thread-safe.
  void observe(const HistoryRecord& r, const Source& s);
  size_t units_not_working() const;

 private:
  void on_state(const HistoryRecord& r, const WorkloadSource& w);
  void on_verify(const HistoryRecord& r, const WorkloadSource& w);
  void evict_oldest_but(const std::string& unit);  // mu_ held

  std::shared_ptr<Metrics> metrics_;
  size_t max_units_;
  mutable std::mutex mu_;
  std::map<std::string, TimeNs> not_working_;  // host, workload, unit -> when it stopped working
};

// A ulp_state word as a label: runs of characters a label does not take become one '_'
// ("deleting (no IO)" -> "deleting_no_IO"), then bounded().
std::string state_label(const std::string& state);

}  // namespace rdmalab::metrics
