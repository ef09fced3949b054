#include "rdmalab/history.h"

namespace rdmalab {

nlohmann::json HistoryRecord::to_json() const {
  // nlohmann::json objects keep keys sorted: the export is byte-stable for one history.
  return nlohmann::json{{"seq", seq},       {"t_ns", t_ns}, {"host", host},
                        {"object", object}, {"kind", kind}, {"data", data}};
}

HistoryRecord HistoryRecord::from_json(const nlohmann::json& j) {
  HistoryRecord r;
  r.seq = j.at("seq").get<uint64_t>();
  r.t_ns = j.at("t_ns").get<TimeNs>();
  r.host = j.at("host").get<std::string>();
  r.object = j.at("object").get<std::string>();
  r.kind = j.at("kind").get<std::string>();
  r.data = j.value("data", nlohmann::json::object());
  return r;
}

uint64_t History::record(std::string host, std::string object, std::string kind,
                         nlohmann::json data) {
  HistoryRecord copy;
  std::function<void(const HistoryRecord&)> observer;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    HistoryRecord r;
    r.seq = seq = records_.size();
    r.t_ns = clock_ ? clock_() : 0;
    r.host = std::move(host);
    r.object = std::move(object);
    r.kind = std::move(kind);
    r.data = data.is_null() ? nlohmann::json::object() : std::move(data);
    records_.push_back(std::move(r));
    if (observer_) {
      observer = observer_;
      copy = records_.back();
    }
  }
  if (observer) observer(copy);
  return seq;
}

std::vector<HistoryRecord> History::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

std::vector<HistoryRecord> History::since(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq >= records_.size()) return {};
  return {records_.begin() + static_cast<std::ptrdiff_t>(seq), records_.end()};
}

size_t History::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_.size();
}

uint64_t History::next_seq() const {
  return size();
}

std::string History::to_jsonl() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& r : records_) {
    out += r.to_json().dump();
    out += '\n';
  }
  return out;
}

void History::set_observer(std::function<void(const HistoryRecord&)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = std::move(fn);
}

std::function<void(const HistoryRecord&)> History::observer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return observer_;
}

}  // namespace rdmalab
