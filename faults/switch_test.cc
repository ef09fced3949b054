// The switch end to end: fake VMs are unix datagram sockets in a temporary directory, the
// switch runs in this thread (poll_once between steps), the controller talks over the stream
// socket. Every wait has a deadline.
#include "faults/switch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "faults/checksum.h"
#include "faults/test_frames.h"
#include "faults/test_paths.h"

extern char** environ;

namespace rdmalab::faults {
namespace {

using namespace testing;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kDeadline = 5'000 * kMs;

sockaddr_un addr(const std::string& path, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

// A fake qemu: its own bound datagram socket, sending to the switch's.
struct Vm {
  explicit Vm(std::string p) : path(std::move(p)) {
    fd.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    socklen_t len = 0;
    const sockaddr_un a = addr(path, len);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), len), 0) << path;
  }
  void send(const std::string& sw, const Frame8& frame) const {
    socklen_t len = 0;
    const sockaddr_un a = addr(sw, len);
    ASSERT_EQ(::sendto(fd.get(), frame.data(), frame.size(), 0,
                       reinterpret_cast<const sockaddr*>(&a), len),
              static_cast<ssize_t>(frame.size()));
  }
  std::optional<Frame8> try_recv() const {
    Frame8 buf(65536);
    const ssize_t n = ::recv(fd.get(), buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0) return std::nullopt;
    buf.resize(static_cast<size_t>(n));
    return buf;
  }
  std::string path;
  Fd fd;
};

// The controller's side of the stream socket.
struct Control {
  explicit Control(const std::string& path) {
    fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    socklen_t len = 0;
    const sockaddr_un a = addr(path, len);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), len), 0) << path;
    ::fcntl(fd.get(), F_SETFL, O_NONBLOCK);
  }
  void send_raw(const std::string& s) const {
    ASSERT_EQ(::send(fd.get(), s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
  }
  Fd fd;
  std::string in;
  bool eof = false;
};

class SwitchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdmalab-faults-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    vm1_ = std::make_unique<Vm>(dir_ + "/vm1.sock");
    vm2_ = std::make_unique<Vm>(dir_ + "/vm2.sock");
    vm3_ = std::make_unique<Vm>(dir_ + "/vm3.sock");
  }
  void TearDown() override {
    sw_.reset();
    fs::remove_all(dir_);
  }

  void start(SwitchOptions o = {}, bool named_peers = true) {
    o.sock = sock();
    o.control = control_path();
    if (named_peers) o.peers = {vm1_->path, vm2_->path, vm3_->path};
    sw_ = std::make_unique<Switch>(o);
  }
  std::string sock() const { return dir_ + "/sw.sock"; }
  std::string control_path() const { return dir_ + "/control.sock"; }

  std::optional<Frame8> recv(const Vm& vm, uint64_t timeout_ns = kDeadline) {
    const uint64_t end = monotonic_ns() + timeout_ns;
    for (;;) {
      if (auto f = vm.try_recv()) return f;
      if (monotonic_ns() > end) return std::nullopt;
      sw_->poll_once(kMs);
    }
  }
  // Pumps the switch for a while; true when nothing reached vm.
  bool quiet(const Vm& vm, uint64_t ns = 30 * kMs) { return !recv(vm, ns); }

  json request(Control& c, const json& req) { return request_raw(c, req.dump() + "\n"); }
  json request_raw(Control& c, const std::string& line) {
    c.send_raw(line);
    return reply(c);
  }
  json reply(Control& c) {
    const uint64_t end = monotonic_ns() + kDeadline;
    while (c.in.find('\n') == std::string::npos && !c.eof && monotonic_ns() < end) {
      sw_->poll_once(kMs);
      char buf[65536];
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) c.in.append(buf, static_cast<size_t>(n));
      if (n == 0) c.eof = true;
    }
    const size_t nl = c.in.find('\n');
    if (nl == std::string::npos) return json{{"no_reply", true}};
    const json r = json::parse(c.in.substr(0, nl));
    c.in.erase(0, nl + 1);
    return r;
  }
  bool closed_by_switch(Control& c) {
    const uint64_t end = monotonic_ns() + kDeadline;
    while (!c.eof && monotonic_ns() < end) {
      sw_->poll_once(kMs);
      char buf[4096];
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) c.eof = true;
    }
    return c.eof;
  }
  json counters() { return sw_->handle({{"op", "counters"}})["counters"]; }
  json records() { return sw_->handle({{"op", "history"}})["records"]; }
  uint64_t add_rule(const json& rule) {
    const json r = sw_->handle({{"op", "add_rule"}, {"rule", rule}});
    EXPECT_EQ(r["ok"], true) << r.dump();
    return r.value("id", uint64_t{0});
  }
  // B makes itself known so that frames to kMacB are unicast to vm2.
  void learn_b() {
    vm2_->send(sock(), arp_request(kMacB));
    ASSERT_TRUE(recv(*vm1_));
    ASSERT_TRUE(recv(*vm3_));
  }

  std::string dir_;
  std::unique_ptr<Vm> vm1_, vm2_, vm3_;
  std::unique_ptr<Switch> sw_;
};

// rec: the release of the frame that kept (its delay or reorder record) kept.
void expect_release(const json& rec, const json& kept, uint64_t rule, const std::string& reason) {
  SCOPED_TRACE(rec.dump());
  EXPECT_EQ(rec["action"], "release");
  EXPECT_EQ(rec["rule"], rule);
  EXPECT_EQ(rec["of_seq"], kept["seq"]);
  EXPECT_EQ(rec["reason"], reason);
  EXPECT_EQ(rec["held_ns"], rec["t_ns"].get<uint64_t>() - kept["t_ns"].get<uint64_t>());
}

TEST_F(SwitchTest, LearnsFloodsAndForwards) {
  start();
  const Frame8 arp = arp_request(kMacA);
  vm1_->send(sock(), arp);
  EXPECT_EQ(recv(*vm2_), arp);  // broadcast: every named peer but the sender
  EXPECT_EQ(recv(*vm3_), arp);
  EXPECT_TRUE(quiet(*vm1_));

  const Frame8 reply = unicast(kMacA, kMacB, 1);
  vm2_->send(sock(), reply);
  EXPECT_EQ(recv(*vm1_), reply);  // A was learned from its ARP
  EXPECT_TRUE(quiet(*vm3_));

  const Frame8 to_b = unicast(kMacB, kMacA, 2);
  vm1_->send(sock(), to_b);
  EXPECT_EQ(recv(*vm2_), to_b);
  EXPECT_TRUE(quiet(*vm3_));

  const Frame8 to_c = unicast(kMacC, kMacA, 3);  // C never sent: flooded
  vm1_->send(sock(), to_c);
  EXPECT_EQ(recv(*vm2_), to_c);
  EXPECT_EQ(recv(*vm3_), to_c);

  vm1_->send(sock(), unicast(kMacA, kMacA, 4));  // back to where it came from: nowhere
  EXPECT_TRUE(quiet(*vm1_));
  EXPECT_TRUE(quiet(*vm2_, 5 * kMs));
  const json fwd = counters()["forward"];
  EXPECT_EQ(fwd["sent"], 6);
  EXPECT_EQ(fwd["flooded"], 2);
}

TEST_F(SwitchTest, LearnsPeersThatWereNotNamed) {
  start({}, /*named_peers=*/false);
  vm1_->send(sock(), arp_request(kMacA));
  EXPECT_TRUE(quiet(*vm2_));  // nobody known yet
  vm2_->send(sock(), arp_request(kMacB));
  EXPECT_TRUE(recv(*vm1_));  // vm1 became a peer when it sent
}

TEST_F(SwitchTest, PeersThatAreDownAreSkipped) {
  SwitchOptions o;
  o.sock = sock();
  o.peers = {dir_ + "/gone.sock", vm2_->path};  // never bound: ENOENT
  sw_ = std::make_unique<Switch>(o);
  vm3_->send(sock(), arp_request(kMacC));
  EXPECT_TRUE(recv(*vm2_));
  vm3_.reset();  // went away after it was learned: ECONNREFUSED
  vm1_->send(sock(), arp_request(kMacA));
  EXPECT_TRUE(recv(*vm2_));
  EXPECT_EQ(counters()["forward"]["peer_down"], 3);
  EXPECT_EQ(counters()["forward"]["send_errors"], 0);
}

TEST_F(SwitchTest, MalformedFramesAreCountedAndStillSwitched) {
  start();
  learn_b();
  vm1_->send(sock(), Frame8(10, 0xEE));  // no room for the MACs: cannot be switched
  EXPECT_TRUE(quiet(*vm2_));
  Frame8 cut = send_only_to_0x12();
  cut.resize(40);  // IPv4 says more than is there
  vm1_->send(sock(), cut);
  EXPECT_EQ(recv(*vm2_), cut);
  EXPECT_EQ(counters()["frames"]["malformed"], 2);
}

TEST_F(SwitchTest, DropCmDrepDropsOnlyDrepsAndRecordsIt) {
  start();
  learn_b();
  const uint64_t id = add_rule({{"action", "drop"}, {"cm", "DREP"}});
  const Frame8 req = cm_mad(0x10, 5, 0), drep = cm_drep(), dreq = cm_mad(0x15, 5, 6);
  vm1_->send(sock(), req);
  vm1_->send(sock(), drep);
  vm1_->send(sock(), dreq);
  EXPECT_EQ(recv(*vm2_), req);
  EXPECT_EQ(recv(*vm2_), dreq);
  EXPECT_TRUE(quiet(*vm2_));
  const json c = counters();
  EXPECT_EQ(c["actions"]["drop"], 1);
  EXPECT_EQ(c["rules"][std::to_string(id)]["acted"], 1);
  EXPECT_EQ(c["frames"]["cm"]["DREP"], 1);
  EXPECT_EQ(c["frames"]["cm"]["REQ"], 1);
  const json h = sw_->handle({{"op", "history"}});
  ASSERT_EQ(h["records"].size(), 1u);
  EXPECT_EQ(h["records"][0]["action"], "drop");
  EXPECT_EQ(h["records"][0]["rule"], id);
  EXPECT_EQ(h["records"][0]["frame"]["cm"], "DREP");
  EXPECT_EQ(h["records"][0]["frame"]["local_comm_id"], 0x0A0B0C0D);
}

TEST_F(SwitchTest, DelayReleasesAfterDelayNs) {
  start();
  learn_b();
  const uint64_t id =
      add_rule({{"action", "delay"}, {"delay_ns", 40 * kMs}, {"opcode", "SEND_ONLY"}});
  const Frame8 send = send_only_to_0x12(), other = unicast(kMacB, kMacA, 9);
  const uint64_t t0 = monotonic_ns();
  vm1_->send(sock(), send);
  vm1_->send(sock(), other);
  EXPECT_EQ(recv(*vm2_), other);  // overtakes the delayed frame
  EXPECT_EQ(recv(*vm2_), send);
  EXPECT_GE(monotonic_ns() - t0, 40 * kMs);
  const json fwd = counters()["forward"];
  EXPECT_EQ(fwd["released"], 1);
  EXPECT_EQ(fwd["released_by"]["delay_elapsed"], 1);
  const json r = records();
  ASSERT_EQ(r.size(), 2u) << r.dump();
  EXPECT_EQ(r[0]["action"], "delay");
  EXPECT_EQ(r[0]["rule"], id);
  expect_release(r[1], r[0], id, "delay_elapsed");
  EXPECT_GE(r[1]["held_ns"], 40 * kMs);
}

TEST_F(SwitchTest, DuplicateSendsTwice) {
  start();
  learn_b();
  add_rule({{"action", "duplicate"}, {"dest_qpn", 0x12}, {"count", 1}});
  const Frame8 send = send_only_to_0x12();
  vm1_->send(sock(), send);
  EXPECT_EQ(recv(*vm2_), send);
  EXPECT_EQ(recv(*vm2_), send);
  EXPECT_TRUE(quiet(*vm2_));
  vm1_->send(sock(), send);  // count spent
  EXPECT_EQ(recv(*vm2_), send);
  EXPECT_TRUE(quiet(*vm2_));
}

Frame8 send_psn(uint32_t psn) {
  Roce r;
  r.psn = psn;
  r.payload = {1, 2, 3, 4};
  return roce_v4(r);
}

TEST_F(SwitchTest, ReorderSwapsTwoFramesOfAFlow) {
  start();
  learn_b();
  const uint64_t id = add_rule(
      {{"action", "reorder"}, {"opcode", "SEND_ONLY"}, {"count", 1}, {"hold_ns", 10'000 * kMs}});
  vm1_->send(sock(), send_psn(1));
  EXPECT_TRUE(quiet(*vm2_));  // held
  vm1_->send(sock(), send_psn(2));
  EXPECT_EQ(parse(*recv(*vm2_)).bth->psn, 2u);
  EXPECT_EQ(parse(*recv(*vm2_)).bth->psn, 1u);
  const json fwd = counters()["forward"];
  EXPECT_EQ(fwd["pending"], 0);
  EXPECT_EQ(fwd["released"], 1);
  EXPECT_EQ(fwd["released_by"]["next_frame"], 1);
  const json r = records();
  ASSERT_EQ(r.size(), 2u) << r.dump();
  EXPECT_EQ(r[0]["action"], "reorder");
  EXPECT_EQ(r[0]["frame"]["psn"], 1);
  expect_release(r[1], r[0], id, "next_frame");
  EXPECT_LT(r[1]["held_ns"], 10'000 * kMs);
}

// Two frames held, then one passes: both go after it, oldest first, and are recorded so.
TEST_F(SwitchTest, ReorderReleasesEveryHeldFrameInOrder) {
  start();
  learn_b();
  const uint64_t id = add_rule(
      {{"action", "reorder"}, {"opcode", "SEND_ONLY"}, {"count", 2}, {"hold_ns", 10'000 * kMs}});
  vm1_->send(sock(), send_psn(1));
  vm1_->send(sock(), send_psn(2));
  EXPECT_TRUE(quiet(*vm2_));
  vm1_->send(sock(), send_psn(3));
  for (uint32_t psn : {3u, 1u, 2u}) EXPECT_EQ(parse(*recv(*vm2_)).bth->psn, psn);
  const json r = records();
  ASSERT_EQ(r.size(), 4u) << r.dump();
  expect_release(r[2], r[0], id, "next_frame");
  expect_release(r[3], r[1], id, "next_frame");
  EXPECT_EQ(r[2]["t_ns"], r[3]["t_ns"]);
}

TEST_F(SwitchTest, ReorderReleasesAtTheDeadline) {
  start();
  learn_b();
  const uint64_t id =
      add_rule({{"action", "reorder"}, {"opcode", "SEND_ONLY"}, {"hold_ns", 30 * kMs}});
  const uint64_t t0 = monotonic_ns();
  vm1_->send(sock(), send_psn(1));
  const auto f = recv(*vm2_);
  ASSERT_TRUE(f);
  EXPECT_GE(monotonic_ns() - t0, 30 * kMs);
  EXPECT_EQ(counters()["forward"]["released_by"]["hold_deadline"], 1);
  const json r = records();
  ASSERT_EQ(r.size(), 2u) << r.dump();
  EXPECT_EQ(r[0]["action"], "reorder");
  expect_release(r[1], r[0], id, "hold_deadline");
  EXPECT_GE(r[1]["held_ns"], 30 * kMs);
}

// A delayed frame that leaves lets the frame held before it in its flow go: the delay's
// release is recorded first, as the frames are sent.
TEST_F(SwitchTest, DelayedFrameReleasesAHeldOne) {
  start();
  learn_b();
  const uint64_t hold = add_rule(
      {{"action", "reorder"}, {"opcode", "SEND_ONLY"}, {"count", 1}, {"hold_ns", 10'000 * kMs}});
  const uint64_t delay =
      add_rule({{"action", "delay"}, {"delay_ns", 20 * kMs}, {"opcode", "SEND_ONLY"}});
  vm1_->send(sock(), send_psn(1));  // held
  vm1_->send(sock(), send_psn(2));  // the reorder's count is spent: delayed
  EXPECT_EQ(parse(*recv(*vm2_)).bth->psn, 2u);
  EXPECT_EQ(parse(*recv(*vm2_)).bth->psn, 1u);
  const json r = records();
  ASSERT_EQ(r.size(), 4u) << r.dump();
  EXPECT_EQ(r[0]["action"], "reorder");
  EXPECT_EQ(r[1]["action"], "delay");
  expect_release(r[2], r[1], delay, "delay_elapsed");
  expect_release(r[3], r[0], hold, "next_frame");
  EXPECT_EQ(r[2]["t_ns"], r[3]["t_ns"]);
}

// What is still delayed or held when the switch stops is dropped, and recorded so.
TEST_F(SwitchTest, PendingFramesAreDroppedAtShutdown) {
  start();
  learn_b();
  const uint64_t delay = add_rule(
      {{"action", "delay"}, {"delay_ns", 10'000 * kMs}, {"opcode", "SEND_ONLY"}, {"count", 1}});
  const uint64_t hold =
      add_rule({{"action", "reorder"}, {"opcode", "SEND_ONLY"}, {"hold_ns", 10'000 * kMs}});
  vm1_->send(sock(), send_psn(1));
  vm1_->send(sock(), send_psn(2));
  EXPECT_TRUE(quiet(*vm2_));
  EXPECT_EQ(counters()["forward"]["pending"], 2);
  sw_->stop();
  sw_->run();  // returns at once, through shutdown()
  EXPECT_TRUE(quiet(*vm2_));
  const json fwd = counters()["forward"];
  EXPECT_EQ(fwd["pending"], 0);
  EXPECT_EQ(fwd["released"], 0);
  EXPECT_EQ(fwd["dropped_at_shutdown"], 2);
  const json r = records();
  ASSERT_EQ(r.size(), 4u) << r.dump();
  expect_release(r[2], r[0], delay, "dropped_at_shutdown");
  expect_release(r[3], r[1], hold, "dropped_at_shutdown");
}

TEST_F(SwitchTest, CorruptReachesTheReceiverWithAValidIcrc) {
  start();
  learn_b();
  add_rule({{"action", "corrupt"}, {"layer", "bth"}, {"offset", 7}, {"xor", 1}});
  vm1_->send(sock(), send_only_to_0x12());
  const auto got = recv(*vm2_);
  ASSERT_TRUE(got);
  const Frame f = parse(*got);
  EXPECT_EQ(f.bth->dest_qpn, 0x13u);
  EXPECT_TRUE(icrc_ok(*got, f));
  const json h = sw_->handle({{"op", "history"}});
  EXPECT_EQ(h["records"][0]["corrupted"]["frame_offset"], 42 + 7);
  EXPECT_EQ(h["records"][0]["corrupted"]["recomputed"], json({"icrc", "ipv4"}));
}

// (sec, usec, incl_len, orig_len, frame) per record after a checked global header.
std::vector<Frame8> read_pcap(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto le32 = [&](size_t off) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(data[off + i])} << (8 * i);
    return v;
  };
  EXPECT_GE(data.size(), 24u);
  if (data.size() < 24) return {};
  EXPECT_EQ(le32(0), 0xA1B2C3D4u);
  EXPECT_EQ(le32(4), 2u | (4u << 16));  // version 2.4
  EXPECT_EQ(le32(16), 65536u);
  EXPECT_EQ(le32(20), 1u);  // Ethernet
  std::vector<Frame8> out;
  size_t pos = 24;
  while (pos + 16 <= data.size()) {
    const uint32_t incl = le32(pos + 8);
    EXPECT_EQ(incl, le32(pos + 12));
    EXPECT_LT(le32(pos + 4), 1'000'000u);
    EXPECT_LE(pos + 16 + incl, data.size());
    out.emplace_back(data.begin() + static_cast<long>(pos + 16),
                     data.begin() + static_cast<long>(pos + 16 + incl));
    pos += 16 + incl;
  }
  EXPECT_EQ(pos, data.size());
  return out;
}

TEST_F(SwitchTest, PcapRecordsEveryFrameReceived) {
  SwitchOptions o;
  o.pcap = dir_ + "/fabric.pcap";
  start(o);
  const std::vector<Frame8> sent = {arp_request(kMacA), cm_drep(), tcp_syn()};
  add_rule({{"action", "drop"}, {"cm", "DREP"}});  // dropped frames were received all the same
  for (const Frame8& f : sent) vm1_->send(sock(), f);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(recv(*vm2_));
  EXPECT_EQ(read_pcap(o.pcap), sent);

  Control c(control_path());
  const std::string second = dir_ + "/second.pcap";
  EXPECT_EQ(request(c, {{"op", "pcap"}, {"path", second}})["ok"], true);
  vm1_->send(sock(), sent[0]);
  ASSERT_TRUE(recv(*vm2_));
  EXPECT_EQ(request(c, {{"op", "pcap"}, {"path", nullptr}})["ok"], true);
  vm1_->send(sock(), sent[2]);
  ASSERT_TRUE(recv(*vm2_));
  EXPECT_EQ(read_pcap(second), std::vector<Frame8>{sent[0]});
  EXPECT_EQ(read_pcap(o.pcap).size(), 3u);
  const json bad = request(c, {{"op", "pcap"}, {"path", dir_ + "/no/such/dir/x.pcap"}});
  EXPECT_EQ(bad["ok"], false);
}

TEST_F(SwitchTest, PcapCappedByMaxBytesCountsWhatItKeptOut) {
  start();
  Control c(control_path());
  const std::string capped = dir_ + "/capped.pcap";
  const Frame8 drep = cm_drep();
  // Room for the 24-byte header and exactly two records of this frame.
  const uint64_t max_bytes = 24 + 2 * (16 + drep.size());
  EXPECT_EQ(request(c, {{"op", "pcap"}, {"path", capped}, {"max_bytes", max_bytes}})["ok"], true);
  for (int i = 0; i < 5; ++i) {
    vm1_->send(sock(), drep);
    ASSERT_TRUE(recv(*vm2_));  // forwarded all the same
  }
  const json r = request(c, {{"op", "pcap"}, {"path", nullptr}});
  EXPECT_EQ(r["closed"]["path"], capped);
  EXPECT_EQ(r["closed"]["frames"], 2);
  EXPECT_EQ(r["closed"]["skipped"], 3);
  EXPECT_EQ(read_pcap(capped), (std::vector<Frame8>{drep, drep}));
  EXPECT_EQ(request(c, {{"op", "pcap"}, {"path", nullptr}})["closed"], nullptr);
  EXPECT_EQ(request(c, {{"op", "pcap"}, {"path", capped}, {"max_bytes", -1}})["ok"], false);
}

TEST_F(SwitchTest, ControlProtocol) {
  start();
  Control c(control_path());
  EXPECT_EQ(request(c, {{"op", "ping"}}), json({{"ok", true}}));
  json r = request(c, {{"op", "add_rule"}, {"rule", {{"action", "drop"}, {"cm", "DREP"}}}});
  EXPECT_EQ(r["ok"], true);
  const uint64_t id = r["id"];
  r = request(c, {{"op", "rules"}});
  ASSERT_EQ(r["rules"].size(), 1u);
  EXPECT_EQ(r["rules"][0]["id"], id);
  EXPECT_EQ(r["rules"][0]["rule"]["cm"], "DREP");
  r = request(c, {{"op", "add_rule"}, {"rule", {{"action", "delay"}}}});
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["error"], "rule.delay_ns: missing");
  r = request(c, {{"op", "remove_rule"}, {"id", id + 100}});
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(request(c, {{"op", "remove_rule"}, {"id", id}})["ok"], true);
  EXPECT_EQ(request(c, {{"op", "clear"}})["removed"], 0);
  r = request(
      c, {{"op", "hosts"}, {"hosts", {{"a", {{"mac", "52:54:00:12:34:01"}, {"ip", "10.0.0.1"}}}}}});
  EXPECT_EQ(r["ok"], true);
  EXPECT_EQ(request(c, {{"op", "hosts"}})["hosts"]["a"]["ip"], "10.0.0.1");
  EXPECT_EQ(
      request(c, {{"op", "add_rule"}, {"rule", {{"action", "drop"}, {"src_host", "a"}}}})["ok"],
      true);
  r = request(c, {{"op", "hosts"}, {"hosts", {{"a", {{"mac", "nope"}}}}}});
  EXPECT_EQ(r["error"], "hosts.a.mac: expected xx:xx:xx:xx:xx:xx, got \"nope\"");
  EXPECT_EQ(request(c, {{"op", "counters"}})["counters"]["frames"]["total"], 0);
  r = request(c, {{"op", "history"}, {"since", 0}});
  EXPECT_EQ(r["records"], json::array());
  EXPECT_EQ(r["last_seq"], 0);
  // Errors; the connection stays usable after each.
  EXPECT_EQ(request_raw(c, "this is not json\n")["error"], "request: not valid JSON");
  EXPECT_EQ(request_raw(c, "[1,2]\n")["error"], "request: expected a JSON object");
  EXPECT_EQ(request(c, {{"op", "fly"}})["error"], "op: unknown op 'fly'");
  EXPECT_EQ(request(c, {{"opp", "ping"}})["ok"], false);
  EXPECT_EQ(request(c, {{"op", "ping"}, {"x", 1}})["error"], "x: not a key of op ping");
  EXPECT_EQ(request(c, {{"op", "history"}, {"since", -1}})["error"],
            "since: expected an integer >= 0");
  EXPECT_EQ(request(c, {{"op", "pcap"}})["ok"], false);
  // Two requests in one write, and one split over two writes.
  c.send_raw("{\"op\":\"ping\"}\n{\"op\":\"ping\"}\n");
  EXPECT_EQ(reply(c)["ok"], true);
  EXPECT_EQ(reply(c)["ok"], true);
  c.send_raw("{\"op\":");
  EXPECT_EQ(request_raw(c, "\"ping\"}\n")["ok"], true);
}

TEST_F(SwitchTest, OverLongLineClosesThatClientOnly) {
  SwitchOptions o;
  o.max_line = 1024;
  start(o);
  Control other(control_path());
  EXPECT_EQ(request(other, {{"op", "ping"}})["ok"], true);
  Control c(control_path());
  c.send_raw(std::string(2000, 'x'));
  const json r = reply(c);
  EXPECT_EQ(r["ok"], false);
  EXPECT_NE(r["error"].get<std::string>().find("longer than 1024"), std::string::npos);
  EXPECT_TRUE(closed_by_switch(c));
  EXPECT_EQ(request(other, {{"op", "ping"}})["ok"], true);
  // A complete line that is too long is refused the same way.
  Control d(control_path());
  EXPECT_EQ(request_raw(d, "{\"op\":\"ping\",\"pad\":\"" + std::string(2000, 'p') + "\"}\n")["ok"],
            false);
  EXPECT_TRUE(closed_by_switch(d));
}

TEST_F(SwitchTest, ClientThatLeavesMidLineChangesNothing) {
  start();
  {
    Control c(control_path());
    c.send_raw("{\"op\":\"add_rule\",\"rule\":{\"action\":\"drop\"}}");  // no newline
    for (int i = 0; i < 5; ++i) sw_->poll_once(kMs);
  }
  for (int i = 0; i < 5; ++i) sw_->poll_once(kMs);
  EXPECT_TRUE(sw_->rules().rules_json().empty());
  Control again(control_path());
  EXPECT_EQ(request(again, {{"op", "rules"}})["rules"], json::array());
}

TEST_F(SwitchTest, DeeplyNestedJsonIsJustAnError) {
  start();
  Control c(control_path());
  const json r = request_raw(c, std::string(100'000, '[') + std::string(100'000, ']') + "\n");
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(request(c, {{"op", "ping"}})["ok"], true);
}

// The executable: starts like switch.py (the socket appears), answers on --control, and stops
// cleanly on SIGTERM, removing its sockets.
TEST(SwitchProcess, RunsAndStopsOnSigterm) {
  char tmpl[] = "/tmp/rdmalab-switch-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, sock = dir + "/sw.sock", ctl = dir + "/ctl.sock";
  std::vector<std::string> args = {
      switch_exe(), "--sock", sock,     "--peer", dir + "/vm1.sock",
      "--control",        ctl,      "--seed", "7",      "--keep"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  const uint64_t end = monotonic_ns() + 10'000 * kMs;
  while (!fs::exists(sock) && monotonic_ns() < end) ::poll(nullptr, 0, 10);
  ASSERT_TRUE(fs::exists(sock) && fs::exists(ctl));

  Control c(ctl);
  c.send_raw("{\"op\":\"ping\"}\n");
  pollfd p{c.fd.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  char buf[256] = {};
  ASSERT_GT(::recv(c.fd.get(), buf, sizeof buf - 1, 0), 0);
  EXPECT_EQ(std::string(buf), "{\"ok\":true}\n");

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = -1;
  while (::waitpid(pid, &status, WNOHANG) == 0 && monotonic_ns() < end) ::poll(nullptr, 0, 10);
  if (status == -1) ::kill(pid, SIGKILL), ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(fs::exists(sock));
  EXPECT_FALSE(fs::exists(ctl));

  std::vector<std::string> bad = {switch_exe(), "--peer", "x"};  // no --sock
  std::vector<char*> bad_argv;
  for (auto& a : bad) bad_argv.push_back(a.data());
  bad_argv.push_back(nullptr);
  posix_spawn_file_actions_t quiet;
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, 2, "/dev/null", O_WRONLY, 0);
  ASSERT_EQ(::posix_spawn(&pid, bad_argv[0], &quiet, nullptr, bad_argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&quiet);
  status = -1;
  while (::waitpid(pid, &status, WNOHANG) == 0 && monotonic_ns() < end) ::poll(nullptr, 0, 10);
  if (status == -1) ::kill(pid, SIGKILL), ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rdmalab::faults
