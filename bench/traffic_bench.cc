// rdmalab_bench_traffic: perftest's four measurements (ib_send_bw, ib_write_bw, ib_read_bw,
// ib_send_lat) made through rdmalab's own data path, so that `make bench` can put the engine
// beside perftest on the same pair of hosts (bench/traffic.py drives both).
//
//   server:  rdmalab_bench_traffic --role server [--port 18600] [--dev rxe0] [--gid-index 1]
//   client:  rdmalab_bench_traffic --role client --peer 10.0.0.1 --tests send_bw,send_lat
//              --sizes 64,4096 [--iters 5000] [--iters-for 65536:1000] [--modes engine]
//              [--waits pace] [--tx-depth 128] [--rx-depth 512] [--cq-mod 100]
//              [--out-reads 16] [--timeout-s 120]
//
// The client says what to run; the server follows. Per (test, size, mode, wait) both sides
// build a fresh session (device, PD, MR, CQs, RC QP), exchange endpoints over a TCP socket on
// the data network, bring the QPs up (stack::bring_up_attr with the GID index given), run the
// test as perftest runs it, and tear down. The client prints one JSON document on stdout.
//
// mode:
//   engine     a VerbsLab (history on, as scenarios run), posts and polls through
//              stack::Traffic and its CompletionLedger: rdmalab's engine as it is used
//   nohistory  the same Traffic and ledger over a context opened without a History
//   direct     rdmalab's verbs objects alone (Qp::post_send, Cq::poll), no Traffic, no
//              ledger, no History: what the engine's layers cost on top of them
//   raw        a baseline, not rdmalab: the same program with ibv_post_send / ibv_poll_cq
//              on a QP made with ibv_create_qp (rdmalab's context, PD, MR and CQs around it),
//              to tell this program's own cost from the layers'
// wait:
//   pace       waits through Traffic::wait_completions (poll, then the engine's backoff)
//   poll       a busy loop of Traffic::poll (one ibv_poll_cq each), as perftest polls
//
// --role micro needs no device: it times, per WR, the CPU work the engine's layers add around
// the provider's calls (Traffic and its ledger, the History records, the verbs backend's
// conversions and record building), over a stand-in QP and CQ that complete every post at
// once. Run in a guest it says what those layers cost there, next to the latencies.
//
// Every wait has a deadline (--timeout-s per session); a failure prints one line naming the
// side and what it waited for, on stderr, and exits non-zero. A watchdog (--max-s) ends the
// process whatever it is stuck in.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "rdmalab/error.h"
#include "rdmalab/history.h"
#include "stack/connect.h"
#include "stack/ledger.h"
#include "stack/traffic.h"
#include "verbs/context.h"
#include "verbs/convert.h"
#include "verbs/objects.h"
#include "verbs/real_runtime.h"
#include "verbs/verbs_lab.h"

namespace rdmalab::bench {
namespace {

using json = nlohmann::json;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TimeNs now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return TimeNs{ts.tv_sec} * kNsPerSec + ts.tv_nsec;
}

// ---- options ----------------------------------------------------------------------------

struct Options {
  std::string role;
  std::string peer;
  uint16_t port = 18600;
  std::string dev = "rxe0";
  int gid_index = 1;
  std::vector<std::string> tests = {"send_bw", "write_bw", "read_bw", "send_lat"};
  std::vector<uint32_t> sizes = {64, 1024, 4096, 65536};
  uint64_t iters = 5000;
  std::map<uint32_t, uint64_t> iters_for;  // size -> iterations (bandwidth tests)
  uint64_t lat_iters = 1000;
  std::vector<std::string> modes = {"engine"};
  std::vector<std::string> waits = {"pace"};
  uint32_t tx_depth = 128;
  uint32_t rx_depth = 512;
  uint32_t cq_mod = 100;
  uint32_t out_reads = 16;
  uint32_t mtu = 1024;
  uint32_t poll_max_us = 0;  // Traffic::set_poll_interval(1 us, this); 0: the engine's default
  uint32_t timer_slack_ns = 0;  // prctl(PR_SET_TIMERSLACK) of the waiting thread; 0: default
  uint32_t spin_us = 0;         // Traffic's waits up to this long spin instead of sleeping
  bool spin_yield = true;       // ... calling sched_yield between checks
  bool profile = false;      // time each post and poll call (poll wait only)
  double timeout_s = 120.0;  // per session
  double max_s = 3600.0;     // the whole process
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "rdmalab_bench_traffic: %s\n"
               "usage: rdmalab_bench_traffic --role server|client [--peer IP] [--port N] "
               "[--dev rxe0] [--gid-index 1] [--tests send_bw,write_bw,read_bw,send_lat] "
               "[--sizes 64,1024] [--iters N] [--iters-for SIZE:N,...] [--lat-iters N] "
               "[--modes engine,nohistory,direct,raw] [--waits pace,poll] [--tx-depth N] "
               "[--rx-depth N] [--cq-mod N] [--out-reads N] [--mtu N] [--poll-max-us N] "
               "[--timer-slack-ns N] [--spin-us N] [--spin-yield on|off] [--profile on] [--timeout-s S] [--max-s S]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage("missing a value after " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--role") {
        o.role = v;
      } else if (k == "--peer") {
        o.peer = v;
      } else if (k == "--port") {
        o.port = static_cast<uint16_t>(std::stoul(v));
      } else if (k == "--dev") {
        o.dev = v;
      } else if (k == "--gid-index") {
        o.gid_index = std::stoi(v);
      } else if (k == "--tests") {
        o.tests = split(v);
      } else if (k == "--sizes") {
        o.sizes.clear();
        for (const auto& s : split(v)) o.sizes.push_back(static_cast<uint32_t>(std::stoul(s)));
      } else if (k == "--iters") {
        o.iters = std::stoull(v);
      } else if (k == "--iters-for") {
        for (const auto& s : split(v)) {
          const auto colon = s.find(':');
          if (colon == std::string::npos) usage("--iters-for takes SIZE:N,...");
          o.iters_for[static_cast<uint32_t>(std::stoul(s.substr(0, colon)))] =
              std::stoull(s.substr(colon + 1));
        }
      } else if (k == "--lat-iters") {
        o.lat_iters = std::stoull(v);
      } else if (k == "--modes") {
        o.modes = split(v);
      } else if (k == "--waits") {
        o.waits = split(v);
      } else if (k == "--tx-depth") {
        o.tx_depth = static_cast<uint32_t>(std::stoul(v));
      } else if (k == "--rx-depth") {
        o.rx_depth = static_cast<uint32_t>(std::stoul(v));
      } else if (k == "--cq-mod") {
        o.cq_mod = static_cast<uint32_t>(std::stoul(v));
      } else if (k == "--out-reads") {
        o.out_reads = static_cast<uint32_t>(std::stoul(v));
      } else if (k == "--mtu") {
        o.mtu = static_cast<uint32_t>(std::stoul(v));
      } else if (k == "--poll-max-us") {
        o.poll_max_us = static_cast<uint32_t>(std::stoul(v));
      } else if (k == "--timer-slack-ns") {
        o.timer_slack_ns = static_cast<uint32_t>(std::stoul(v));
      } else if (k == "--spin-yield") {
        o.spin_yield = v == "1" || v == "on";
      } else if (k == "--spin-us") {
        o.spin_us = static_cast<uint32_t>(std::stoul(v));
      } else if (k == "--profile") {
        o.profile = v == "1" || v == "on";
      } else if (k == "--timeout-s") {
        o.timeout_s = std::stod(v);
      } else if (k == "--max-s") {
        o.max_s = std::stod(v);
      } else {
        usage("unknown option " + k);
      }
    } catch (const std::logic_error&) {
      usage("bad value for " + k + ": " + v);
    }
  }
  if (o.role != "server" && o.role != "client" && o.role != "micro") {
    usage("--role server, client or micro");
  }
  if (o.role == "client" && o.peer.empty()) usage("the client needs --peer");
  for (const auto& t : o.tests) {
    if (t != "send_bw" && t != "write_bw" && t != "read_bw" && t != "send_lat") {
      usage("unknown test " + t);
    }
  }
  for (const auto& m : o.modes) {
    if (m != "engine" && m != "nohistory" && m != "direct" && m != "raw") {
      usage("unknown mode " + m);
    }
  }
  for (const auto& w : o.waits) {
    if (w != "pace" && w != "poll") usage("unknown wait " + w);
  }
  if (o.tx_depth == 0 || o.rx_depth == 0 || o.cq_mod == 0 || o.out_reads == 0 ||
      o.out_reads > 255) {
    usage("depths and cq-mod must be positive, out-reads 1..255");
  }
  return o;
}

// ---- the control channel: JSON lines over TCP, every read and write with a deadline --------

class Control {
 public:
  explicit Control(int fd) : fd_(fd) {
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;
  ~Control() {
    if (fd_ >= 0) ::close(fd_);
  }

  static std::unique_ptr<Control> accept_one(uint16_t port, TimeNs deadline_ns) {
    const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0) throw Failure(std::string("socket: ") + std::strerror(errno));
    const int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 1) != 0) {
      const std::string why = std::strerror(errno);
      ::close(lfd);
      throw Failure("listen on TCP port " + std::to_string(port) + ": " + why);
    }
    std::fprintf(stderr, "rdmalab_bench_traffic: server listening on TCP port %u\n", port);
    if (!wait_fd(lfd, POLLIN, deadline_ns)) {
      ::close(lfd);
      throw Failure("no client connected to TCP port " + std::to_string(port) +
                    " before the deadline");
    }
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    const std::string why = std::strerror(errno);
    ::close(lfd);
    if (fd < 0) throw Failure("accept: " + why);
    return std::make_unique<Control>(fd);
  }

  // Retries a refused connect (the server not listening yet) until the deadline.
  static std::unique_ptr<Control> connect_to(const std::string& ip, uint16_t port,
                                             TimeNs deadline_ns) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) throw Failure("bad --peer " + ip);
    std::string last = "no attempt";
    while (now_ns() < deadline_ns) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) throw Failure(std::string("socket: ") + std::strerror(errno));
      int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      if (rc != 0 && errno == EINPROGRESS) {
        const TimeNs attempt_end = std::min(deadline_ns, now_ns() + 5 * kNsPerSec);
        if (wait_fd(fd, POLLOUT, attempt_end)) {
          int err = 0;
          socklen_t len = sizeof err;
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) {
        const int flags = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        return std::make_unique<Control>(fd);
      }
      last = std::strerror(errno);
      ::close(fd);
      usleep(100 * 1000);
    }
    throw Failure("cannot reach the server at " + ip + ":" + std::to_string(port) + " (" + last +
                  ") before the deadline");
  }

  void send(const json& j, TimeNs deadline_ns) {
    const std::string line = j.dump() + "\n";
    size_t off = 0;
    while (off < line.size()) {
      if (!wait_fd(fd_, POLLOUT, deadline_ns)) throw Failure("TCP send to the peer timed out");
      const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        throw Failure(std::string("TCP send to the peer: ") + std::strerror(errno));
      }
      off += static_cast<size_t>(n);
    }
  }

  json recv(TimeNs deadline_ns, const std::string& waiting_for) {
    for (;;) {
      const auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        const std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) throw Failure("peer sent garbage: " + line);
        if (j.value("op", "") == "error") {
          throw Failure("the peer failed: " + j.value("error", std::string("?")));
        }
        return j;
      }
      if (!wait_fd(fd_, POLLIN, deadline_ns)) {
        throw Failure("timed out waiting for the peer: " + waiting_for);
      }
      char tmp[4096];
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n == 0) throw Failure("the peer closed the connection while waiting for " + waiting_for);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        throw Failure(std::string("TCP recv: ") + std::strerror(errno));
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

  json expect(const std::string& op, TimeNs deadline_ns, const std::string& waiting_for) {
    json j = recv(deadline_ns, waiting_for);
    if (j.value("op", "") != op) {
      throw Failure("expected '" + op + "' from the peer (" + waiting_for + "), got " + j.dump());
    }
    return j;
  }

 private:
  static bool wait_fd(int fd, short events, TimeNs deadline_ns) {
    for (;;) {
      const TimeNs left = deadline_ns - now_ns();
      if (left <= 0) return false;
      pollfd p{fd, events, 0};
      const int ms = static_cast<int>(std::min<TimeNs>(left / kNsPerMs + 1, 1000));
      const int rc = ::poll(&p, 1, ms);
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
  }

  int fd_;
  std::string buf_;
};

// ---- one session: fresh resources for one (test, size, mode, wait) ---------------------

struct Params {
  std::string test;
  uint32_t size = 64;
  uint64_t iters = 1000;
  std::string mode = "engine";
  std::string wait = "pace";
  uint32_t tx_depth = 128;
  uint32_t rx_depth = 512;
  uint32_t cq_mod = 100;
  uint32_t out_reads = 16;
  uint32_t mtu = 1024;
  uint32_t poll_max_us = 0;
  uint32_t timer_slack_ns = 0;
  uint32_t spin_us = 0;
  bool spin_yield = true;
  bool profile = false;

  json to_json() const {
    return {{"test", test},         {"size", size},         {"iters", iters},
            {"mode", mode},         {"wait", wait},         {"tx_depth", tx_depth},
            {"rx_depth", rx_depth}, {"cq_mod", cq_mod},     {"out_reads", out_reads},
            {"mtu", mtu},           {"poll_max_us", poll_max_us}, {"profile", profile},
            {"timer_slack_ns", timer_slack_ns}, {"spin_us", spin_us},
            {"spin_yield", spin_yield}};
  }
  static Params from_json(const json& j) {
    Params p;
    p.test = j.at("test");
    p.size = j.at("size");
    p.iters = j.at("iters");
    p.mode = j.at("mode");
    p.wait = j.at("wait");
    p.tx_depth = j.at("tx_depth");
    p.rx_depth = j.at("rx_depth");
    p.cq_mod = j.at("cq_mod");
    p.out_reads = j.at("out_reads");
    p.mtu = j.at("mtu");
    p.poll_max_us = j.at("poll_max_us");
    p.profile = j.at("profile");
    p.timer_slack_ns = j.at("timer_slack_ns");
    p.spin_us = j.at("spin_us");
    p.spin_yield = j.at("spin_yield");
    return p;
  }
};

std::string gid_hex(const Gid& g) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : g.raw) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

Gid gid_from_hex(const std::string& s) {
  if (s.size() != 32) throw Failure("bad GID from the peer: " + s);
  Gid g;
  for (size_t i = 0; i < 16; ++i) g.raw[i] = static_cast<uint8_t>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return g;
}

// A prototype, for the diagnostics: the real runtime, except that a wait whose deadline is
// at most spin_ns away spins (yielding the CPU) instead of sleeping on a condition variable,
// whose futex wait costs at least the timer slack (50 us) and a wake-up.
class SpinningRuntime final : public Runtime {
 public:
  SpinningRuntime(Runtime& base, TimeNs spin_ns, bool yield)
      : base_(base), spin_ns_(spin_ns), yield_(yield) {}
  TimeNs now_ns() const override { return base_.now_ns(); }
  void spawn(const std::string& name, std::function<void()> body) override {
    base_.spawn(name, std::move(body));
  }
  bool wait_until(const std::function<bool()>& pred, TimeNs deadline_ns) override {
    if (deadline_ns - base_.now_ns() > spin_ns_) return base_.wait_until(pred, deadline_ns);
    while (base_.now_ns() < deadline_ns && !base_.stopping()) {
      if (pred()) return true;
      if (yield_) sched_yield();
    }
    return pred();
  }
  void notify_all() override { base_.notify_all(); }
  bool stopping() const override { return base_.stopping(); }

 private:
  Runtime& base_;
  TimeNs spin_ns_;
  bool yield_;
};

class Session {
 public:
  Session(const Options& o, const Params& p, const std::string& host) : p_(p) {
    if (p.mode == "engine") {
      lab_ = std::make_unique<verbs::VerbsLab>(1, host);
      ctx_ = lab_->host(host)->create_process("bench")->open_device(o.dev);
      history_ = &lab_->history();
    } else {
      runtime_ = std::make_unique<verbs::RealRuntime>();
      ctx_ = verbs::open_local_device(o.dev, nullptr, host);
    }
    if (ctx_->caps().transport == Transport::iWARP) {
      throw Failure(o.dev + " is iWARP: its QPs connect through rdma_cm only; this bench "
                            "brings QPs up with exchanged attributes (RoCE and IB devices)");
    }
    gid_index_ = o.gid_index;
    pd_ = ctx_->alloc_pd();
    const uint64_t len = std::max<uint64_t>(4096, 2 * uint64_t{p.size});
    mr_ = ctx_->reg_mr(*pd_, len, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ);
    scq_ = ctx_->create_cq(static_cast<int>(p.tx_depth));
    rcq_ = ctx_->create_cq(static_cast<int>(p.rx_depth));
    QpInitAttr init;
    init.qp_type = QpType::RC;
    init.pd = pd_;
    init.send_cq = scq_;
    init.recv_cq = rcq_;
    init.cap.max_send_wr = p.tx_depth;
    init.cap.max_recv_wr = p.rx_depth;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    if (p.mode == "raw") {
      create_raw_qp();
    } else {
      qp_ = ctx_->create_qp(init);
    }
    if (p.mode != "direct" && p.mode != "raw") {
      ledger_ = std::make_unique<stack::CompletionLedger>(history_, host);
      Runtime* rt = &runtime();
      if (p.spin_us != 0) {
        spinning_ = std::make_unique<SpinningRuntime>(runtime(), TimeNs{p.spin_us} * kNsPerUs,
                                                      p.spin_yield);
        rt = spinning_.get();
      }
      traffic_ = std::make_unique<stack::Traffic>(*rt, *ledger_, history_, host);
      if (p.poll_max_us != 0) {
        traffic_->set_poll_interval(kNsPerUs, TimeNs{p.poll_max_us} * kNsPerUs);
      }
    }
    psn_ = static_cast<uint32_t>(now_ns()) & 0xffffff;
    prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(p.timer_slack_ns), 0, 0, 0);
  }

  ~Session() {
    if (raw_qp_ != nullptr) ibv_destroy_qp(raw_qp_);
    try {
      if (qp_ && !qp_->destroyed()) qp_->destroy(now_ns() + 5 * kNsPerSec);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rdmalab_bench_traffic: teardown: %s\n", e.what());
    }
    traffic_.reset();
    ledger_.reset();
    qp_.reset();
    if (lab_) {
      lab_->shutdown();
    } else if (ctx_ && !ctx_->destroyed()) {
      try {
        ctx_->close();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rdmalab_bench_traffic: close: %s\n", e.what());
      }
    }
  }

  Runtime& runtime() { return lab_ ? lab_->runtime() : *runtime_; }

  json endpoint() const {
    return {{"op", "endpoint"},
            {"qp_num", qp_num()},
            {"psn", psn_},
            {"gid", gid_hex(ctx_->query_gid(1, gid_index_))},
            {"addr", mr_->addr()},
            {"rkey", mr_->rkey()}};
  }

  // RESET -> INIT -> RTR -> RTS with the engine's attribute sets (stack/connect.h), the GID
  // index given (RoCEv2 on rxe: 1, the IPv4-mapped GID).
  void connect(const json& peer) {
    stack::Endpoint local;
    local.qp_num = qp_num();
    local.psn = psn_;
    local.gid = ctx_->query_gid(1, gid_index_);
    local.transport = ctx_->caps().transport;
    stack::Endpoint remote = local;
    remote.qp_num = peer.at("qp_num");
    remote.psn = peer.at("psn");
    remote.gid = gid_from_hex(peer.at("gid"));
    remote_addr_ = peer.at("addr");
    rkey_ = peer.at("rkey");
    stack::RcParams rc;
    rc.path_mtu = p_.mtu;
    rc.max_rd_atomic = static_cast<uint8_t>(p_.out_reads);
    rc.max_dest_rd_atomic = static_cast<uint8_t>(p_.out_reads);
    const stack::TransitionMasks masks = stack::transition_masks(QpType::RC, local.transport);
    QpAttr attr = stack::bring_up_attr(local, remote, rc);
    attr.ah_attr.sgid_index = static_cast<uint8_t>(gid_index_);
    const std::pair<QpState, uint32_t> steps[] = {
        {QpState::INIT, masks.to_init}, {QpState::RTR, masks.to_rtr}, {QpState::RTS, masks.to_rts}};
    for (const auto& [state, mask] : steps) {
      attr.qp_state = state;
      if (raw_qp_ != nullptr) {
        ibv_qp_attr a = verbs::to_ibv(attr, mask);
        if (const int rc = ibv_modify_qp(raw_qp_, &a, static_cast<int>(mask)); rc != 0) {
          throw Failure("ibv_modify_qp (raw) to " + std::string(to_string(state)) + ": " +
                        std::strerror(rc));
        }
      } else {
        qp_->modify(attr, mask);
      }
    }
  }

  uint32_t qp_num() const { return raw_qp_ != nullptr ? raw_qp_->qp_num : qp_->qp_num(); }

  void create_raw_qp() {
    auto pd = std::dynamic_pointer_cast<verbs::VerbsPd>(pd_);
    auto scq = std::dynamic_pointer_cast<verbs::VerbsCq>(scq_);
    auto rcq = std::dynamic_pointer_cast<verbs::VerbsCq>(rcq_);
    if (!pd || !scq || !rcq) throw Failure("raw mode needs the verbs backend's objects");
    ibv_qp_init_attr ia{};
    ia.send_cq = raw_scq_ = scq->get("ibv_create_qp");
    ia.recv_cq = raw_rcq_ = rcq->get("ibv_create_qp");
    ia.cap.max_send_wr = p_.tx_depth;
    ia.cap.max_recv_wr = p_.rx_depth;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.qp_type = IBV_QPT_RC;
    raw_qp_ = ibv_create_qp(pd->get("ibv_create_qp"), &ia);
    if (raw_qp_ == nullptr) throw Failure(std::string("ibv_create_qp: ") + std::strerror(errno));
  }

  uint64_t raw_post_send(const SendWr& wr) {
    ibv_sge sge{wr.sg_list[0].addr, wr.sg_list[0].length, wr.sg_list[0].lkey};
    ibv_send_wr w{};
    w.wr_id = ++direct_wr_id_;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = verbs::to_ibv(wr.opcode);
    w.send_flags = wr.signaled ? IBV_SEND_SIGNALED : 0;
    w.wr.rdma.remote_addr = wr.remote_addr;
    w.wr.rdma.rkey = wr.rkey;
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(raw_qp_, &w, &bad); rc != 0) {
      throw Failure(std::string("ibv_post_send: ") + std::strerror(rc));
    }
    return w.wr_id;
  }

  uint64_t raw_post_recv(const RecvWr& wr) {
    ibv_sge sge{wr.sg_list[0].addr, wr.sg_list[0].length, wr.sg_list[0].lkey};
    ibv_recv_wr w{};
    w.wr_id = ++direct_wr_id_;
    w.sg_list = &sge;
    w.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(raw_qp_, &w, &bad); rc != 0) {
      throw Failure(std::string("ibv_post_recv: ") + std::strerror(rc));
    }
    return w.wr_id;
  }

  std::vector<WorkCompletion> raw_poll(Cq& cq) {
    ibv_wc wcs[32];
    const int n = ibv_poll_cq(&cq == scq_.get() ? raw_scq_ : raw_rcq_, 32, wcs);
    if (n < 0) throw Failure("ibv_poll_cq failed");
    std::vector<WorkCompletion> out;
    for (int i = 0; i < n; ++i) out.push_back(verbs::from_ibv(wcs[i]));
    return out;
  }

  // --- the data path
  SendWr send_wr(WrOpcode op) const {
    SendWr wr;
    wr.opcode = op;
    wr.sg_list = {{mr_->addr(), p_.size, mr_->lkey()}};
    if (op == WrOpcode::RDMA_WRITE || op == WrOpcode::RDMA_READ) {
      // WRITE lands in the second half of the peer's buffer, READ fetches its first half.
      wr.remote_addr = remote_addr_ + (op == WrOpcode::RDMA_WRITE ? p_.size : 0);
      wr.rkey = rkey_;
    }
    return wr;
  }

  RecvWr recv_wr() const {
    RecvWr wr;
    wr.sg_list = {{mr_->addr() + p_.size, p_.size, mr_->lkey()}};
    return wr;
  }

  uint64_t post_send(SendWr wr) {
    const TimeNs t0 = p_.profile ? now_ns() : 0;
    if (traffic_) {
      wr.wr_id = traffic_->post_send(*qp_, std::move(wr));
    } else if (raw_qp_ != nullptr) {
      wr.wr_id = raw_post_send(wr);
    } else {
      wr.wr_id = ++direct_wr_id_;
      qp_->post_send(wr);
    }
    if (p_.profile) prof_.post_send(now_ns() - t0);
    return wr.wr_id;
  }

  uint64_t post_recv(RecvWr wr) {
    const TimeNs t0 = p_.profile ? now_ns() : 0;
    if (traffic_) {
      wr.wr_id = traffic_->post_recv(*qp_, std::move(wr));
    } else if (raw_qp_ != nullptr) {
      wr.wr_id = raw_post_recv(wr);
    } else {
      wr.wr_id = ++direct_wr_id_;
      qp_->post_recv(wr);
    }
    if (p_.profile) prof_.post_recv(now_ns() - t0);
    return wr.wr_id;
  }

  // At least one completion from cq (the send or the receive CQ), through the engine's wait
  // (pace) or a busy loop of single polls (poll); Failure at the deadline or on an error
  // status.
  std::vector<WorkCompletion> next(Cq& cq, TimeNs deadline_ns, const char* waiting_for) {
    std::vector<WorkCompletion> wcs;
    if (p_.wait == "pace" && traffic_) {
      const size_t before = traffic_->completion_count();
      if (!traffic_->wait_completions(cq, 1, deadline_ns)) {
        throw Failure(std::string("no completion before the deadline: ") + waiting_for);
      }
      wcs = traffic_->completions_since(before);
    } else {
      for (uint64_t spins = 0;; ++spins) {
        const TimeNs t0 = p_.profile ? now_ns() : 0;
        wcs = traffic_ ? traffic_->poll(cq, 32) : raw_qp_ != nullptr ? raw_poll(cq) : cq.poll(32);
        if (p_.profile) prof_.poll(now_ns() - t0, wcs.size());
        if (!wcs.empty()) break;
        if ((spins & 1023) == 1023 && now_ns() > deadline_ns) {
          throw Failure(std::string("no completion before the deadline: ") + waiting_for);
        }
      }
    }
    for (const auto& wc : wcs) {
      if (wc.status != WcStatus::SUCCESS) {
        throw Failure(std::string("completion error ") + std::string(to_string(wc.status)) +
                      " (vendor_err " + std::to_string(wc.vendor_err) + ") while " + waiting_for);
      }
    }
    return wcs;
  }

  Cq& scq() { return *scq_; }
  Cq& rcq() { return *rcq_; }
  const Params& params() const { return p_; }

  json accounting() const {
    json j = json::object();
    if (p_.profile) j["profile"] = prof_.to_json();
    if (history_ != nullptr) j["history_records"] = history_->size();
    if (ledger_) {
      const stack::LedgerReport r = ledger_->check();
      j["ledger"] = {{"posted", r.posted},
                     {"succeeded", r.succeeded},
                     {"implied", r.implied},
                     {"unknown", r.unknown},
                     {"violations", r.violations.size()}};
      if (!r.violations.empty()) {
        throw Failure("the ledger found " + std::to_string(r.violations.size()) +
                      " violations, the first: " + r.violations[0].detail);
      }
    }
    return j;
  }

 private:
  Params p_;
  std::unique_ptr<verbs::VerbsLab> lab_;
  std::unique_ptr<verbs::RealRuntime> runtime_;
  History* history_ = nullptr;
  std::shared_ptr<Context> ctx_;
  std::shared_ptr<Pd> pd_;
  std::shared_ptr<Mr> mr_;
  std::shared_ptr<Cq> scq_, rcq_;
  std::shared_ptr<Qp> qp_;
  std::unique_ptr<stack::CompletionLedger> ledger_;
  std::unique_ptr<SpinningRuntime> spinning_;
  std::unique_ptr<stack::Traffic> traffic_;
  int gid_index_ = 0;
  uint32_t psn_ = 0;
  uint64_t remote_addr_ = 0;
  uint32_t rkey_ = 0;
  uint64_t direct_wr_id_ = 0;
  ibv_qp* raw_qp_ = nullptr;
  ibv_cq* raw_scq_ = nullptr;
  ibv_cq* raw_rcq_ = nullptr;

  // Where the time of a poll-wait session goes: each post call, each poll call that found
  // completions and each that found none (engine layers and the provider's call together).
  struct Profile {
    uint64_t sends = 0, recvs = 0, hits = 0, hit_wcs = 0, empties = 0;
    TimeNs send_ns = 0, recv_ns = 0, hit_ns = 0, empty_ns = 0;
    void post_send(TimeNs d) {
      ++sends;
      send_ns += d;
    }
    void post_recv(TimeNs d) {
      ++recvs;
      recv_ns += d;
    }
    void poll(TimeNs d, size_t n) {
      if (n == 0) {
        ++empties;
        empty_ns += d;
      } else {
        ++hits;
        hit_wcs += n;
        hit_ns += d;
      }
    }
    json to_json() const {
      auto avg = [](TimeNs ns, uint64_t n) { return n ? static_cast<double>(ns) / 1e3 / n : 0.0; };
      return {{"post_sends", sends},
              {"post_send_us_avg", avg(send_ns, sends)},
              {"post_recvs", recvs},
              {"post_recv_us_avg", avg(recv_ns, recvs)},
              {"poll_hits", hits},
              {"poll_hit_wcs", hit_wcs},
              {"poll_hit_us_avg", avg(hit_ns, hits)},
              {"poll_empties", empties},
              {"poll_empty_us_avg", avg(empty_ns, empties)}};
    }
  } prof_;
};

// ---- the tests --------------------------------------------------------------------------

// perftest's run_iter_bw: keep up to tx_depth WRs outstanding, signal every cq_mod-th and the
// last, count each signaled completion as the WRs up to it. Returns the seconds from the first
// post to the last completion.
double run_bw_client(Session& s, WrOpcode op, TimeNs deadline_ns) {
  const Params& p = s.params();
  const SendWr tmpl = s.send_wr(op);
  std::deque<std::pair<uint64_t, uint64_t>> signaled;  // (wr_id, WRs done once it completes)
  uint64_t posted = 0, done = 0;
  const TimeNs t0 = now_ns();
  while (done < p.iters) {
    while (posted < p.iters && posted - done < p.tx_depth) {
      SendWr wr = tmpl;
      ++posted;
      wr.signaled = posted % p.cq_mod == 0 || posted == p.iters;
      const uint64_t id = s.post_send(std::move(wr));
      if (posted % p.cq_mod == 0 || posted == p.iters) signaled.emplace_back(id, posted);
    }
    for (const auto& wc : s.next(s.scq(), deadline_ns, "send-queue completions")) {
      while (!signaled.empty() && signaled.front().first != wc.wr_id) signaled.pop_front();
      if (signaled.empty()) throw Failure("a completion for a WR never signaled");
      done = signaled.front().second;
      signaled.pop_front();
    }
  }
  return static_cast<double>(now_ns() - t0) / 1e9;
}

// The receiving side of SEND: rx_depth receives posted before "ready", one re-posted per
// completion until iters are covered. Returns the seconds from the first to the last receive.
double run_send_bw_server(Session& s, Control& ctl, TimeNs deadline_ns) {
  const Params& p = s.params();
  const RecvWr tmpl = s.recv_wr();
  uint64_t posted = 0;
  for (; posted < std::min<uint64_t>(p.rx_depth, p.iters); ++posted) s.post_recv(tmpl);
  ctl.send({{"op", "ready"}}, deadline_ns);
  uint64_t got = 0;
  TimeNs first = 0;
  while (got < p.iters) {
    const auto wcs = s.next(s.rcq(), deadline_ns, "receive completions");
    if (first == 0) first = now_ns();
    got += wcs.size();
    for (size_t i = 0; i < wcs.size() && posted < p.iters; ++i, ++posted) s.post_recv(tmpl);
  }
  return static_cast<double>(now_ns() - first) / 1e9;
}

// perftest's run_iter_lat_send: the client sends, the server answers each message with one of
// its own; sends are signaled every cq_mod-th (and the last), and a signaled send's completion
// is awaited at once. Returns the post times of the client's sends (empty on the server).
std::vector<TimeNs> run_send_lat(Session& s, bool client, TimeNs deadline_ns) {
  const Params& p = s.params();
  const SendWr tmpl = s.send_wr(WrOpcode::SEND);
  const RecvWr rtmpl = s.recv_wr();
  const uint64_t depth = std::min<uint64_t>(p.rx_depth, p.iters);
  uint64_t posted_recv = depth;
  std::vector<TimeNs> stamps;
  stamps.reserve(client ? p.iters : 0);
  uint64_t sent = 0, received = 0;
  std::vector<WorkCompletion> pending;  // receive completions polled but not yet used
  while (sent < p.iters || received < p.iters) {
    if (received < p.iters && !(client && sent == 0)) {
      while (pending.empty()) pending = s.next(s.rcq(), deadline_ns, "the peer's message");
      pending.erase(pending.begin());
      ++received;
      if (posted_recv < p.iters) {
        s.post_recv(rtmpl);
        ++posted_recv;
      }
    }
    if (sent < p.iters) {
      if (client) stamps.push_back(now_ns());
      ++sent;
      SendWr wr = tmpl;
      wr.signaled = sent % p.cq_mod == 0 || sent == p.iters;
      const bool wait_send = wr.signaled;
      s.post_send(std::move(wr));
      if (wait_send) s.next(s.scq(), deadline_ns, "the send completion");
    }
  }
  return stamps;
}

void post_initial_recvs(Session& s) {
  const Params& p = s.params();
  const RecvWr rtmpl = s.recv_wr();
  for (uint64_t i = 0; i < std::min<uint64_t>(p.rx_depth, p.iters); ++i) s.post_recv(rtmpl);
}

json latency_report(const std::vector<TimeNs>& stamps) {
  // perftest: one-way latency = (tposted[i+1] - tposted[i]) / 2, sorted; t_typical = median.
  std::vector<double> us;
  for (size_t i = 1; i < stamps.size(); ++i) {
    us.push_back(static_cast<double>(stamps[i] - stamps[i - 1]) / 2.0 / 1000.0);
  }
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double v : us) sum += v;
  auto pct = [&](double q) {
    return us[std::min(us.size() - 1, static_cast<size_t>(q * static_cast<double>(us.size())))];
  };
  return {{"t_min_us", us.front()},
          {"t_max_us", us.back()},
          {"t_typical_us", us[us.size() / 2]},
          {"t_avg_us", sum / static_cast<double>(us.size())},
          {"t_p99_us", pct(0.99)},
          {"samples", us.size()}};
}

WrOpcode opcode_of(const std::string& test) {
  if (test == "write_bw") return WrOpcode::RDMA_WRITE;
  if (test == "read_bw") return WrOpcode::RDMA_READ;
  return WrOpcode::SEND;
}

json run_client_session(const Options& o, Control& ctl, const Params& p) {
  const TimeNs deadline = now_ns() + static_cast<TimeNs>(o.timeout_s * 1e9);
  ctl.send({{"op", "session"}, {"params", p.to_json()}}, deadline);
  Session s(o, p, "a");
  const json peer = ctl.expect("endpoint", deadline, "the server's endpoint");
  ctl.send(s.endpoint(), deadline);
  s.connect(peer);
  if (p.test == "send_lat") post_initial_recvs(s);
  ctl.expect("ready", deadline, "the server to be ready");
  json r = p.to_json();
  if (p.test == "send_lat") {
    r.update(latency_report(run_send_lat(s, true, deadline)));
  } else {
    const double secs = run_bw_client(s, opcode_of(p.test), deadline);
    r["seconds"] = secs;
    r["msg_rate_mpps"] = static_cast<double>(p.iters) / secs / 1e6;
    r["bw_mib_s"] = static_cast<double>(p.iters) * p.size / secs / (1 << 20);
  }
  ctl.send({{"op", "done"}}, deadline);
  const json peer_result = ctl.expect("result", deadline, "the server's result");
  r["server"] = peer_result.value("result", json::object());
  r.update(s.accounting());
  return r;
}

json run_server_session(const Options& o, Control& ctl, const Params& p) {
  const TimeNs deadline = now_ns() + static_cast<TimeNs>(o.timeout_s * 1e9);
  Session s(o, p, "b");
  ctl.send(s.endpoint(), deadline);
  const json peer = ctl.expect("endpoint", deadline, "the client's endpoint");
  s.connect(peer);
  json result = json::object();
  if (p.test == "send_bw") {
    const double secs = run_send_bw_server(s, ctl, deadline);
    result["seconds"] = secs;
    result["msg_rate_mpps"] = static_cast<double>(p.iters) / secs / 1e6;
  } else if (p.test == "send_lat") {
    post_initial_recvs(s);
    ctl.send({{"op", "ready"}}, deadline);
    run_send_lat(s, false, deadline);
  } else {
    ctl.send({{"op", "ready"}}, deadline);  // WRITE and READ: the server's CPU takes no part
  }
  ctl.expect("done", deadline, "the client to finish " + p.test);
  result.update(s.accounting());
  ctl.send({{"op", "result"}, {"result", result}}, deadline);
  return result;
}

// ---- --role micro: the engine's own CPU work per WR, over a stand-in provider ---------------

// A QP whose posts complete at once on its CQ (the provider's work left out).
// Host "a"'s context, as the Traffic below is host "a"'s (it refuses another host's objects).
const Owner kStandInOwner{nullptr, 0, "ctx:0", "a"};

class StandInCq final : public Cq {
 public:
  uint64_t id() const override { return 1; }
  bool destroyed() const override { return false; }
  std::string label() const override { return "cq:1"; }
  Owner owner() const override { return kStandInOwner; }
  int cqe() const override { return 4096; }
  std::vector<WorkCompletion> poll(int max) override {
    std::vector<WorkCompletion> out;
    while (!ready_.empty() && static_cast<int>(out.size()) < max) {
      out.push_back(ready_.front());
      ready_.pop_front();
    }
    return out;
  }
  void destroy(TimeNs) override {}
  std::deque<WorkCompletion> ready_;
};

class StandInQp final : public Qp {
 public:
  explicit StandInQp(StandInCq& cq) : cq_(cq) {}
  uint64_t id() const override { return 2; }
  bool destroyed() const override { return false; }
  std::string label() const override { return "qp:2"; }
  Owner owner() const override { return kStandInOwner; }
  uint32_t qp_num() const override { return 17; }
  QpType qp_type() const override { return QpType::RC; }
  QpState state() const override { return QpState::RTS; }
  void modify(const QpAttr&, uint32_t) override {}
  QpAttr query() const override { return {}; }
  void post_send(const SendWr& wr) override {
    if (wr.signaled) complete(wr.wr_id, WcOpcode::SEND);
  }
  void post_recv(const RecvWr& wr) override { complete(wr.wr_id, WcOpcode::RECV); }
  void destroy(TimeNs) override {}
  bool is_open_handle() const override { return false; }
  // No device: the defaults of no known provider.
  const DeviceCaps& device_caps() const override { return caps_; }

 private:
  void complete(uint64_t wr_id, WcOpcode op) {
    WorkCompletion wc;
    wc.wr_id = wr_id;
    wc.opcode = op;
    wc.qp_num = 17;
    wc.byte_len = 64;
    cq_.ready_.push_back(wc);
  }
  StandInCq& cq_;
  const DeviceCaps caps_{};
};

// ns per call of body, over n calls.
template <typename Body>
double time_per_op(uint64_t n, Body&& body) {
  const TimeNs t0 = now_ns();
  for (uint64_t i = 0; i < n; ++i) body(i);
  return static_cast<double>(now_ns() - t0) / static_cast<double>(n);
}

int run_micro(const Options& o) {
  const uint64_t n = o.iters;
  json out = json::object();
  std::vector<uint8_t> buf(4096);
  const uint64_t addr = reinterpret_cast<uint64_t>(buf.data());
  SendWr send;
  send.sg_list = {{addr, 64, 0x1234}};
  RecvWr recv;
  recv.sg_list = {{addr + 64, 64, 0x1234}};

  // Traffic over the stand-in, with a History (engine) and without (nohistory): post + poll.
  for (bool with_history : {true, false}) {
    verbs::RealRuntime rt;
    History history([&rt] { return rt.now_ns(); });
    History* h = with_history ? &history : nullptr;
    stack::CompletionLedger ledger(h, "a");
    stack::Traffic traffic(rt, ledger, h, "a");
    StandInCq cq;
    StandInQp qp(cq);
    const std::string key = with_history ? "traffic_history" : "traffic_nohistory";
    SendWr unsignaled = send;
    unsignaled.signaled = false;
    // A signaled SEND and the poll that finds its completion; a receive and its poll; an
    // unsignaled SEND (no completion); a poll of an empty CQ.
    out[key + "_send_and_poll_ns"] = time_per_op(n, [&](uint64_t) {
      traffic.post_send(qp, send);
      if (traffic.poll(cq, 32).size() != 1) throw Failure("stand-in poll");
    });
    out[key + "_recv_and_poll_ns"] = time_per_op(n, [&](uint64_t) {
      traffic.post_recv(qp, recv);
      if (traffic.poll(cq, 32).size() != 1) throw Failure("stand-in poll");
    });
    out[key + "_unsignaled_send_ns"] =
        time_per_op(n, [&](uint64_t) { traffic.post_send(qp, unsignaled); });
    out[key + "_poll_empty_ns"] = time_per_op(n, [&](uint64_t) { traffic.poll(cq, 32); });
  }

  // What core/verbs adds to ibv_post_send and ibv_poll_cq (qp.cc, objects.cc): the WR's
  // conversion, the record's JSON (built even without a History) and its storing.
  {
    verbs::RealRuntime rt;
    History history([&rt] { return rt.now_ns(); });
    const std::string label = "qp:2";
    auto post_json = [&](const SendWr& wr) {
      return json{{"queue", "send"},
                  {"wr_id", wr.wr_id},
                  {"signaled", wr.signaled},
                  {"qp_num", 17},
                  {"opcode", std::string(to_string(wr.opcode))}};
    };
    out["verbs_post_convert_ns"] = time_per_op(n, [&](uint64_t i) {
      SendWr wr = send;
      wr.wr_id = i + 1;
      verbs::IbvSendWr w;
      verbs::to_ibv(wr, QpType::RC, nullptr, w);
      if (w.wr.num_sge != 1) throw Failure("conversion");
    });
    out["verbs_post_json_ns"] = time_per_op(n, [&](uint64_t i) {
      SendWr wr = send;
      wr.wr_id = i + 1;
      json j = post_json(wr);
      if (j.size() != 5) throw Failure("json");
    });
    out["verbs_post_json_record_ns"] = time_per_op(n, [&](uint64_t i) {
      SendWr wr = send;
      wr.wr_id = i + 1;
      history.record("a", label, "post", post_json(wr));
    });
    std::mutex mu;
    std::map<uint32_t, std::string> labels{{17, label}};
    auto wc_json = [&](const WorkCompletion& wc) {
      std::string object;
      {
        std::lock_guard lock(mu);
        object = labels.at(wc.qp_num);
      }
      return std::make_pair(object, json{{"wr_id", wc.wr_id},
                                         {"status", std::string(to_string(wc.status))},
                                         {"opcode", std::string(to_string(wc.opcode))},
                                         {"qp_num", wc.qp_num},
                                         {"byte_len", wc.byte_len},
                                         {"vendor_err", wc.vendor_err},
                                         {"cq", "cq:1"}});
    };
    ibv_wc raw{};
    raw.qp_num = 17;
    raw.byte_len = 64;
    out["verbs_poll_1wc_json_ns"] = time_per_op(n, [&](uint64_t i) {
      std::vector<ibv_wc> wcs(32);
      raw.wr_id = i + 1;
      wcs[0] = raw;
      std::vector<WorkCompletion> got;
      got.push_back(verbs::from_ibv(wcs[0]));
      auto rec = wc_json(got[0]);
      if (rec.second.size() != 7) throw Failure("json");
    });
    out["verbs_poll_1wc_json_record_ns"] = time_per_op(n, [&](uint64_t i) {
      std::vector<ibv_wc> wcs(32);
      raw.wr_id = i + 1;
      wcs[0] = raw;
      std::vector<WorkCompletion> got;
      got.push_back(verbs::from_ibv(wcs[0]));
      auto rec = wc_json(got[0]);
      history.record("a", rec.first, "wc", std::move(rec.second));
    });
  }
  out["iters"] = n;
  std::printf("%s\n", json{{"role", "micro"}, {"results", out}}.dump(1).c_str());
  return 0;
}

int run(const Options& o) {
  if (o.role == "micro") return run_micro(o);
  const TimeNs start_deadline = now_ns() + static_cast<TimeNs>(o.timeout_s * 1e9);
  if (o.role == "server") {
    auto ctl = Control::accept_one(o.port, start_deadline);
    json out = json::array();
    for (;;) {
      const json msg = ctl->recv(now_ns() + static_cast<TimeNs>(o.timeout_s * 1e9),
                                 "the client's next session");
      if (msg.value("op", "") == "bye") break;
      if (msg.value("op", "") != "session") throw Failure("unexpected message " + msg.dump());
      const Params p = Params::from_json(msg.at("params"));
      try {
        out.push_back(run_server_session(o, *ctl, p));
      } catch (const std::exception& e) {
        try {  // tell the client why, then fail
          ctl->send({{"op", "error"}, {"error", std::string("server: ") + e.what()}},
                    now_ns() + kNsPerSec);
        } catch (const std::exception&) {
        }
        throw;
      }
    }
    std::printf("%s\n", json{{"role", "server"}, {"sessions", out}}.dump(1).c_str());
    return 0;
  }
  auto ctl = Control::connect_to(o.peer, o.port, start_deadline);
  json out = json::array();
  for (const auto& test : o.tests) {
    for (uint32_t size : o.sizes) {
      for (const auto& mode : o.modes) {
        for (const auto& wait : o.waits) {
          if ((mode == "direct" || mode == "raw") && wait == "pace") continue;  // Traffic's
          Params p;
          p.test = test;
          p.size = size;
          auto it = o.iters_for.find(size);
          p.iters = test == "send_lat" ? o.lat_iters : (it != o.iters_for.end() ? it->second : o.iters);
          p.mode = mode;
          p.wait = mode == "direct" || mode == "raw" ? "poll" : wait;
          p.tx_depth = o.tx_depth;
          p.rx_depth = o.rx_depth;
          p.cq_mod = o.cq_mod;
          p.out_reads = o.out_reads;
          p.mtu = o.mtu;
          p.poll_max_us = o.poll_max_us;
          p.timer_slack_ns = o.timer_slack_ns;
          p.spin_us = o.spin_us;
          p.spin_yield = o.spin_yield;
          p.profile = o.profile && p.wait == "poll";
          try {
            out.push_back(run_client_session(o, *ctl, p));
          } catch (const std::exception& e) {
            try {
              ctl->send({{"op", "error"}, {"error", std::string("client: ") + e.what()}},
                        now_ns() + kNsPerSec);
            } catch (const std::exception&) {
            }
            throw Failure(test + " " + std::to_string(size) + " B (" + mode + "/" + wait +
                          "): " + e.what());
          }
          std::fprintf(stderr, "rdmalab_bench_traffic: %s\n", out.back().dump().c_str());
        }
      }
    }
  }
  ctl->send({{"op", "bye"}}, now_ns() + 5 * kNsPerSec);
  std::printf("%s\n", json{{"role", "client"}, {"device", o.dev}, {"results", out}}.dump(1).c_str());
  return 0;
}

const char* g_role = "?";

void on_alarm(int) {
  static const char msg[] = "rdmalab_bench_traffic: watchdog: --max-s passed, exiting\n";
  (void)!::write(2, msg, sizeof msg - 1);
  _exit(3);
}

}  // namespace
}  // namespace rdmalab::bench

int main(int argc, char** argv) {
  using namespace rdmalab::bench;
  const Options o = parse(argc, argv);
  g_role = o.role.c_str();
  std::signal(SIGALRM, on_alarm);
  alarm(static_cast<unsigned>(std::max(1.0, o.max_s)));
  try {
    return run(o);
  } catch (const rdmalab::Error& e) {
    std::fprintf(stderr, "rdmalab_bench_traffic: %s: %s failed: errno %d (%s) %s\n", g_role,
                 e.verb().c_str(), e.err(), std::strerror(e.err()), e.detail().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmalab_bench_traffic: %s: %s\n", g_role, e.what());
  }
  return 1;
}
