// Hosts and processes of the model lab. A process owns the contexts it opened (and through
// them every object); kill() is SIGKILL: uverbs releases everything without waiting for acks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/device.h"
#include "model/env.h"
#include "model/objects.h"
#include "rdmalab/lab.h"

namespace rdmalab::model {

class ModelCmEventChannel;
class ModelContext;
class ModelHost;

class ModelProcess final : public Process {
 public:
  ModelProcess(Env& env, ModelHost& host, std::string name, uint64_t pid);
  const std::string& name() const override { return name_; }
  uint64_t pid() const override { return pid_; }
  bool alive() const override { return alive_ && token_->alive; }
  std::shared_ptr<Context> open_device(const std::string& device_name) override;
  std::shared_ptr<CmEventChannel> create_event_channel() override;
  void kill() override;
  std::map<std::string, uint64_t> kernel_objects() const override;
  // Reboot: dies as kill() does, recorded as part of the host fault, not as a "kill" fault.
  void crash();
  // The context librdmacm opens for the process's rdma_cm ids (one, opened on first use).
  std::shared_ptr<Context> cm_context();

  std::string label() const { return "proc:" + name_; }
  ModelHost& host() const { return host_; }
  void context_closed(const ModelContext* ctx);
  // Lab shutdown: closes every context (newest first).
  void shutdown();
  std::string dump() const;

 private:
  void release_everything(Release why);

  Env& env_;
  std::shared_ptr<LabToken> token_;
  ModelHost& host_;
  std::string name_;
  uint64_t pid_;
  bool alive_ = true;
  std::vector<std::shared_ptr<ModelContext>> contexts_;
  std::vector<std::shared_ptr<ModelCmEventChannel>> channels_;
  std::shared_ptr<Context> cm_ctx_;
};

class ModelHost final : public Host {
 public:
  ModelHost(Env& env, Fabric& fabric, std::string name, const Personality& p, int index);
  const std::string& name() const override { return name_; }
  // A device being removed is listed no more (its uverbs cdev goes first).
  std::vector<std::string> device_names() const override {
    if (device_->removal != Device::Removal::kNone) return {};
    return {device_->caps.name};
  }
  DeviceCaps device_caps(const std::string& device_name) const override;
  std::shared_ptr<Process> create_process(const std::string& name) override;
  std::vector<std::shared_ptr<Process>> processes() const override;

  Device& device() const { return *device_; }
  // ModelLab::reboot: every process dies at once, the CM and the device lose their state.
  void crash();
  void shutdown();
  std::string dump() const;

 private:
  Env& env_;
  std::shared_ptr<LabToken> token_;
  std::string name_;
  std::unique_ptr<Device> device_;
  std::vector<std::shared_ptr<ModelProcess>> processes_;
};

}  // namespace rdmalab::model
