// A host's RDMA device counters, as the kernel shows them: sysfs
// /sys/class/infiniband/<dev>/ports/<port>/{counters,hw_counters}/<name> (IBTA PortCounters and
// the driver's own counters) and `rdma statistic show` (iproute2; the hw counters over netlink).
// The metrics exporter publishes them beside the engine's metrics; the VM lab reads them in
// each guest and hands them to the controller's exporter.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace rdmalab::metrics {

inline constexpr const char* kSysfsRoot = "/sys/class/infiniband";

struct DeviceCounter {
  std::string device;  // "mlx5_0", "rxe0"
  uint32_t port = 0;
  std::string source;  // "counters", "hw_counters" (sysfs) or "rdma_statistic"
  std::string name;    // "port_xmit_data", "sent_pkts", ...
  uint64_t value = 0;

  bool operator==(const DeviceCounter&) const = default;
};

// Every counter under root (a missing root, as on a host without RDMA devices, gives none).
// Files that cannot be read or parsed (some counters are write-only or report "N/A") and names
// that are not Prometheus label-safe are skipped. Sorted by device, port, source, name.
std::vector<DeviceCounter> read_sysfs_counters(const std::filesystem::path& root = kSysfsRoot);

// `rdma statistic show` text: "link <dev>/<port> <name> <value> <name> <value> ..." per link,
// possibly wrapped over lines. Tokens that break the pattern end the link's list.
std::vector<DeviceCounter> parse_rdma_statistic(std::string_view text);

// True for names made of [A-Za-z0-9_] (what a counter name may be to become a label value
// the dashboards can match on).
bool is_counter_name(std::string_view name);

}  // namespace rdmalab::metrics
