// The switch's control socket: newline-delimited JSON requests, one reply each (switch.h).
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <set>
#include <string_view>
#include <system_error>

#include "faults/switch.h"

namespace rdmalab::faults {
namespace {

using nlohmann::json;

enum class Op { kPing, kAddRule, kRemoveRule, kClear, kRules, kCounters, kHistory, kHosts, kPcap };

struct OpInfo {
  Op op;
  const char* name;
  std::array<const char*, 2> keys;  // besides "op"
};
constexpr std::array<OpInfo, 9> kOps = {{
    {Op::kPing, "ping", {}},
    {Op::kAddRule, "add_rule", {"rule"}},
    {Op::kRemoveRule, "remove_rule", {"id"}},
    {Op::kClear, "clear", {}},
    {Op::kRules, "rules", {}},
    {Op::kCounters, "counters", {}},
    {Op::kHistory, "history", {"since", "limit"}},
    {Op::kHosts, "hosts", {"hosts"}},
    {Op::kPcap, "pcap", {"path", "max_bytes"}},
}};

// A bad request; the message names the field.
struct RequestError {
  std::string message;
};

json error(const std::string& msg) {
  return {{"ok", false}, {"error", msg}};
}

const OpInfo& lookup(const json& req) {
  if (!req.is_object()) throw RequestError{"request: expected a JSON object"};
  if (!req.contains("op") || !req["op"].is_string()) {
    std::string names;
    for (const auto& o : kOps) names += (names.empty() ? "" : ", ") + std::string(o.name);
    throw RequestError{"op: missing or not a string (" + names + ")"};
  }
  const std::string op = req["op"].get<std::string>();
  for (const auto& o : kOps) {
    if (op != o.name) continue;
    for (const auto& item : req.items()) {
      const std::string& key = item.key();
      const auto is = [&key](const char* k) { return k != nullptr && key == k; };
      if (key == "op" || is(o.keys[0]) || is(o.keys[1])) continue;
      throw RequestError{key + ": not a key of op " + op};
    }
    return o;
  }
  throw RequestError{"op: unknown op '" + op + "'"};
}

uint64_t get_uint(const json& req, const char* key, uint64_t dflt) {
  if (!req.contains(key)) return dflt;
  const json& v = req[key];
  if (!v.is_number_unsigned()) throw RequestError{std::string(key) + ": expected an integer >= 0"};
  return v.get<uint64_t>();
}

}  // namespace

json Switch::handle(const json& req) {
  try {
    const OpInfo& info = lookup(req);
    switch (info.op) {
      case Op::kPing:
        return {{"ok", true}};
      case Op::kAddRule: {
        if (!req.contains("rule")) throw RequestError{"rule: missing"};
        return {{"ok", true}, {"id", rules_.add(parse_rule(req["rule"]))}};
      }
      case Op::kRemoveRule: {
        if (!req.contains("id")) throw RequestError{"id: missing"};
        const uint64_t id = get_uint(req, "id", 0);
        if (!rules_.remove(id)) return error("id: no rule " + std::to_string(id));
        return {{"ok", true}};
      }
      case Op::kClear:
        return {{"ok", true}, {"removed", rules_.clear()}};
      case Op::kRules:
        return {{"ok", true}, {"rules", rules_.rules_json()}};
      case Op::kCounters:
        return {{"ok", true}, {"counters", counters_json()}};
      case Op::kHistory: {
        json h = rules_.history_json(get_uint(req, "since", 0), get_uint(req, "limit", 10'000));
        h["ok"] = true;
        return h;
      }
      case Op::kHosts:
        if (req.contains("hosts")) rules_.set_hosts(parse_hosts(req["hosts"]));
        return {{"ok", true}, {"hosts", hosts_json(rules_.hosts())}};
      case Op::kPcap: {
        if (!req.contains("path")) throw RequestError{"path: missing (a file name, or null)"};
        const json& p = req["path"];
        if (!p.is_null() && !p.is_string()) throw RequestError{"path: expected a string or null"};
        const uint64_t max_bytes = get_uint(req, "max_bytes", 0);
        // The capture that ends: what it wrote and what its cap kept out.
        json closed = nullptr;
        if (pcap_)
          closed = {{"path", pcap_->path()},
                    {"frames", pcap_->frames()},
                    {"skipped", pcap_->skipped()}};
        pcap_.reset();  // the old capture ends even if the new file cannot be opened
        if (!p.is_null()) pcap_.emplace(p.get<std::string>(), max_bytes);
        return {{"ok", true}, {"path", p}, {"closed", closed}};
      }
    }
    return error("op: not handled");
  } catch (const RequestError& e) {
    return error(e.message);
  } catch (const RuleError& e) {
    return error(e.what());
  } catch (const std::system_error& e) {
    return error(e.what());
  } catch (const json::exception& e) {
    return error(std::string("request: ") + e.what());
  }
}

json Switch::counters_json() const {
  json c = rules_.counters_json();
  c["frames"]["no_sender"] = fwd_.no_sender;
  c["frames"]["received"] = fwd_.received;
  c["forward"] = {{"sent", fwd_.sent},
                  {"flooded", fwd_.flooded},
                  {"peer_down", fwd_.peer_down},
                  {"send_errors", fwd_.send_errors},
                  {"released", fwd_.released},
                  {"released_by",
                   {{"delay_elapsed", fwd_.delay_elapsed},
                    {"next_frame", fwd_.next_frame},
                    {"hold_deadline", fwd_.hold_deadline}}},
                  {"dropped_at_shutdown", fwd_.dropped_at_shutdown},
                  {"pending", pending_.size()},
                  {"pcap_errors", fwd_.pcap_errors}};
  return c;
}

void Switch::accept_clients() {
  for (;;) {
    Fd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return;
    auto c = std::make_unique<Client>();
    c->fd = std::move(fd);
    clients_.push_back(std::move(c));
  }
}

void Switch::read_client(Client& c) {
  std::array<char, 65536> buf;
  while (!c.read_closed && !c.close_after_flush) {
    const ssize_t n = ::recv(c.fd.get(), buf.data(), buf.size(), 0);
    if (n == 0) {
      c.read_closed = true;
      c.in.clear();  // a request cut off by the disconnect is not acted on
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) c.fd.reset();
      return;
    }
    const size_t scanned = c.in.size();
    c.in.append(buf.data(), static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl = c.in.find('\n', scanned); nl != std::string::npos;
         nl = c.in.find('\n', start)) {
      const std::string line = c.in.substr(start, nl - start);
      start = nl + 1;
      handle_line(c, line);
      if (c.close_after_flush) return;  // an over-long line: nothing after it is read
    }
    c.in.erase(0, start);
    if (c.in.size() > o_.max_line) return handle_line(c, c.in);
  }
}

void Switch::handle_line(Client& c, const std::string& line) {
  json reply;
  if (line.size() > o_.max_line) {
    reply = error("request: line longer than " + std::to_string(o_.max_line) +
                  " bytes; closing the connection");
    c.close_after_flush = true;
    c.in.clear();
  } else if (line.find_first_not_of(" \t\r") == std::string::npos) {
    return;  // blank lines are not requests
  } else {
    const json req = json::parse(line, nullptr, /*allow_exceptions=*/false);
    reply = req.is_discarded() ? error("request: not valid JSON") : handle(req);
  }
  c.out += reply.dump(-1, ' ', false, json::error_handler_t::replace);
  c.out += '\n';
}

void Switch::write_client(Client& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        c.fd.reset();
        c.out.clear();
      }
      return;
    }
    c.out.erase(0, static_cast<size_t>(n));
  }
}

}  // namespace rdmalab::faults
