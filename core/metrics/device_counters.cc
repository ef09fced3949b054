#include "metrics/device_counters.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>
#include <tuple>

namespace rdmalab::metrics {

namespace fs = std::filesystem;

namespace {

std::optional<uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<uint64_t> read_value(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  return parse_u64(line);
}

std::optional<uint32_t> parse_port(std::string_view s) {
  const auto v = parse_u64(s);
  if (!v || *v > 0xffff) return std::nullopt;
  return static_cast<uint32_t>(*v);
}

// Directory entries, sorted, or none where the directory is missing or unreadable.
std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void read_port(const std::string& device, uint32_t port, const fs::path& port_dir,
               std::vector<DeviceCounter>& out) {
  for (const char* source : {"counters", "hw_counters"}) {
    for (const fs::path& file : entries(port_dir / source)) {
      const std::string name = file.filename().string();
      if (!is_counter_name(name)) continue;
      if (auto v = read_value(file)) out.push_back({device, port, source, name, *v});
    }
  }
}

}  // namespace

bool is_counter_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::vector<DeviceCounter> read_sysfs_counters(const fs::path& root) {
  std::vector<DeviceCounter> out;
  for (const fs::path& dev_dir : entries(root)) {
    const std::string device = dev_dir.filename().string();
    if (!is_counter_name(device)) continue;
    for (const fs::path& port_dir : entries(dev_dir / "ports")) {
      if (auto port = parse_port(port_dir.filename().string())) {
        read_port(device, *port, port_dir, out);
      }
    }
  }
  const auto key = [](const DeviceCounter& c) {
    return std::tie(c.device, c.port, c.source, c.name);
  };
  std::sort(out.begin(), out.end(), [&](const auto& x, const auto& y) { return key(x) < key(y); });
  return out;
}

std::vector<DeviceCounter> parse_rdma_statistic(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::vector<std::string> tokens;
  for (std::string t; in >> t;) tokens.push_back(t);
  std::vector<DeviceCounter> out;
  size_t i = 0;
  while (i < tokens.size()) {
    if (tokens[i] != "link" || i + 1 >= tokens.size()) {
      ++i;
      continue;
    }
    const std::string& link = tokens[i + 1];  // "<dev>/<port>"
    const size_t slash = link.rfind('/');
    i += 2;
    if (slash == std::string::npos) continue;
    const std::string device = link.substr(0, slash);
    const auto port = parse_port(std::string_view(link).substr(slash + 1));
    if (!port || !is_counter_name(device)) continue;
    while (i + 1 < tokens.size() && tokens[i] != "link") {
      const auto v = parse_u64(tokens[i + 1]);
      if (!v || !is_counter_name(tokens[i])) break;
      out.push_back({device, *port, "rdma_statistic", tokens[i], *v});
      i += 2;
    }
  }
  return out;
}

}  // namespace rdmalab::metrics
