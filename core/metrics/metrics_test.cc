// Exposure: the pull endpoint on loopback (port 0 picks one), the Pushgateway PUT (against a
// one-request HTTP server in the test), its errors and its deadline, and the exposition text.
#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "metrics/test_util.h"
#include "rdmalab/error.h"

namespace rdmalab::metrics {
namespace {

constexpr int kIoTimeoutMs = 5000;

int err_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.err();
  }
  return 0;
}

// A socket with a deadline on every read and write.
struct Socket {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  Socket() {
    timeval tv{kIoTimeoutMs / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  explicit Socket(int f) : fd(f) {}
  ~Socket() {
    if (fd >= 0) close(fd);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
};

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Listens on 127.0.0.1 at a free port; returns the port.
int listen_loopback(Socket& s) {
  sockaddr_in a = loopback(0);
  if (bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  if (listen(s.fd, 4) != 0) return -1;
  socklen_t len = sizeof a;
  getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

std::string http_get(int port, const std::string& path) {
  Socket s;
  sockaddr_in a = loopback(port);
  if (connect(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "connect failed";
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(s.fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "";
  return read_all(s.fd);
}

// Accepts one request (within the deadline), answers `status`, returns the request.
std::string serve_one(Socket& listener, int status) {
  pollfd p{listener.fd, POLLIN, 0};
  if (poll(&p, 1, kIoTimeoutMs) != 1) return "no request";
  Socket c(accept(listener.fd, nullptr, nullptr));
  timeval tv{kIoTimeoutMs / 1000, 0};
  setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string req;
  char buf[4096];
  size_t want = std::string::npos;
  while (want == std::string::npos || req.size() < want) {
    const ssize_t n = read(c.fd, buf, sizeof buf);
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
    const size_t end = req.find("\r\n\r\n");
    const size_t cl = req.find("Content-Length: ");
    if (want == std::string::npos && end != std::string::npos && cl != std::string::npos) {
      want = end + 4 + std::stoul(req.substr(cl + 16));
    }
  }
  const std::string resp =
      "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  (void)!write(c.fd, resp.data(), resp.size());
  return req;
}

TEST(Exposure, ServesTheExpositionOnALoopbackPortItPicks) {
  auto m = Metrics::create();
  m->cm_event(Source{"model", "ib"}, "ESTABLISHED", "OK");
  const int port = m->serve("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  EXPECT_EQ(m->port(), port);
  const std::string body = http_get(port, "/metrics");
  EXPECT_NE(
      body.find(
          R"(rdmalab_cm_events_total{backend="model",device="ib",event="ESTABLISHED",status="OK"} 1)"),
      std::string::npos)
      << body;
  EXPECT_EQ(err_of([&] { m->serve("127.0.0.1", 0); }), EALREADY);
  m->stop_serving();
  EXPECT_EQ(m->port(), 0);
  EXPECT_EQ(http_get(port, "/metrics"), "connect failed");
}

TEST(Exposure, ServeOnABusyPortFails) {
  Socket busy;
  const int port = listen_loopback(busy);
  auto m = Metrics::create();
  EXPECT_EQ(err_of([&] { m->serve("127.0.0.1", port); }), EADDRINUSE);
}

TEST(Exposure, PushPutsTheTextUnderJobAndGrouping) {
  Socket gw;
  const int port = listen_loopback(gw);
  auto m = Metrics::create();
  m->fault(Source{"model", "roce"}, "drop");
  std::string request;
  std::thread server([&] { request = serve_one(gw, 202); });
  m->push("http://127.0.0.1:" + std::to_string(port), "rdmalab", {{"lab", "model"}});
  server.join();
  EXPECT_EQ(request.rfind("PUT /metrics/job/rdmalab/lab/model HTTP/1.1\r\n", 0), 0u) << request;
  EXPECT_NE(request.find(R"(rdmalab_faults_total{backend="model",device="roce",kind="drop"} 1)"),
            std::string::npos)
      << request;
}

TEST(Exposure, PushErrors) {
  auto m = Metrics::create();
  std::string url;
  {
    Socket gw;
    url = "http://127.0.0.1:" + std::to_string(listen_loopback(gw));
    std::thread server([&] { serve_one(gw, 400); });
    EXPECT_EQ(err_of([&] { m->push(url, "rdmalab", {}); }), EIO);  // refused
    server.join();
  }
  EXPECT_EQ(err_of([&] { m->push(url, "rdmalab", {}); }), EIO);  // nobody listens now
  EXPECT_EQ(err_of([&] { m->push("127.0.0.1:9091", "rdmalab", {}); }), EINVAL);
  EXPECT_EQ(err_of([&] { m->push(url, "a/b", {}); }), EINVAL);
  EXPECT_EQ(err_of([&] { m->push(url, "rdmalab", {{"run", "x y"}}); }), EINVAL);
  EXPECT_EQ(push_uri(url + "/", "j", {{"b", "2"}, {"a", "1"}}), url + "/metrics/job/j/a/1/b/2");
}

TEST(Exposure, PushHasADeadline) {
  Socket gw;  // accepts connections (the kernel's backlog) but never answers
  const int port = listen_loopback(gw);
  auto m = Metrics::create();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(err_of([&] {
              m->push("http://127.0.0.1:" + std::to_string(port), "rdmalab", {}, 200 * kNsPerMs);
            }),
            ETIMEDOUT);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

TEST(Exposure, LatencyHistogramsUseTheSharedBuckets) {
  auto m = Metrics::create();
  m->connect_latency(Source{"model", "ib"}, 4e-6);
  m->disconnect_latency(Source{"model", "ib"}, "TIMEWAIT_EXIT", 74.75);
  auto s = testing::find(*m, "rdmalab_cm_disconnect_seconds", {{"until", "TIMEWAIT_EXIT"}});
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->metric.histogram.bucket.size(), latency_buckets().size() + 1);  // and +Inf
  EXPECT_EQ(s->metric.histogram.bucket[11].cumulative_count, 0u);              // le=30
  EXPECT_EQ(s->metric.histogram.bucket[13].cumulative_count, 1u);              // le=120
  EXPECT_NE(
      m->text().find(
          "rdmalab_cm_connect_seconds_bucket{backend=\"model\",device=\"ib\",le=\"1e-05\"} 1"),
      std::string::npos)
      << m->text();
}

}  // namespace
}  // namespace rdmalab::metrics

namespace rdmalab::metrics {
namespace {

// A history from elsewhere (the VM lab's merged JSON lines) goes through the classifier too.
TEST(Ingest, CountsAFinishedHistoryUnderItsBackendAndDevice) {
  auto m = Metrics::create();
  const std::string jsonl =
      R"({"seq":0,"t_ns":10,"host":"a","object":"cm_id:3","kind":"cm_event","data":{"event":"ESTABLISHED","status":0}})"
      "\n"
      R"({"seq":1,"t_ns":20,"host":"b","object":"qp:4","kind":"wc","data":{"status":"WR_FLUSH_ERR"}})"
      "\n\n";
  m->ingest("vm", {{"a", "rxe"}, {"b", "rxe"}}, jsonl);
  const std::string text = m->text();
  EXPECT_NE(text.find(R"(rdmalab_cm_events_total{backend="vm",device="rxe",event="ESTABLISHED",status="OK"} 1)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(rdmalab_work_completions_total{backend="vm",device="rxe",status="WR_FLUSH_ERR"} 1)"),
            std::string::npos)
      << text;
}

TEST(Ingest, AMalformedLineIsEinvalNamingIt) {
  auto m = Metrics::create();
  try {
    m->ingest("vm", {{"a", "siw"}}, "{\"seq\":0}\nnot json\n");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_NE(e.detail().find("history line 1"), std::string::npos) << e.detail();
  }
}

}  // namespace
}  // namespace rdmalab::metrics
