// The links session_bench (a) measures over: the unix socket, TCP to
// 127.0.0.1, and tests/tools/fault_proxy.py in between (pass, or delay MS
// per chunk each way: a realistic round trip); and the server's own counters.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <pqxx/pqxx>

namespace bench {

inline std::string env_or(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// fault_proxy.py, started in front of PGMUTEX_TEST_TCP_HOST:PGPORT; killed on destruction.
class Proxy {
 public:
  Proxy() {
    const std::string script = env_or("PGMUTEX_FAULT_PROXY", "tests/tools/fault_proxy.py");
    const std::string upstream = env_or("PGMUTEX_TEST_TCP_HOST", "127.0.0.1") + ":" + env_or("PGPORT", "5432");
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execlp("python3", "python3", script.c_str(), "--upstream", upstream.c_str(), "--max-lifetime", "900",
               static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    // "listening 127.0.0.1:P control 127.0.0.1:C"
    std::string line;
    char c;
    while (::read(fds[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    ::close(fds[0]);
    const auto colon = [&](std::size_t from) { return line.find(':', from) + 1; };
    const auto first = colon(0);
    port_ = line.substr(first, line.find(' ', first) - first);
    control_port_ = std::stoi(line.substr(colon(line.find("control"))));
    if (port_.empty() || control_port_ == 0) throw std::runtime_error("fault_proxy said: " + line);
  }
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;
  ~Proxy() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  [[nodiscard]] std::string dsn() const { return "host=127.0.0.1 port=" + port_; }

  // pass | delay MS; returns once the proxy applies it.
  void set(const std::string& mode) const {
    const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(control_port_));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      throw std::runtime_error("fault_proxy control");
    const std::string out = mode + "\n";
    if (::write(sock, out.data(), out.size()) != static_cast<ssize_t>(out.size())) throw std::runtime_error("write");
    char reply[64] = {};
    const auto got = ::read(sock, reply, sizeof reply - 1);
    ::close(sock);
    if (got < 2 || std::string(reply).rfind("ok", 0) != 0) throw std::runtime_error("fault_proxy: " + mode);
  }

 private:
  pid_t pid_ = -1;
  std::string port_;
  int control_port_ = 0;
};

// Median round trip of `SELECT 1` over `dsn`, in ms.
inline double round_trip_ms(const std::string& dsn) {
  pqxx::connection c(dsn);
  pqxx::nontransaction tx(c);
  std::vector<double> v;
  for (int i = 0; i < 101; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    tx.exec("SELECT 1");
    v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The server's counters a heartbeat moves: WAL position (bytes) and the next
// transaction id (each writing transaction takes one; reading them takes none).
struct ServerMark {
  long long wal = 0;
  long long xid = 0;
};
inline ServerMark server_mark(pqxx::connection& admin) {
  pqxx::nontransaction tx(admin);
  const auto r = tx.exec("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, "
                         "txid_snapshot_xmax(txid_current_snapshot())")[0];
  return {r[0].as<long long>(), r[1].as<long long>()};
}

}  // namespace bench
