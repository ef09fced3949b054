// The history (Jepsen's word): every verb call, completion, async event, state change and
// fault, with host, object, time and sequence number. Checks read it; it exports as JSON lines.
// In the model the same seed yields a byte-identical history.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
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

// One field of a record's data for History::record_fields: a key and a string, integer or
// boolean value, recorded as {key: value} in a JSON object would be, without building one.
struct HistoryField {
  enum class Type : uint8_t { kString, kInt, kUint, kBool };
  HistoryField(std::string_view k, std::string_view v) : key(k), type(Type::kString), str(v) {}
  HistoryField(std::string_view k, const char* v) : HistoryField(k, std::string_view(v)) {}
  HistoryField(std::string_view k, const std::string& v) : HistoryField(k, std::string_view(v)) {}
  template <std::integral T>
  HistoryField(std::string_view k, T v) : key(k) {
    if constexpr (std::same_as<T, bool>) {
      type = Type::kBool;
      b = v;
    } else if constexpr (std::signed_integral<T>) {
      type = Type::kInt;
      i = v;
    } else {
      type = Type::kUint;
      u = v;
    }
  }

  std::string_view key;
  Type type = Type::kString;
  std::string_view str;
  int64_t i = 0;
  uint64_t u = 0;
  bool b = false;
};

class History {
 public:
  using Clock = std::function<TimeNs()>;
  explicit History(Clock clock) : clock_(std::move(clock)) {}

  // Thread-safe: the verbs backend records from its event threads.
  uint64_t record(std::string host, std::string object, std::string kind,
                  nlohmann::json data = nlohmann::json::object());

  // The same record as record() with data {key: value, ...} (keys distinct), written straight
  // into the history: the hot records of the model skip building a JSON object.
  uint64_t record_fields(const std::string& host, const std::string& object,
                         const std::string& kind, std::initializer_list<HistoryField> data);

  std::vector<HistoryRecord> snapshot() const;
  std::vector<HistoryRecord> since(uint64_t seq) const;  // records with seq >= seq
  size_t size() const;
  uint64_t next_seq() const;
  std::string to_jsonl() const;  // one compact JSON object per line, keys sorted
  std::string since_jsonl(uint64_t seq) const;  // to_jsonl's lines of records >= seq
  // since_jsonl(seq) once there is such a record, or "" after `wait`: a follower in another
  // process (an agent's controller) blocks here instead of polling.
  std::string wait_since_jsonl(uint64_t seq, std::chrono::nanoseconds wait) const;

  // Optional observer (metrics, live logs). Called under no lock, after the record is stored.
  void set_observer(std::function<void(const HistoryRecord&)> fn);
  // The observer set now (empty if none), so that a new one can chain it.
  std::function<void(const HistoryRecord&)> observer() const;

 private:
  void append_line_locked(const std::string& line);
  struct Stored {
    uint64_t seq;
    TimeNs t_ns;
    std::function<void(const HistoryRecord&)> observer;  // to call, without the lock
  };
  template <typename WriteData>
  Stored store(const std::string& host, const std::string& object, const std::string& kind,
               const WriteData& write_data);

  Clock clock_;
  mutable std::mutex mu_;
  mutable std::condition_variable grew_;  // a line was appended (wait_since_jsonl)
  // Each record is kept as its JSON line, as to_jsonl exports it: a record costs its ~140
  // bytes of text instead of a JSON object (a map node per field), and export is a copy.
  // Lines fill fixed-size chunks (never moved as the history grows); line i starts at
  // starts_[i] (chunk index << 32 | offset).
  std::vector<std::string> chunks_;
  std::vector<uint64_t> starts_;
  std::function<void(const HistoryRecord&)> observer_;
};

}  // namespace rdmalab
