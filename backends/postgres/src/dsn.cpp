// Finds the passwords in a DSN (keyword or URI form), to redact it, scrub
// messages, and add our timeouts unless the DSN sets them (dsn.hpp).
#include "dsn.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace pgmutex::postgres_detail {
namespace {

constexpr std::string_view mask = "********";

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      const int hi = hex_value(text[i + 1]);
      const int lo = hex_value(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

// A span of the DSN that holds a password value: [begin, end), and its unescaped text.
struct SecretSpan {
  std::size_t begin;
  std::size_t end;
  std::string value;
};

// Keyword form, as libpq reads it: key = value, value either 'quoted' (with
// backslash escapes) or running to the next blank.
std::vector<SecretSpan> keyword_password_spans(std::string_view dsn) {
  std::vector<SecretSpan> spans;
  std::size_t i = 0;
  while (i < dsn.size()) {
    while (i < dsn.size() && is_space(dsn[i])) ++i;
    const std::size_t key_begin = i;
    while (i < dsn.size() && dsn[i] != '=' && !is_space(dsn[i])) ++i;
    const std::string_view key = dsn.substr(key_begin, i - key_begin);
    while (i < dsn.size() && is_space(dsn[i])) ++i;
    if (i >= dsn.size() || dsn[i] != '=') {
      // Malformed: treat the rest after a "password" key as secret, to be safe.
      if (key == "password") spans.push_back({i, dsn.size(), std::string(dsn.substr(i))});
      if (key.empty()) ++i;
      continue;
    }
    ++i;  // '='
    while (i < dsn.size() && is_space(dsn[i])) ++i;
    const std::size_t value_begin = i;
    std::string value;
    if (i < dsn.size() && dsn[i] == '\'') {
      ++i;
      while (i < dsn.size() && dsn[i] != '\'') {
        if (dsn[i] == '\\' && i + 1 < dsn.size()) ++i;
        value.push_back(dsn[i++]);
      }
      if (i < dsn.size()) ++i;  // closing quote
    } else {
      while (i < dsn.size() && !is_space(dsn[i])) {
        if (dsn[i] == '\\' && i + 1 < dsn.size()) ++i;
        value.push_back(dsn[i++]);
      }
    }
    if (key == "password") spans.push_back({value_begin, i, std::move(value)});
  }
  return spans;
}

// URI form: the password in user:password@ and any password= parameter.
std::vector<SecretSpan> uri_password_spans(std::string_view dsn) {
  std::vector<SecretSpan> spans;
  const std::size_t scheme_end = dsn.find("://");
  if (scheme_end == std::string_view::npos) return spans;
  const std::size_t authority = scheme_end + 3;
  const std::size_t query = dsn.find('?', authority);
  const std::string_view before_query = dsn.substr(0, query == std::string_view::npos ? dsn.size() : query);
  // The last '@' before the query ends the user info, even if the password holds a raw '/'.
  const std::size_t at = before_query.rfind('@');
  if (at != std::string_view::npos && at >= authority) {
    const std::size_t colon = dsn.find(':', authority);
    if (colon != std::string_view::npos && colon < at)
      spans.push_back({colon + 1, at, percent_decode(dsn.substr(colon + 1, at - colon - 1))});
  }
  // libpq's own rule: the user info ends at the first '@' met before any '/',
  // '?' included in it ("postgresql://u:pa?ss@db" has the password "pa?ss").
  const std::size_t libpq_at = dsn.find_first_of("@/", authority);
  if (libpq_at != std::string_view::npos && dsn[libpq_at] == '@' && libpq_at != at) {
    const std::size_t colon = dsn.find(':', authority);
    if (colon != std::string_view::npos && colon < libpq_at)
      spans.push_back({colon + 1, libpq_at, percent_decode(dsn.substr(colon + 1, libpq_at - colon - 1))});
  }
  if (query != std::string_view::npos) {
    std::size_t i = query + 1;
    while (i <= dsn.size()) {
      std::size_t amp = dsn.find('&', i);
      if (amp == std::string_view::npos) amp = dsn.size();
      const std::string_view param = dsn.substr(i, amp - i);
      const std::size_t eq = param.find('=');
      if (eq != std::string_view::npos && param.substr(0, eq) == "password")
        spans.push_back({i + eq + 1, amp, percent_decode(param.substr(eq + 1))});
      i = amp + 1;
    }
  }
  return spans;
}

// In order, overlapping ones merged (two URI rules may mark one password twice).
std::vector<SecretSpan> password_spans(std::string_view dsn) {
  auto spans = is_uri(dsn) ? uri_password_spans(dsn) : keyword_password_spans(dsn);
  std::ranges::sort(spans, {}, &SecretSpan::begin);
  std::vector<SecretSpan> merged;
  for (SecretSpan& span : spans) {
    if (!merged.empty() && span.begin < merged.back().end) {
      merged.back().end = std::max(merged.back().end, span.end);
      merged.push_back({span.begin, span.begin, std::move(span.value)});  // keeps its value a secret; masks nothing more
      continue;
    }
    merged.push_back(std::move(span));
  }
  return merged;
}

}  // namespace

bool is_uri(std::string_view dsn) noexcept {
  return dsn.starts_with("postgresql://") || dsn.starts_with("postgres://");
}

std::string redact_dsn(std::string_view dsn) {
  auto spans = password_spans(dsn);
  std::string out;
  std::size_t at = 0;
  for (const SecretSpan& span : spans) {
    if (span.begin < at) continue;  // inside one already masked
    out.append(dsn.substr(at, span.begin - at));
    out.append(mask);
    at = span.end;
  }
  out.append(dsn.substr(std::min(at, dsn.size())));
  return out;
}

std::vector<std::string> secrets_of(std::string_view dsn) {
  std::vector<std::string> secrets;
  for (const SecretSpan& span : password_spans(dsn)) {
    secrets.emplace_back(dsn.substr(span.begin, span.end - span.begin));
    secrets.push_back(span.value);
  }
  if (const char* env = std::getenv("PGPASSWORD")) secrets.emplace_back(env);
  // Empty ones would match everywhere; scrub() itself prefers the longest.
  std::erase_if(secrets, [](const std::string& s) { return s.empty(); });
  return secrets;
}

// One pass over the text, the longest secret at each position replaced: a
// mask is never searched again. Replacing one secret after another let
// secrets made of '*' (password=* repeated) multiply the mask, exponentially
// (found by tests/fuzz/fuzz_dsn: one 220-byte DSN took over 15 s).
std::string scrub(std::string text, const std::vector<std::string>& secrets) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    std::size_t longest = 0;
    for (const std::string& secret : secrets)
      if (secret.size() > longest && text.compare(at, secret.size(), secret) == 0) longest = secret.size();
    if (longest > 0) {
      out += mask;
      at += longest;
    } else {
      out.push_back(text[at++]);
    }
  }
  return out;
}

namespace {

// Whether the DSN sets `key`: the name at the start of a keyword pair or a
// URI parameter, followed by '=' (a password that merely contains it does not count).
bool sets(std::string_view dsn, std::string_view key) {
  for (std::size_t at = dsn.find(key); at != std::string_view::npos; at = dsn.find(key, at + 1)) {
    const bool starts = at == 0 || is_space(dsn[at - 1]) || dsn[at - 1] == '?' || dsn[at - 1] == '&';
    std::size_t after = at + key.size();
    while (after < dsn.size() && is_space(dsn[after])) ++after;
    if (starts && after < dsn.size() && dsn[after] == '=') return true;
  }
  return false;
}

// Adds `key=value` unless the DSN already sets the key.
std::string with_setting(std::string dsn, std::string_view key, const std::string& value) {
  if (sets(dsn, key)) return dsn;
  const std::string setting = std::string(key) + "=" + value;
  if (is_uri(dsn)) return dsn + (dsn.find('?') == std::string::npos ? "?" : "&") + setting;
  return dsn.empty() ? setting : dsn + " " + setting;
}

}  // namespace

std::string with_connect_timeout(std::string dsn, std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero() || std::getenv("PGCONNECT_TIMEOUT") != nullptr) return dsn;
  // libpq counts whole seconds and treats anything below 2 as 2.
  const auto seconds = std::max<long long>(2, std::chrono::ceil<std::chrono::seconds>(timeout).count());
  return with_setting(std::move(dsn), "connect_timeout", std::to_string(seconds));
}

std::string with_network_timeout(std::string dsn, std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return dsn;
  using std::chrono::ceil;
  const auto ms = std::max<long long>(1000, ceil<std::chrono::milliseconds>(timeout).count());
  // Unacknowledged data (a partition while a statement is sent) fails after
  // the timeout; an idle peer that vanished is found by keepalives about as fast.
  const long long idle_s = std::max<long long>(1, ms / 2000);
  const long long interval_s = std::max<long long>(1, ms / 5000);
  dsn = with_setting(std::move(dsn), "tcp_user_timeout", std::to_string(ms));
  dsn = with_setting(std::move(dsn), "keepalives_idle", std::to_string(idle_s));
  dsn = with_setting(std::move(dsn), "keepalives_interval", std::to_string(interval_s));
  return with_setting(std::move(dsn), "keepalives_count", "3");
}

}  // namespace pgmutex::postgres_detail
