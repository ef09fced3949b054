// History keeps each record as its JSON line: the lines must be exactly what
// HistoryRecord::to_json().dump() gives (scenarios outside the project read the export).
#include "rdmalab/history.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace rdmalab {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

TEST(History, LinesAreTheRecordsDumpedByNlohmann) {
  TimeNs now = 5;
  History h([&now] { return now; });
  const std::vector<nlohmann::json> datas = {
      nlohmann::json::object(),
      {{"verb", "rdma_connect"}, {"port", 7471}, {"ok", true}, {"none", nullptr}},
      {{"neg", -12}, {"big", uint64_t{18446744073709551615ULL}}, {"f", 0.1}, {"g", 1e300}},
      {{"nested", {{"b", {1, 2, {{"c", "d"}}}}, {"a", nlohmann::json::array()}}}},
      {{"quote\"key", "tab\there \"q\" back\\slash \x01 ctl"}, {"utf8", "caf\xc3\xa9 \xe2\x9c\x93"}},
  };
  std::vector<HistoryRecord> expect;
  for (size_t i = 0; i < datas.size(); ++i) {
    now += 1000;
    const std::string host = i == 3 ? "h\"ost" : "a";
    h.record(host, "qp:" + std::to_string(i), i == 2 ? "k\xc3\xa9nd" : "verb", datas[i]);
    expect.push_back({i, now, host, "qp:" + std::to_string(i),
                      i == 2 ? "k\xc3\xa9nd" : "verb", datas[i]});
  }
  h.record("", "fabric", "fault");  // default data: {}
  expect.push_back({datas.size(), now, "", "fabric", "fault", nlohmann::json::object()});

  const auto lines = lines_of(h.to_jsonl());
  ASSERT_EQ(lines.size(), expect.size());
  for (size_t i = 0; i < expect.size(); ++i) EXPECT_EQ(lines[i], expect[i].to_json().dump()) << i;
  EXPECT_EQ(h.size(), expect.size());
  EXPECT_EQ(lines_of(h.since_jsonl(4)), std::vector<std::string>(lines.begin() + 4, lines.end()));
  EXPECT_EQ(h.since_jsonl(expect.size()), "");

  const auto back = h.since(1);  // parsed back from the lines
  ASSERT_EQ(back.size(), expect.size() - 1);
  EXPECT_EQ(back[0].data, expect[1].data);
  EXPECT_EQ(back[1].data["neg"], -12);
  EXPECT_EQ(back[2].host, "h\"ost");
  EXPECT_EQ(back[3].data["quote\"key"], expect[4].data["quote\"key"]);
  EXPECT_EQ(h.snapshot().size(), expect.size());
}

TEST(History, InvalidUtf8IsReplacedNotThrown) {
  History h(nullptr);
  EXPECT_NO_THROW(h.record("a", "x", "verb", {{"bad", std::string("\xff\xfe")}}));
  EXPECT_EQ(h.to_jsonl(),
            "{\"data\":{\"bad\":\"\xef\xbf\xbd\xef\xbf\xbd\"},\"host\":\"a\",\"kind\":\"verb\","
            "\"object\":\"x\",\"seq\":0,\"t_ns\":0}\n");
}

TEST(History, LinesSpanManyChunksInOrder) {
  History h(nullptr);
  const std::string big(700 * 1024, 'x');  // two of these never share a 1 MiB chunk
  for (int i = 0; i < 5; ++i) {
    h.record("a", "o", "big", {{"i", i}, {"s", big}});
    h.record("a", "o", "small", {{"i", i}});
  }
  const auto lines = lines_of(h.to_jsonl());
  ASSERT_EQ(lines.size(), 10U);
  for (int i = 0; i < 10; ++i) {
    const auto j = nlohmann::json::parse(lines[static_cast<size_t>(i)]);
    EXPECT_EQ(j["seq"], i);
    EXPECT_EQ(j["data"]["i"], i / 2);
    EXPECT_EQ(j["kind"], i % 2 == 0 ? "big" : "small");
  }
  EXPECT_EQ(lines_of(h.since_jsonl(7)).size(), 3U);
  EXPECT_EQ(nlohmann::json::parse(lines_of(h.since_jsonl(7))[0])["seq"], 7);
}

TEST(History, ObserverSeesTheRecord) {
  History h([] { return TimeNs{42}; });
  std::vector<HistoryRecord> seen;
  h.set_observer([&seen](const HistoryRecord& r) { seen.push_back(r); });
  EXPECT_EQ(h.record("b", "cq:1", "wc", {{"status", "SUCCESS"}}), 0U);
  ASSERT_EQ(seen.size(), 1U);
  EXPECT_EQ(seen[0].t_ns, 42);
  EXPECT_EQ(seen[0].kind, "wc");
  EXPECT_EQ(seen[0].data["status"], "SUCCESS");
}

TEST(History, WaitSinceReturnsOnceARecordComesAndEmptyAtItsEnd) {
  using std::chrono::milliseconds;
  History h([] { return TimeNs{0}; });
  h.record("a", "qp:1", "first");
  EXPECT_EQ(lines_of(h.wait_since_jsonl(0, milliseconds(0))).size(), 1U);  // there already
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(h.wait_since_jsonl(1, milliseconds(20)), "");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(20));
  std::thread writer([&h] {
    std::this_thread::sleep_for(milliseconds(20));
    h.record("a", "qp:1", "second");
  });
  // Woken by the record, long before the minute it may wait (a deadline kept, not a guess).
  const std::string got = h.wait_since_jsonl(1, std::chrono::minutes(1));
  writer.join();
  ASSERT_EQ(lines_of(got).size(), 1U);
  EXPECT_NE(got.find("\"second\""), std::string::npos) << got;
}

}  // namespace
}  // namespace rdmalab
