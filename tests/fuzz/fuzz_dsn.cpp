// Fuzz target: DSN redaction. The input picks a password and the shape of a
// connection string around it: keyword form (bare, quoted with escapes,
// repeated keys, odd spacing) or URI form (user info, percent-encoded,
// ?password=, repeated parameters). redact_dsn() must never show the password,
// in any of those forms; scrub() with secrets_of() must hide it from any
// message that quotes the DSN; and arbitrary bytes must never crash either.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "dsn.hpp"

using namespace pgmutex::postgres_detail;

namespace {

// Reads the input as a stream of choices and strings.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::string text(std::size_t most) {
    std::size_t n = byte() % (most + 1);
    std::string out;
    while (n-- > 0 && at_ < size_) out.push_back(static_cast<char>(data_[at_++]));
    return out;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

std::string percent_encode_all(std::string_view s) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    out.push_back('%');
    out.push_back(hex[c >> 4]);
    out.push_back(hex[c & 15]);
  }
  return out;
}

// Percent-encodes what a URI's user info or query cannot hold raw.
std::string percent_encode_needed(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || c == '-' || c == '.' || c == '_' || c == '~')
      out.push_back(c);
    else
      out += percent_encode_all(std::string_view(&c, 1));
  }
  return out;
}

// 'value' with ' and \ escaped, as libpq reads a quoted keyword value.
std::string quote_keyword_value(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "'";
}

// Bare keyword value: escapes blanks, quotes and backslashes.
std::string bare_keyword_value(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '\\' || c == '\'')
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// A filler value that cannot contain the password by accident.
std::string filler(Input& in) {
  static constexpr const char* words[] = {"db", "localhost", "5432", "app", "require", "10", "u"};
  return words[in.byte() % 7];
}

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

[[noreturn]] void leak(const std::string& dsn, const std::string& shown, const std::string& password) {
  std::fprintf(stderr, "password leaked\n  dsn:      [%s]\n  shown:    [%s]\n  password: [%s]\n", printable(dsn).c_str(),
               printable(shown).c_str(), printable(password).c_str());
  std::abort();
}

// A password worth checking: long enough that finding it by chance in the
// rest of the string is impossible (the fillers hold no '#'), and no NUL.
std::string make_password(Input& in) {
  std::string p = in.text(24);
  for (char& c : p)
    if (c == '\0') c = '0';
  return "#" + p + "#";
}

// Every spelling of the password written into the DSN (quoted, escaped, percent-encoded).
std::vector<std::string> written;

std::string spelled(std::string form) {
  written.push_back(form);
  return form;
}

std::string keyword_dsn(Input& in, const std::string& password) {
  std::string dsn;
  const int pairs = 1 + in.byte() % 4;
  const int password_at = in.byte() % pairs;
  for (int i = 0; i < pairs; ++i) {
    const std::string space = std::string(in.byte() % 3, ' ');
    if (!dsn.empty() || in.byte() % 2) dsn += " " + space;
    if (i == password_at || in.byte() % 8 == 0) {  // repeated keys: every password= counts
      dsn += "password" + std::string(in.byte() % 2, ' ') + "=" + std::string(in.byte() % 2, ' ');
      dsn += spelled(in.byte() % 2 ? quote_keyword_value(password) : bare_keyword_value(password));
    } else {
      static constexpr const char* keys[] = {"host", "port", "user", "dbname", "sslmode", "connect_timeout"};
      dsn += std::string(keys[in.byte() % 6]) + "=" + filler(in);
    }
  }
  return dsn;
}

std::string uri_dsn(Input& in, const std::string& password) {
  std::string dsn = in.byte() % 2 ? "postgresql://" : "postgres://";
  const int where = in.byte() % 3;  // 0: user info, 1: query, 2: both
  if (where != 1)
    dsn += "u:" + spelled(in.byte() % 2 ? percent_encode_all(password) : percent_encode_needed(password)) + "@";
  dsn += filler(in);
  if (in.byte() % 2) dsn += ":5432";
  dsn += "/" + filler(in);
  if (where != 0 || in.byte() % 2) {
    dsn += "?";
    const int params = 1 + in.byte() % 3;
    for (int i = 0; i < params; ++i) {
      if (i > 0) dsn += "&";
      if (where != 0 && (i == 0 || in.byte() % 4 == 0))
        dsn += "password=" + spelled(in.byte() % 2 ? percent_encode_all(password) : percent_encode_needed(password));
      else
        dsn += "sslmode=" + filler(in);
    }
  }
  return dsn;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Arbitrary bytes: never a crash, and scrubbing its secrets from it never leaves one.
  const std::string raw(reinterpret_cast<const char*>(data), size);
  const std::string redacted = redact_dsn(raw);
  const auto raw_secrets = secrets_of(raw);
  const std::string scrubbed = scrub(raw, raw_secrets);
  // (A secret with a '*' may match the mask itself: those are checked by the built DSNs below.)
  for (const std::string& secret : raw_secrets)
    if (secret.size() > 8 && secret.find('*') == std::string::npos && scrubbed.find(secret) != std::string::npos)
      leak(raw, scrubbed, secret);
  (void)is_uri(raw);

  // A DSN built around a password, in one of the forms libpq reads.
  Input in(data, size);
  written.clear();
  const std::string password = make_password(in);
  const std::string dsn = in.byte() % 2 ? keyword_dsn(in, password) : uri_dsn(in, password);
  const std::string shown = redact_dsn(dsn);
  if (shown.find(password) != std::string::npos) leak(dsn, shown, password);
  for (const std::string& form : written)
    if (shown.find(form) != std::string::npos) leak(dsn, shown, form);
  const std::string message = "could not connect with \"" + dsn + "\": password " + password + " rejected";
  const std::string clean = scrub(message, secrets_of(dsn));
  if (clean.find(password) != std::string::npos) leak(dsn, clean, password);
  return 0;
}
