// The model lab: hosts with one model device each, the fabric between them, the fault verbs.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/env.h"
#include "model/fabric.h"
#include "model/process.h"
#include "rdmalab/model.h"

namespace rdmalab::model {

class ModelLabImpl final : public ModelLab {
 public:
  explicit ModelLabImpl(const LabOptions& opts);
  ~ModelLabImpl() override;

  std::string backend() const override { return "model"; }
  uint64_t seed() const override { return env_->seed; }
  Runtime& runtime() override { return env_->runtime; }
  History& history() override { return env_->history; }
  std::vector<std::shared_ptr<Host>> hosts() const override;
  std::shared_ptr<Host> host(const std::string& name) const override;
  void shutdown() override;

  void run_until(TimeNs deadline_ns) override;
  void at(TimeNs t_ns, std::function<void()> fn) override;
  uint64_t add_rule(const nlohmann::json& rule) override;
  bool remove_rule(uint64_t id) override;
  size_t clear_rules() override;
  nlohmann::json rules() const override;
  void set_fabric(const FabricOptions& opts) override;
  void set_verb_hook(VerbHook hook) override;
  void inject_async_event(const std::string& host, AsyncEventType type, uint32_t number,
                          TimeNs driver_delay_ns) override;
  void set_port_state(const std::string& host, bool up) override;
  void device_fatal(const std::string& host) override;
  void rdma_link_delete(const std::string& host) override;
  bool rdma_link_removal_pending(const std::string& host) const override;
  void rdma_link_add(const std::string& host) override;
  void reboot(const std::string& host, TimeNs down_ns) override;
  std::map<std::string, uint64_t> fault_counts() const override { return env_->fault_counts; }
  std::string dump_state() const override;

  // For other parts of the model (a CM on the fabric, fault rules): the shared state, the
  // fabric (Fabric::send carries any packet, e.g. opcode "MAD"), a host's device.
  Env& env() { return *env_; }
  Fabric& fabric() { return *fabric_; }
  Device& device(const std::string& host) const { return device_of("device", host); }

 private:
  Device& device_of(const std::string& verb, const std::string& host) const;
  void check_alive(const std::string& verb) const;

  std::unique_ptr<Env> env_;  // first in, last out: timers and threads live in it
  std::unique_ptr<Fabric> fabric_;
  std::vector<std::shared_ptr<ModelHost>> hosts_;
  bool shut_down_ = false;
};

}  // namespace rdmalab::model
