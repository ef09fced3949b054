// Metrics::push: the Pushgateway protocol (PUT of the exposition text to
// /metrics/job/<job>/<label>/<value>...) over libcurl. prometheus-cpp's Gateway does the same
// but sets no timeout (a stalled gateway would block the run for ever); here the request has
// a deadline.
#include <curl/curl.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <mutex>

#include "metrics/metrics.h"
#include "rdmalab/error.h"

namespace rdmalab::metrics {

namespace {

constexpr const char* kVerb = "metrics_push";

bool is_name(const std::string& s) {
  if (s.empty() || s.size() > 64 || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// Values go into the URL path unescaped: only names that need no escaping.
bool is_value(const std::string& s) {
  return !s.empty() && bounded(s) == s;
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

size_t discard(char*, size_t size, size_t n, void*) {
  return size * n;
}

void check_grouping_label(const std::string& name, const std::string& value) {
  if (!is_name(name) || !is_value(value) || name == "job") {
    throw Error(kVerb, EINVAL, "grouping label " + name + "=" + value + ": not a plain name");
  }
}

}  // namespace

std::string push_uri(const std::string& url_in, const std::string& job,
                     const std::map<std::string, std::string>& grouping) {
  std::string url = url_in;
  while (!url.empty() && url.back() == '/') url.pop_back();
  const size_t scheme = url.find("://");
  const std::string rest = scheme == std::string::npos ? "" : url.substr(scheme + 3);
  const bool http = url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0;
  if (!http || rest.empty() || rest.find('/') != std::string::npos ||
      rest.find(':') == std::string::npos) {
    throw Error(kVerb, EINVAL, "Pushgateway URL must be http(s)://host:port, got " + url_in);
  }
  if (!is_name(job)) throw Error(kVerb, EINVAL, "job must be a plain name, got " + job);
  std::string uri = url + "/metrics/job/" + job;
  for (const auto& [name, value] : grouping) {
    check_grouping_label(name, value);
    uri.append("/").append(name).append("/").append(value);
  }
  return uri;
}

void Metrics::push(const std::string& url, const std::string& job,
                   const std::map<std::string, std::string>& grouping, TimeNs timeout_ns) {
  const std::string uri = push_uri(url, job, grouping);
  const std::string body = text();
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) throw Error(kVerb, ENOMEM, "curl_easy_init failed");
  std::unique_ptr<curl_slist, SlistDeleter> headers(
      curl_slist_append(nullptr, "Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  // No "Expect: 100-continue": a gateway that does not answer it would cost a second.
  // (Appending to a non-empty list keeps its head.)
  if (headers) curl_slist_append(headers.get(), "Expect:");
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, uri.c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &discard);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_NOPROXY, "localhost,127.0.0.1,::1");  // loopback: never a proxy
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(std::max<TimeNs>(1, timeout_ns / 1000000)));
  const CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    throw Error(kVerb, ETIMEDOUT, uri + ": no answer within " + std::to_string(timeout_ns) + " ns");
  }
  if (rc != CURLE_OK) throw Error(kVerb, EIO, uri + ": " + curl_easy_strerror(rc));
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status < 200 || status >= 300) {
    throw Error(kVerb, EIO, uri + ": Pushgateway answered HTTP " + std::to_string(status));
  }
}

}  // namespace rdmalab::metrics
