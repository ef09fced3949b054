#include "rdmalab/history.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace rdmalab {

namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;

// A string as nlohmann's dump writes it: printable ASCII without quote or backslash as it is
// (every host, object and kind the engine records), anything else through the serializer.
void append_quoted(std::string& out, std::string_view s) {
  for (const char c : s) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
      out += nlohmann::json(std::string(s))
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      return;
    }
  }
  out += '"';
  out += s;
  out += '"';
}

template <typename T>
void append_number(std::string& out, T v) {
  char buf[24];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

// nlohmann's dump(-1) of v, without its per-call string: the values records hold (objects of
// strings, integers and booleans) written here, anything else (floats) by nlohmann.
void append_value(std::string& out, const nlohmann::json& v) {
  using T = nlohmann::json::value_t;
  switch (v.type()) {
    case T::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.get_ref<const nlohmann::json::object_t&>()) {
        if (!first) out += ',';
        first = false;
        append_quoted(out, key);
        out += ':';
        append_value(out, value);
      }
      out += '}';
      return;
    }
    case T::array: {
      out += '[';
      bool first = true;
      for (const auto& value : v.get_ref<const nlohmann::json::array_t&>()) {
        if (!first) out += ',';
        first = false;
        append_value(out, value);
      }
      out += ']';
      return;
    }
    case T::string:
      append_quoted(out, v.get_ref<const std::string&>());
      return;
    case T::number_integer:
      append_number(out, v.get<int64_t>());
      return;
    case T::number_unsigned:
      append_number(out, v.get<uint64_t>());
      return;
    case T::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case T::null:
      out += "null";
      return;
    default:
      out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

// HistoryRecord::to_json().dump(), written field by field (keys in sorted order); the data
// object by write_data. Invalid UTF-8 in a string is replaced (U+FFFD) rather than thrown
// from the middle of the model.
template <typename WriteData>
void append_json_line(std::string& out, uint64_t seq, TimeNs t_ns, const std::string& host,
                      const std::string& object, const std::string& kind,
                      const WriteData& write_data) {
  out += "{\"data\":";
  write_data(out);
  out += ",\"host\":";
  append_quoted(out, host);
  out += ",\"kind\":";
  append_quoted(out, kind);
  out += ",\"object\":";
  append_quoted(out, object);
  out += ",\"seq\":";
  append_number(out, seq);
  out += ",\"t_ns\":";
  append_number(out, t_ns);
  out += "}\n";
}

void append_field_value(std::string& out, const HistoryField& f) {
  switch (f.type) {
    case HistoryField::Type::kString:
      append_quoted(out, f.str);
      return;
    case HistoryField::Type::kInt:
      append_number(out, f.i);
      return;
    case HistoryField::Type::kUint:
      append_number(out, f.u);
      return;
    case HistoryField::Type::kBool:
      out += f.b ? "true" : "false";
      return;
  }
}

nlohmann::json field_json(const HistoryField& f) {
  switch (f.type) {
    case HistoryField::Type::kString:
      return std::string(f.str);
    case HistoryField::Type::kInt:
      return f.i;
    case HistoryField::Type::kUint:
      return f.u;
    case HistoryField::Type::kBool:
      return f.b;
  }
  return nullptr;
}

}  // namespace

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

void History::append_line_locked(const std::string& line) {
  if (chunks_.empty() || chunks_.back().size() + line.size() > chunks_.back().capacity()) {
    chunks_.emplace_back().reserve(std::max(kChunkBytes, line.size()));
  }
  starts_.push_back(uint64_t{chunks_.size() - 1} << 32 | chunks_.back().size());
  chunks_.back() += line;
  grew_.notify_all();
}

// Appends the record's line; returns its seq. The observer, if any, gets the record after.
template <typename WriteData>
History::Stored History::store(const std::string& host, const std::string& object,
                               const std::string& kind, const WriteData& write_data) {
  thread_local std::string line;  // reused: one line's text, no allocation once grown
  std::lock_guard<std::mutex> lock(mu_);
  Stored st{starts_.size(), clock_ ? clock_() : 0, observer_};
  line.clear();
  append_json_line(line, st.seq, st.t_ns, host, object, kind, write_data);
  append_line_locked(line);
  return st;
}

uint64_t History::record(std::string host, std::string object, std::string kind,
                         nlohmann::json data) {
  if (data.is_null()) data = nlohmann::json::object();
  Stored st = store(host, object, kind, [&data](std::string& out) { append_value(out, data); });
  if (st.observer) {
    st.observer(HistoryRecord{st.seq, st.t_ns, std::move(host), std::move(object), std::move(kind),
                              std::move(data)});
  }
  return st.seq;
}

uint64_t History::record_fields(const std::string& host, const std::string& object,
                                const std::string& kind, std::initializer_list<HistoryField> data) {
  // The keys in nlohmann's (std::map's) order: insertion sort of a handful of pointers.
  constexpr size_t kMaxFields = 16;
  if (data.size() > kMaxFields) throw std::logic_error("History::record_fields: too many fields");
  const HistoryField* sorted[kMaxFields];
  size_t n = 0;
  for (const auto& f : data) {
    size_t j = n++;
    while (j > 0 && f.key < sorted[j - 1]->key) {
      sorted[j] = sorted[j - 1];
      --j;
    }
    if (j > 0 && f.key == sorted[j - 1]->key) {
      throw std::logic_error("History::record_fields: key " + std::string(f.key) + " twice");
    }
    sorted[j] = &f;
  }
  Stored st = store(host, object, kind, [&sorted, n](std::string& out) {
    out += '{';
    for (size_t k = 0; k < n; ++k) {
      if (k > 0) out += ',';
      append_quoted(out, sorted[k]->key);
      out += ':';
      append_field_value(out, *sorted[k]);
    }
    out += '}';
  });
  if (st.observer) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& f : data) j[std::string(f.key)] = field_json(f);
    st.observer(HistoryRecord{st.seq, st.t_ns, host, object, kind, std::move(j)});
  }
  return st.seq;
}

std::vector<HistoryRecord> History::snapshot() const {
  return since(0);
}

std::vector<HistoryRecord> History::since(uint64_t seq) const {
  const std::string text = since_jsonl(seq);
  std::vector<HistoryRecord> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    out.push_back(HistoryRecord::from_json(
        nlohmann::json::parse(text.begin() + static_cast<std::ptrdiff_t>(pos),
                              text.begin() + static_cast<std::ptrdiff_t>(end))));
    pos = end + 1;
  }
  return out;
}

size_t History::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return starts_.size();
}

uint64_t History::next_seq() const {
  return size();
}

std::string History::to_jsonl() const {
  return since_jsonl(0);
}

std::string History::since_jsonl(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq >= starts_.size()) return {};
  const size_t first = starts_[seq] >> 32;
  const size_t offset = starts_[seq] & 0xffffffffU;
  size_t total = chunks_[first].size() - offset;
  for (size_t c = first + 1; c < chunks_.size(); ++c) total += chunks_[c].size();
  std::string out;
  out.reserve(total);
  out.append(chunks_[first], offset);
  for (size_t c = first + 1; c < chunks_.size(); ++c) out += chunks_[c];
  return out;
}

std::string History::wait_since_jsonl(uint64_t seq, std::chrono::nanoseconds wait) const {
  {
    std::unique_lock<std::mutex> lock(mu_);
    grew_.wait_for(lock, wait, [&] { return seq < starts_.size(); });
  }
  return since_jsonl(seq);
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
