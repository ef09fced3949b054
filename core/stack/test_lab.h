// Test fixture for the stack tests: a two-host model lab ("a", "b") of one personality, with
// a process, device, PD, CQ and MR per host, and helpers for RC QPs brought up between them.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "rdmalab/model.h"
#include "stack/connect.h"

namespace rdmalab::stack::fixture {

struct Side {
  std::shared_ptr<Host> host;
  std::shared_ptr<Process> proc;
  std::shared_ptr<Context> ctx;
  std::shared_ptr<Pd> pd;
  std::shared_ptr<Cq> cq;
  std::shared_ptr<Mr> mr;
};

class TwoHosts {
 public:
  explicit TwoHosts(const std::string& personality, uint64_t seed = 1) {
    model::LabOptions opts;
    opts.seed = seed;
    opts.hosts = {{"a", personality, std::nullopt}, {"b", personality, std::nullopt}};
    lab = model::make_lab(opts);
    a = open_side("a");
    b = open_side("b");
  }
  ~TwoHosts() { lab->shutdown(); }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  Runtime& rt() { return lab->runtime(); }
  History& history() { return lab->history(); }
  TimeNs in(TimeNs d) { return rt().now_ns() + d; }

  std::shared_ptr<Qp> create_rc(Side& s, std::shared_ptr<Srq> srq = nullptr, uint32_t depth = 128) {
    QpInitAttr attr;
    attr.qp_type = QpType::RC;
    attr.pd = s.pd;
    attr.send_cq = s.cq;
    attr.recv_cq = s.cq;
    attr.srq = std::move(srq);
    attr.cap.max_send_wr = depth;
    attr.cap.max_recv_wr = depth;
    return s.ctx->create_qp(attr);
  }

  // Creates and brings up one RC QP on each side, connected to each other.
  std::pair<std::shared_ptr<Qp>, std::shared_ptr<Qp>> connected_pair(
      std::shared_ptr<Srq> srq_a = nullptr) {
    auto qa = create_rc(a, std::move(srq_a));
    auto qb = create_rc(b);
    const Endpoint ea = local_endpoint(*a.ctx, *qa, 100);
    const Endpoint eb = local_endpoint(*b.ctx, *qb, 200);
    bring_up(*qa, ea, eb);
    bring_up(*qb, eb, ea);
    return {qa, qb};
  }

  static SendWr send_wr(const Side& s, uint32_t len, uint64_t offset = 0) {
    SendWr wr;
    wr.opcode = WrOpcode::SEND;
    wr.sg_list = {Sge{s.mr->addr() + offset, len, s.mr->lkey()}};
    return wr;
  }
  static RecvWr recv_wr(const Side& s, uint32_t len, uint64_t offset = 0) {
    RecvWr wr;
    wr.sg_list = {Sge{s.mr->addr() + offset, len, s.mr->lkey()}};
    return wr;
  }

  // Every packet from host a to host b is lost: a's sends stay outstanding.
  void cut_a_to_b() {
    lab->add_rule({{"action", "drop"}, {"direction", "a->b"}});
  }

  std::shared_ptr<model::ModelLab> lab;
  Side a;
  Side b;

 private:
  Side open_side(const std::string& name) {
    Side s;
    s.host = lab->host(name);
    s.proc = s.host->create_process("p-" + name);
    s.ctx = s.proc->open_device("");
    s.pd = s.ctx->alloc_pd();
    s.cq = s.ctx->create_cq(512);
    s.mr = s.ctx->reg_mr(*s.pd, uint64_t{64} * 1024,
                         ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ);
    return s;
  }
};

}  // namespace rdmalab::stack::fixture
