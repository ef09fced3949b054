// The C++ engine alone, as the reference for bench/model.py's Python-driven figures: the same
// scenarios through the C++ API that rdmalab.api.resources.CmPair and the DREP-loss scenario
// (tests/scenarios/test_cm.py::test_every_drep_dropped) drive from Python.
//
//   rdmalab_bench_model [--drep-runs N] [--cycles N] [--cycle-seconds S] [--labs N]
//
// drep: a connected pair (roce), every DREP dropped, the client disconnects, the server
//       answers, the client's DREQs run out (DISCONNECTED ETIMEDOUT ~102 s later), then
//       TIMEWAIT_EXIT. Each run on a fresh lab; prints the median wall time.
// cycles: one lab, two processes made once; per cycle two event channels with pumps, listen,
//       connect, accept, ESTABLISHED on both sides, an MR per side, disconnect from the client,
//       close both channels: what one iteration of bench/model.py's cycle loop does.
// labs: make a model lab with 2 and with 4 hosts, a process and an event channel (pump
//       started) on each, and shut it down: a swarm seed's fixed cost.
// Prints one JSON object on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rdmalab/error.h"
#include "rdmalab/model.h"
#include "stack/connection.h"

namespace rdmalab::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kAccess = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::shared_ptr<model::ModelLab> make_model_lab(uint64_t seed, int hosts) {
  model::LabOptions opts;
  opts.seed = seed;
  for (int i = 0; i < hosts; ++i) {
    opts.hosts.push_back({std::string(1, static_cast<char>('a' + i)), "roce", {}});
  }
  return model::make_lab(opts);
}

// The fault of the DREP-loss scenario: every CM DREP on the wire is lost.
void drop_every_drep(model::ModelLab& lab) {
  lab.add_rule({{"cm", "DREP"}, {"action", "drop"}});
}

// One side of a connection as CmPair holds it: the id's PD, CQ, QP and an MR.
struct Side {
  stack::CmConnection conn;
  std::shared_ptr<Mr> mr;
};

struct Pair {
  Pair(Lab& lab, Process& server_proc, Process& client_proc, uint16_t port)
      : rt(lab.runtime()),
        server(rt, server_proc.create_event_channel(), &lab.history(), "b"),
        client(rt, client_proc.create_event_channel(), &lab.history(), "a") {
    server.start();
    client.start();
    listener = stack::cm_listen(server, port);
    stack::CmEndpointSpec spec;
    spec.dst = "b";
    spec.port = port;
    c.conn = stack::cm_connect(client, spec, in(kNsPerSec));
    auto req = server.next_connect_request(listener->id(), in(kNsPerSec));
    if (!req) throw std::runtime_error("no CONNECT_REQUEST");
    s.conn = stack::cm_accept(server, server.channel().find_id(req->id), spec);
    stack::cm_await(client, *c.conn.id, CmEventType::ESTABLISHED, in(kNsPerSec), "active side");
    stack::cm_await(server, *s.conn.id, CmEventType::ESTABLISHED, in(kNsPerSec), "passive side");
    for (Side* side : {&c, &s}) {
      side->mr = side->conn.id->context()->reg_mr(*side->conn.pd, 4096, kAccess);
    }
  }

  TimeNs in(TimeNs d) const { return rt.now_ns() + d; }

  void disconnect() {
    c.conn.id->disconnect();
    stack::cm_await(server, *s.conn.id, CmEventType::DISCONNECTED, in(kNsPerSec), "passive side");
    s.conn.id->disconnect();
    stack::cm_await(client, *c.conn.id, CmEventType::DISCONNECTED, in(kNsPerSec), "active side");
  }

  // CmPair.close: MRs, then each channel's ids, its pump, the channel.
  void close() {
    c.mr->dereg();
    s.mr->dereg();
    stack::cm_close(client, c.conn, in(kNsPerSec));
    client.stop(in(kNsPerSec));
    client.channel().destroy();
    stack::CmConnection l{listener, nullptr, nullptr, nullptr};
    stack::cm_close(server, s.conn, in(kNsPerSec));
    stack::cm_close(server, l, in(kNsPerSec));
    server.stop(in(kNsPerSec));
    server.channel().destroy();
  }

  Runtime& rt;
  stack::CmEventPump server;
  stack::CmEventPump client;
  std::shared_ptr<CmId> listener;
  Side c, s;
};

nlohmann::json drep_once(uint64_t seed) {
  const auto t0 = Clock::now();
  auto lab = make_model_lab(seed, 2);
  auto server_proc = lab->host("b")->create_process("cm-server");
  auto client_proc = lab->host("a")->create_process("cm-client");
  const auto t_call = Clock::now();
  Pair p(*lab, *server_proc, *client_proc, 7471);
  drop_every_drep(*lab);
  const TimeNs v0 = lab->runtime().now_ns();
  p.c.conn.id->disconnect();
  stack::cm_await(p.server, *p.s.conn.id, CmEventType::DISCONNECTED, p.in(100 * kNsPerMs),
                  "passive side");
  p.s.conn.id->disconnect();  // its DREP is lost
  const CmEvent ev = stack::cm_await(p.client, *p.c.conn.id, CmEventType::DISCONNECTED,
                                     p.in(120 * kNsPerSec), "active side");
  if (ev.status != -ETIMEDOUT) throw std::runtime_error("DISCONNECTED without ETIMEDOUT");
  stack::cm_await(p.client, *p.c.conn.id, CmEventType::TIMEWAIT_EXIT, p.in(10 * kNsPerSec),
                  "active side");
  const double call_s = seconds_since(t_call);
  const double virtual_s = double(lab->runtime().now_ns() - v0) / double(kNsPerSec);
  p.close();
  lab->shutdown();
  return {{"wall_s", call_s}, {"total_wall_s", seconds_since(t0)}, {"virtual_s", virtual_s}};
}

nlohmann::json drep(int runs) {
  std::vector<double> walls;
  nlohmann::json last;
  for (int i = 0; i < runs; ++i) {
    last = drep_once(1 + i);
    walls.push_back(last["wall_s"].get<double>());
  }
  std::sort(walls.begin(), walls.end());
  return {{"runs", runs}, {"median_wall_s", walls[walls.size() / 2]}, {"min_wall_s", walls[0]},
          {"virtual_s", last["virtual_s"]}};
}

nlohmann::json cycles(int max_cycles, double max_s) {
  auto lab = make_model_lab(1, 2);
  auto server_proc = lab->host("b")->create_process("bench-cm-server");
  auto client_proc = lab->host("a")->create_process("bench-cm-client");
  for (int i = 0; i < 20; ++i) {  // warm-up, as the Python loop's first cycles are
    Pair p(*lab, *server_proc, *client_proc, static_cast<uint16_t>(10000 + i));
    p.disconnect();
    p.close();
  }
  const auto t0 = Clock::now();
  const TimeNs v0 = lab->runtime().now_ns();
  int n = 0;
  while (n < max_cycles && seconds_since(t0) < max_s) {
    Pair p(*lab, *server_proc, *client_proc, static_cast<uint16_t>(20000 + n % 40000));
    p.disconnect();
    p.close();
    ++n;
  }
  const double wall = seconds_since(t0);
  const double virt = double(lab->runtime().now_ns() - v0) / double(kNsPerSec);
  lab->shutdown();
  return {{"cycles", n}, {"wall_s", wall}, {"virtual_s", virt}, {"per_s", n / wall}};
}

void one_lab(uint64_t seed, int hosts) {
  auto lab = make_model_lab(seed, hosts);
  std::vector<std::unique_ptr<stack::CmEventPump>> pumps;
  for (const auto& h : lab->hosts()) {
    auto proc = h->create_process("p");
    pumps.push_back(std::make_unique<stack::CmEventPump>(
        lab->runtime(), proc->create_event_channel(), &lab->history(), h->name()));
    pumps.back()->start();
  }
  for (auto& p : pumps) p->stop(lab->runtime().now_ns() + kNsPerSec);
  pumps.clear();
  lab->shutdown();
}

nlohmann::json labs(int n) {
  nlohmann::json out = nlohmann::json::object();
  for (int hosts : {2, 4}) {
    for (int i = 0; i < 5; ++i) one_lab(1000 + i, hosts);  // warm-up, as the Python side does
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) one_lab(1 + i, hosts);
    out[std::to_string(hosts) + "_hosts_ms"] = seconds_since(t0) / n * 1e3;
  }
  return out;
}

int run(int argc, char** argv) {
  int drep_runs = 5, max_cycles = 2000, n_labs = 500;
  double cycle_s = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
    const char* v = argv[++i];
    if (a == "--drep-runs") {
      drep_runs = std::atoi(v);
    } else if (a == "--cycles") {
      max_cycles = std::atoi(v);
    } else if (a == "--cycle-seconds") {
      cycle_s = std::atof(v);
    } else if (a == "--labs") {
      n_labs = std::atoi(v);
    } else {
      throw std::invalid_argument("unknown option " + a +
                                  " (--drep-runs, --cycles, --cycle-seconds, --labs)");
    }
  }
  nlohmann::json out;
  if (drep_runs > 0) out["drep"] = drep(drep_runs);
  if (max_cycles > 0) out["cycles"] = cycles(max_cycles, cycle_s);
  if (n_labs > 0) out["labs"] = labs(n_labs);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace rdmalab::bench

int main(int argc, char** argv) {
  try {
    return rdmalab::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmalab_bench_model: %s\n", e.what());
    return 1;
  }
}
