// Where hosts come from. A Lab hands a scenario its hosts; a Host runs processes; a Process
// opens devices and owns what it creates. The model lab and (later) the VM and inventory labs
// implement this; scenarios see only this interface.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rdmalab/cm.h"
#include "rdmalab/history.h"
#include "rdmalab/runtime.h"
#include "rdmalab/verbs.h"

namespace rdmalab {

class Process {
 public:
  virtual ~Process() = default;
  virtual const std::string& name() const = 0;
  virtual uint64_t pid() const = 0;
  virtual bool alive() const = 0;
  // ibv_open_device; "" = the host's first device.
  virtual std::shared_ptr<Context> open_device(const std::string& device_name) = 0;
  // rdma_create_event_channel: the process's rdma_cm channel (librdmacm opens the device
  // contexts it needs itself).
  virtual std::shared_ptr<CmEventChannel> create_event_channel() = 0;
  // SIGKILL: the kernel releases every handle the process held (uverbs cleanup), without
  // waiting for event acks; objects shared with other processes live on by their own rules.
  virtual void kill() = 0;
  // What the kernel holds for the process, by kind as `rdma res show` names them (ctx, pd,
  // cq, qp, srq, mr, cm_id, xrcd); kinds with none left out. EOPNOTSUPP where the backend
  // cannot see it.
  virtual std::map<std::string, uint64_t> kernel_objects() const = 0;
};

class Host {
 public:
  virtual ~Host() = default;
  virtual const std::string& name() const = 0;
  virtual std::vector<std::string> device_names() const = 0;
  virtual DeviceCaps device_caps(const std::string& device_name) const = 0;
  virtual std::shared_ptr<Process> create_process(const std::string& name) = 0;
  virtual std::vector<std::shared_ptr<Process>> processes() const = 0;
};

class Lab {
 public:
  virtual ~Lab() = default;
  virtual std::string backend() const = 0;  // "model", "verbs"
  virtual uint64_t seed() const = 0;
  virtual Runtime& runtime() = 0;
  virtual History& history() = 0;
  virtual std::vector<std::shared_ptr<Host>> hosts() const = 0;
  virtual std::shared_ptr<Host> host(const std::string& name) const = 0;  // Error(ENOENT)
  // Stops harness threads and releases every resource. Idempotent.
  virtual void shutdown() = 0;
};

}  // namespace rdmalab
