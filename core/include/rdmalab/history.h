// The history (Jepsen's word): every verb call, completion, async event, state change and
// fault, with host, object, time and sequence number. Checks read it; it exports as JSON lines.
// In the model the same seed yields a byte-identical history.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rdmalab/types.h"

namespace rdmalab {

struct HistoryRecord {
  uint64_t seq = 0;
  TimeNs t_ns = 0;
  std::string host;    // "" for lab-wide records
  std::string object;  // "qp:3", "cq:1", "proc:server", "fabric"
  std::string kind;    // "wc", "async_event", "qp_state", "verb", "fault", "handler_begin", ...
  nlohmann::json data = nlohmann::json::object();

  nlohmann::json to_json() const;
  static HistoryRecord from_json(const nlohmann::json& j);
};

class History {
 public:
  using Clock = std::function<TimeNs()>;
  explicit History(Clock clock) : clock_(std::move(clock)) {}

  // Thread-safe: the verbs backend records from its event threads.
  uint64_t record(std::string host, std::string object, std::string kind,
                  nlohmann::json data = nlohmann::json::object());

  std::vector<HistoryRecord> snapshot() const;
  std::vector<HistoryRecord> since(uint64_t seq) const;  // records with seq >= seq
  size_t size() const;
  uint64_t next_seq() const;
  std::string to_jsonl() const;  // one compact JSON object per line, keys sorted

  // Optional observer (metrics, live logs). Called under no lock, after the record is stored.
  void set_observer(std::function<void(const HistoryRecord&)> fn);
  // The observer set now (empty if none), so that a new one can chain it.
  std::function<void(const HistoryRecord&)> observer() const;

 private:
  Clock clock_;
  mutable std::mutex mu_;
  std::vector<HistoryRecord> records_;
  std::function<void(const HistoryRecord&)> observer_;
};

}  // namespace rdmalab
