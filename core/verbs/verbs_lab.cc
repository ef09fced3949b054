#include "verbs/verbs_lab.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "verbs/cm.h"
#include "verbs/context.h"
#include "verbs/handles.h"

namespace rdmalab::verbs {

namespace {
constexpr TimeNs kStallRecordNs = 20 * kNsPerMs;
constexpr const char* kNoDevice = "no RDMA device (ibv_get_device_list is empty)";

// RDMALAB_DEVICES: the devices of this host, comma-separated, where hosts share one kernel's
// device list (the netns lab: every namespace sees every rxe device) or a machine has more
// devices than the lab's (an inventory's `device`). Unset or empty: every device.
std::vector<std::string> allowed_devices() {
  std::vector<std::string> names;
  const char* env = std::getenv("RDMALAB_DEVICES");
  std::string_view rest = env == nullptr ? "" : env;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    if (!name.empty()) names.emplace_back(name);
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
  }
  return names;
}

bool allowed(const std::vector<std::string>& names, const char* device) {
  return names.empty() || std::find(names.begin(), names.end(), device) != names.end();
}
}  // namespace

std::shared_ptr<VerbsContext> open_local_device(const std::string& device_name, History* history,
                                                const std::string& host) {
  int n = 0;
  DeviceList list = get_device_list(&n);
  if (n == 0) throw Error("ibv_open_device", ENODEV, kNoDevice);
  const std::vector<std::string> mine = allowed_devices();
  for (int i = 0; i < n; ++i) {
    ibv_device* dev = list.get()[i];
    const char* name = ibv_get_device_name(dev);
    if ((device_name.empty() || device_name == name) && allowed(mine, name)) {
      return std::make_shared<VerbsContext>(dev, history, host);
    }
  }
  if (!mine.empty()) {
    std::string list_text;
    for (const auto& m : mine) list_text += (list_text.empty() ? "" : ",") + m;
    throw Error("ibv_open_device", ENODEV,
                (device_name.empty() ? std::string("no RDMA device")
                                     : "no RDMA device named " + device_name) +
                    " among this host's (RDMALAB_DEVICES=" + list_text + ")");
  }
  throw Error("ibv_open_device", ENODEV, "no RDMA device named " + device_name);
}

// --- process
LocalProcess::LocalProcess(History* history, std::string host, std::string name)
    : history_(history), host_(std::move(host)), name_(std::move(name)) {}

uint64_t LocalProcess::pid() const {
  return static_cast<uint64_t>(::getpid());
}

std::shared_ptr<Context> LocalProcess::open_device(const std::string& device_name) {
  auto ctx = open_local_device(device_name, history_, host_);
  std::lock_guard<std::mutex> lock(mu_);
  contexts_.push_back(ctx);
  return ctx;
}

std::shared_ptr<CmEventChannel> LocalProcess::create_event_channel() {
  auto ch = std::make_shared<VerbsCmEventChannel>(history_, host_);
  ch->start();
  std::lock_guard<std::mutex> lock(mu_);
  channels_.push_back(ch);
  return ch;
}

void LocalProcess::kill() {
  throw Error("kill", EOPNOTSUPP,
              "proc:" + name_ + " lives in the harness's own process (or the host agent's): SIGKILL needs a process of its own, lab.killable_process(host, name)");
}

std::map<std::string, uint64_t> LocalProcess::kernel_objects() const {
  throw Error("kernel_objects", EOPNOTSUPP,
              "proc:" + name_ + ": the harness does not read rdma res of its own process");
}

void LocalProcess::shutdown() {
  std::vector<std::shared_ptr<VerbsContext>> contexts;
  std::vector<std::shared_ptr<VerbsCmEventChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    contexts.swap(contexts_);
    channels.swap(channels_);
  }
  // Newest first, as a process exit unwinds.
  std::reverse(channels.begin(), channels.end());
  std::reverse(contexts.begin(), contexts.end());
  for (auto& ch : channels) ch->release();
  if (!channels.empty()) close_cm_contexts();
  for (auto& ctx : contexts) {
    try {
      if (!ctx->destroyed()) ctx->close();
    } catch (const Error& e) {  // shutdown goes on; the failure is in the history
      if (history_ != nullptr) {
        history_->record(host_, ctx->label(), "shutdown_error",
                         {{"verb", e.verb()}, {"errno", e.err()}, {"detail", e.detail()}});
      }
    }
  }
}

// --- host
LocalHost::LocalHost(History* history, std::string name)
    : history_(history), name_(std::move(name)) {}

std::vector<std::string> LocalHost::device_names() const {
  int n = 0;
  DeviceList list = get_device_list(&n);
  const std::vector<std::string> mine = allowed_devices();
  std::vector<std::string> names;
  names.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const char* name = ibv_get_device_name(list.get()[i]);
    if (allowed(mine, name)) names.emplace_back(name);
  }
  return names;
}

DeviceCaps LocalHost::device_caps(const std::string& device_name) const {
  auto ctx = open_local_device(device_name, nullptr, name_);
  DeviceCaps caps = ctx->caps();
  ctx->close();
  return caps;
}

std::shared_ptr<Process> LocalHost::create_process(const std::string& name) {
  auto p = std::make_shared<LocalProcess>(history_, name_, name);
  std::lock_guard<std::mutex> lock(mu_);
  processes_.push_back(p);
  return p;
}

std::vector<std::shared_ptr<Process>> LocalHost::processes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {processes_.begin(), processes_.end()};
}

void LocalHost::shutdown() {
  std::vector<std::shared_ptr<LocalProcess>> procs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    procs = processes_;
  }
  std::reverse(procs.begin(), procs.end());
  for (auto& p : procs) p->shutdown();
}

// --- lab
VerbsLab::VerbsLab(uint64_t seed, std::string host_name)
    : seed_(seed),
      history_([this] { return runtime_.now_ns(); }),
      host_(std::make_shared<LocalHost>(&history_, std::move(host_name))),
      meter_([this] { return runtime_.now_ns(); }, [this](const StallMeter::Stall& s) {
        // Only the stalls long enough to matter to a scenario's bounds go into the history.
        if (s.late_ns >= kStallRecordNs) {
          history_.record(host_->name(), "machine", "stall", {{"late_ns", s.late_ns}});
        }
      }) {
  attach_process_meter(&meter_);  // the verbs waits' deadlines (process_wait_slice_ns)
}

VerbsLab::~VerbsLab() {
  shutdown();  // detaches and stops the meter
}

std::shared_ptr<Host> VerbsLab::host(const std::string& name) const {
  if (name != host_->name()) throw Error("host", ENOENT, "no host " + name + " in the verbs lab");
  return host_;
}

void VerbsLab::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  runtime_.shutdown();  // harness threads first: they may still use the objects
  host_->shutdown();
  detach_process_meter(&meter_);  // the next lab's waits use the next lab's meter
  meter_.stop();
}

}  // namespace rdmalab::verbs
