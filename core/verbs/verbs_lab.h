// The verbs lab: one host, "local", whose devices are this machine's (ibv_get_device_list),
// and whose processes are this process (separate OS processes come with the VM lab). History
// times are CLOCK_MONOTONIC.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rdmalab/lab.h"
#include "verbs/real_runtime.h"
#include "verbs/stall_meter.h"

namespace rdmalab::verbs {

class VerbsCmEventChannel;
class VerbsContext;

class LocalProcess final : public Process {
 public:
  LocalProcess(History* history, std::string host, std::string name);
  const std::string& name() const override { return name_; }
  uint64_t pid() const override;
  bool alive() const override { return true; }
  std::shared_ptr<Context> open_device(const std::string& device_name) override;
  std::shared_ptr<CmEventChannel> create_event_channel() override;
  // A process that is this process cannot be SIGKILLed: EOPNOTSUPP.
  void kill() override;
  // EOPNOTSUPP: `rdma res show` on the host sees it (the VM lab asks the guest).
  std::map<std::string, uint64_t> kernel_objects() const override;
  // Lab shutdown: releases its rdma_cm channels, then closes its contexts, newest first.
  void shutdown();

 private:
  History* history_;
  std::string host_;
  std::string name_;
  std::mutex mu_;
  std::vector<std::shared_ptr<VerbsContext>> contexts_;
  std::vector<std::shared_ptr<VerbsCmEventChannel>> channels_;
};

class LocalHost final : public Host {
 public:
  LocalHost(History* history, std::string name);
  const std::string& name() const override { return name_; }
  std::vector<std::string> device_names() const override;
  DeviceCaps device_caps(const std::string& device_name) const override;
  std::shared_ptr<Process> create_process(const std::string& name) override;
  std::vector<std::shared_ptr<Process>> processes() const override;
  void shutdown();

 private:
  History* history_;
  std::string name_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<LocalProcess>> processes_;
};

class VerbsLab final : public Lab {
 public:
  // host_name: how this machine is named in the scenario ("a", "b", ...; "local" alone).
  explicit VerbsLab(uint64_t seed, std::string host_name = "local");
  ~VerbsLab() override;
  std::string backend() const override { return "verbs"; }
  uint64_t seed() const override { return seed_; }
  Runtime& runtime() override { return runtime_; }
  History& history() override { return history_; }
  std::vector<std::shared_ptr<Host>> hosts() const override { return {host_}; }
  std::shared_ptr<Host> host(const std::string& name) const override;
  void shutdown() override;
  void set_clock_offset(TimeNs offset_ns) { runtime_.set_clock_offset(offset_ns); }
  // How long this machine stood still in [from_ns, to_ns] (StallMeter): what a kernel timer's
  // or an event's time measured here may be late by, beyond the kernel's own rounding.
  TimeNs stalled_ns(TimeNs from_ns, TimeNs to_ns) const { return meter_.stalled_ns(from_ns, to_ns); }

 private:
  uint64_t seed_;
  RealRuntime runtime_;
  History history_;
  std::shared_ptr<LocalHost> host_;
  bool shut_down_ = false;
  StallMeter meter_;  // last: its thread records into history_
};

// Opens device_name ("" = the first) from ibv_get_device_list; ENODEV when there is none.
std::shared_ptr<VerbsContext> open_local_device(const std::string& device_name, History* history,
                                                const std::string& host);

}  // namespace rdmalab::verbs
