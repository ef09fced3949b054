#include "stack/ledger.h"

#include <algorithm>

#include "rdmalab/error.h"

namespace rdmalab::stack {

std::string_view to_string(WorkQueue q) {
  switch (q) {
    case WorkQueue::SQ:
      return "SQ";
    case WorkQueue::RQ:
      return "RQ";
    case WorkQueue::SRQ:
      return "SRQ";
  }
  return "?";
}

std::string_view to_string(WrOutcome o) {
  switch (o) {
    case WrOutcome::PENDING:
      return "PENDING";
    case WrOutcome::SUCCEEDED:
      return "SUCCEEDED";
    case WrOutcome::FLUSHED:
      return "FLUSHED";
    case WrOutcome::ERRORED:
      return "ERRORED";
    case WrOutcome::IMPLIED:
      return "IMPLIED";
    case WrOutcome::PASSED:
      return "PASSED";
  }
  return "?";
}

std::string_view to_string(ViolationKind k) {
  switch (k) {
    case ViolationKind::DUPLICATE_COMPLETION:
      return "duplicate_completion";
    case ViolationKind::UNKNOWN_WR_ID:
      return "unknown_wr_id";
    case ViolationKind::WRONG_QP:
      return "wrong_qp";
    case ViolationKind::OUT_OF_ORDER:
      return "out_of_order";
  }
  return "?";
}

namespace {

WrOutcome outcome_of(WcStatus s) {
  if (s == WcStatus::SUCCESS) return WrOutcome::SUCCEEDED;
  if (s == WcStatus::WR_FLUSH_ERR) return WrOutcome::FLUSHED;
  return WrOutcome::ERRORED;
}

bool has_completion(WrOutcome o) {
  return o == WrOutcome::SUCCEEDED || o == WrOutcome::FLUSHED || o == WrOutcome::ERRORED;
}

}  // namespace

CompletionLedger::CompletionLedger(History* history, std::string host)
    : history_(history), host_(std::move(host)) {}

void CompletionLedger::on_post(const std::string& label, uint32_t qp_num, WorkQueue queue,
                               uint64_t wr_id, bool signaled) {
  if (wr_id == 0) throw Error("ledger_post", EINVAL, "wr_id 0 is reserved for 'assign one'");
  std::lock_guard lock(mu_);
  if (entries_.count(wr_id) != 0) {
    throw Error("ledger_post", EEXIST, "wr_id " + std::to_string(wr_id) + " already posted");
  }
  LedgerEntry e;
  e.wr_id = wr_id;
  e.label = label;
  e.qp_num = qp_num;
  e.queue = queue;
  e.signaled = queue == WorkQueue::SQ ? signaled : true;  // a receive always completes
  e.post_seq = next_seq_++;
  pending_[{label, queue}][e.post_seq] = wr_id;
  entries_.emplace(wr_id, std::move(e));
}

void CompletionLedger::forget(uint64_t wr_id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(wr_id);
  if (it == entries_.end()) return;
  const QueueKey key{it->second.label, it->second.queue};
  auto p = pending_.find(key);
  if (p != pending_.end()) {
    p->second.erase(it->second.post_seq);
    if (p->second.empty()) pending_.erase(p);
  }
  entries_.erase(it);
}

void CompletionLedger::attach_srq(const std::string& srq_label, uint32_t qp_num) {
  std::lock_guard lock(mu_);
  srq_qps_[srq_label].push_back(qp_num);
}

void CompletionLedger::on_completion(const WorkCompletion& wc) {
  std::vector<LedgerViolation> found;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(wc.wr_id);
    if (it == entries_.end()) {
      found.push_back({ViolationKind::UNKNOWN_WR_ID, wc.wr_id, wc.qp_num,
                       "completion for a wr_id never posted"});
    } else {
      check_completion(it->second, wc, found);
    }
    violations_.insert(violations_.end(), found.begin(), found.end());
  }
  publish(found);
}

void CompletionLedger::check_completion(LedgerEntry& e, const WorkCompletion& wc,
                                        std::vector<LedgerViolation>& found) {
  const std::string status(to_string(wc.status));
  if (has_completion(e.outcome)) {
    found.push_back(
        {ViolationKind::DUPLICATE_COMPLETION, e.wr_id, wc.qp_num,
         "second completion (" + status + ") after " + std::string(to_string(e.status))});
    return;
  }
  if (e.outcome != WrOutcome::PENDING) {  // IMPLIED or PASSED: a later WR completed first
    found.push_back(
        {ViolationKind::OUT_OF_ORDER, e.wr_id, wc.qp_num,
         "completion after a later WR of " + e.label + " " + std::string(to_string(e.queue))});
  }
  if (e.queue == WorkQueue::SRQ) {
    const auto& qps = srq_qps_[e.label];
    if (!qps.empty() && std::find(qps.begin(), qps.end(), wc.qp_num) == qps.end()) {
      found.push_back({ViolationKind::WRONG_QP, e.wr_id, wc.qp_num,
                       "qp_num " + std::to_string(wc.qp_num) + " is not attached to " + e.label});
    }
  } else if (wc.qp_num != e.qp_num) {
    found.push_back({ViolationKind::WRONG_QP, e.wr_id, wc.qp_num,
                     "posted to qp_num " + std::to_string(e.qp_num) + " (" + e.label + ")"});
  }
  if (e.outcome == WrOutcome::PENDING) settle_earlier(e, wc, found);
  e.outcome = outcome_of(wc.status);
  e.status = wc.status;
  e.completed_qp_num = wc.qp_num;
}

// Completions within one SQ or RQ come in posting order (semantics.md C). Earlier unsignaled
// SQ WRs are resolved by this one; an earlier WR still owed a completion is a violation.
// An SRQ is shared by several QPs, so its consumption order is not checked.
void CompletionLedger::settle_earlier(const LedgerEntry& e, const WorkCompletion& wc,
                                      std::vector<LedgerViolation>& found) {
  auto p = pending_.find({e.label, e.queue});
  if (p == pending_.end()) return;
  auto& queue = p->second;
  if (e.queue != WorkQueue::SRQ) {
    bool reported = false;
    for (auto it = queue.begin(); it != queue.end() && it->first < e.post_seq;) {
      LedgerEntry& earlier = entries_.at(it->second);
      if (earlier.signaled) {
        if (!reported) {
          found.push_back({ViolationKind::OUT_OF_ORDER, e.wr_id, wc.qp_num,
                           "completed before earlier wr_id " + std::to_string(earlier.wr_id)});
          reported = true;
        }
        ++it;
        continue;
      }
      earlier.outcome = wc.status == WcStatus::SUCCESS ? WrOutcome::IMPLIED : WrOutcome::PASSED;
      it = queue.erase(it);
    }
  }
  queue.erase(e.post_seq);
  if (queue.empty()) pending_.erase(p);
}

void CompletionLedger::publish(const std::vector<LedgerViolation>& found) {
  if (history_ == nullptr) return;
  for (const auto& v : found) {
    history_->record(host_, "qp_num:" + std::to_string(v.qp_num), "ledger_violation",
                     {{"violation", std::string(to_string(v.kind))},
                      {"wr_id", v.wr_id},
                      {"qp_num", v.qp_num},
                      {"detail", v.detail}});
  }
}

uint64_t CompletionLedger::outstanding(uint32_t qp_num, WorkQueue queue) const {
  return outstanding_ids(qp_num, queue).size();
}

uint64_t CompletionLedger::outstanding(const std::string& label, WorkQueue queue) const {
  std::lock_guard lock(mu_);
  auto p = pending_.find({label, queue});
  return p == pending_.end() ? 0 : p->second.size();
}

std::vector<uint64_t> CompletionLedger::outstanding_ids(uint32_t qp_num, WorkQueue queue) const {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> ids;
  for (const auto& [key, queue_entries] : pending_) {
    if (key.queue != queue || queue_entries.empty()) continue;
    if (entries_.at(queue_entries.begin()->second).qp_num != qp_num) continue;
    for (const auto& [seq, wr_id] : queue_entries) ids.push_back(wr_id);
  }
  return ids;
}

std::vector<uint64_t> CompletionLedger::outstanding_ids(const std::string& label,
                                                        WorkQueue queue) const {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> ids;
  auto p = pending_.find({label, queue});
  if (p == pending_.end()) return ids;
  for (const auto& [seq, wr_id] : p->second) ids.push_back(wr_id);
  return ids;
}

std::optional<LedgerEntry> CompletionLedger::entry(uint64_t wr_id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(wr_id);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::vector<LedgerViolation> CompletionLedger::violations() const {
  std::lock_guard lock(mu_);
  return violations_;
}

LedgerReport CompletionLedger::check() const {
  std::lock_guard lock(mu_);
  LedgerReport r;
  r.posted = entries_.size();
  for (const auto& [wr_id, e] : entries_) {
    switch (e.outcome) {
      case WrOutcome::SUCCEEDED:
        ++r.succeeded;
        break;
      case WrOutcome::FLUSHED:
        ++r.flushed;
        break;
      case WrOutcome::ERRORED:
        ++r.errored;
        break;
      case WrOutcome::IMPLIED:
        ++r.implied;
        break;
      case WrOutcome::PENDING:
      case WrOutcome::PASSED:
        ++r.unknown;
        r.unknown_wr_ids.push_back(wr_id);
        break;
    }
  }
  r.violations = violations_;
  return r;
}

}  // namespace rdmalab::stack
