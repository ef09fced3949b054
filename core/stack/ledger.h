// Exactly-once accounting of work requests (Jepsen's history discipline): every posted WR
// must end with exactly one completion, or be implied by a later one; a WR whose completion
// never came is "unknown", never silently dropped. Violations are listed with their wr_id.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "rdmalab/history.h"
#include "rdmalab/types.h"

namespace rdmalab::stack {

enum class WorkQueue { SQ, RQ, SRQ };
std::string_view to_string(WorkQueue q);

enum class WrOutcome {
  PENDING,    // posted, no completion yet
  SUCCEEDED,  // a SUCCESS completion
  FLUSHED,    // WR_FLUSH_ERR
  ERRORED,    // any other status
  IMPLIED,    // unsignaled SQ WR, proven done by a later SUCCESS on the same SQ
  PASSED,     // unsignaled SQ WR passed by a later non-success completion: outcome unknown
};
std::string_view to_string(WrOutcome o);

struct LedgerEntry {
  uint64_t wr_id = 0;
  std::string label;    // "qp:3" for SQ/RQ posts, "srq:2" for SRQ posts
  uint32_t qp_num = 0;  // SQ/RQ: the QP posted to; SRQ: its srq_num
  WorkQueue queue = WorkQueue::SQ;
  bool signaled = true;   // receives are always signaled
  uint64_t post_seq = 0;  // posting order within the ledger
  WrOutcome outcome = WrOutcome::PENDING;
  WcStatus status = WcStatus::SUCCESS;  // of the completion, when one came
  uint32_t completed_qp_num = 0;        // qp_num of that completion
};

enum class ViolationKind {
  DUPLICATE_COMPLETION,  // a second completion for the same wr_id
  UNKNOWN_WR_ID,         // a completion for a wr_id never posted (or removed)
  WRONG_QP,              // the completion's qp_num is not the QP posted to (or attached to the SRQ)
  OUT_OF_ORDER,          // completed while an earlier WR of the same work queue had none
};
std::string_view to_string(ViolationKind k);

struct LedgerViolation {
  ViolationKind kind = ViolationKind::UNKNOWN_WR_ID;
  uint64_t wr_id = 0;
  uint32_t qp_num = 0;  // of the completion
  std::string detail;
};

struct LedgerReport {
  uint64_t posted = 0;
  uint64_t succeeded = 0;
  uint64_t flushed = 0;
  uint64_t errored = 0;
  uint64_t implied = 0;
  uint64_t unknown = 0;  // PENDING or PASSED
  std::vector<uint64_t> unknown_wr_ids;
  std::vector<LedgerViolation> violations;
  // No violation and every WR has a known outcome.
  bool exactly_once() const { return violations.empty() && unknown == 0; }
};

class CompletionLedger {
 public:
  // history (optional) receives a "ledger_violation" record per violation, under host.
  explicit CompletionLedger(History* history = nullptr, std::string host = "");

  // Records a post. Error(EEXIST) if wr_id is already in the ledger, EINVAL for wr_id 0.
  void on_post(const std::string& label, uint32_t qp_num, WorkQueue queue, uint64_t wr_id,
               bool signaled = true);
  // Removes a post that the provider refused (the WR never reached the queue).
  void forget(uint64_t wr_id);
  // Lets SRQ completions be checked against the QPs that may consume from that SRQ.
  void attach_srq(const std::string& srq_label, uint32_t qp_num);

  void on_completion(const WorkCompletion& wc);

  // Pending WRs of one work queue: by qp_num (SQ, RQ) or by label (any queue).
  uint64_t outstanding(uint32_t qp_num, WorkQueue queue) const;
  uint64_t outstanding(const std::string& label, WorkQueue queue) const;
  std::vector<uint64_t> outstanding_ids(uint32_t qp_num, WorkQueue queue) const;
  std::vector<uint64_t> outstanding_ids(const std::string& label, WorkQueue queue) const;
  std::optional<LedgerEntry> entry(uint64_t wr_id) const;
  std::vector<LedgerViolation> violations() const;

  LedgerReport check() const;

 private:
  struct QueueKey {
    std::string label;
    WorkQueue queue;
    bool operator<(const QueueKey& o) const {
      return std::tie(label, queue) < std::tie(o.label, o.queue);
    }
  };
  void check_completion(LedgerEntry& e, const WorkCompletion& wc,
                        std::vector<LedgerViolation>& found);
  void settle_earlier(const LedgerEntry& e, const WorkCompletion& wc,
                      std::vector<LedgerViolation>& found);
  void publish(const std::vector<LedgerViolation>& found);

  History* history_;
  std::string host_;
  mutable std::mutex mu_;  // short sections only; never held across a wait or a History call
  uint64_t next_seq_ = 1;
  std::map<uint64_t, LedgerEntry> entries_;                   // by wr_id
  std::map<QueueKey, std::map<uint64_t, uint64_t>> pending_;  // queue -> post_seq -> wr_id
  std::map<std::string, std::vector<uint32_t>> srq_qps_;      // srq label -> attached qp_nums
  std::vector<LedgerViolation> violations_;
};

}  // namespace rdmalab::stack
