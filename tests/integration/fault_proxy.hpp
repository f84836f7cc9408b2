// tests/tools/fault_proxy.py from a test: started between the backend and the
// server, switched between pass, delay, reset, freeze and drop-after-listen,
// stopped at the end; it counts the connections it accepted.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <sstream>
#include <string>

#include "support.hpp"

namespace itest {

class FaultProxy {
 public:
  explicit FaultProxy(int max_lifetime_s = 120) {
    const Server s = server();
    const std::string script = need_env("PGMUTEX_TEST_FAULT_PROXY");
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      const std::string upstream = s.tcp_host + ":" + s.port;
      const std::string lifetime = std::to_string(max_lifetime_s);
      ::execlp("python3", "python3", script.c_str(), "--upstream", upstream.c_str(), "--max-lifetime",
               lifetime.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    child_ = Child{pid_, fds[0]};
    const std::string line = read_line(child_, std::chrono::milliseconds(10000));
    INFO("fault_proxy said: " << line);
    std::istringstream words(line);
    std::string listening, address, control, control_address;
    words >> listening >> address >> control >> control_address;
    REQUIRE(listening == "listening");
    port_ = address.substr(address.rfind(':') + 1);
    control_port_ = std::stoi(control_address.substr(control_address.rfind(':') + 1));
  }
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;
  ~FaultProxy() {
    ::kill(pid_, SIGKILL);
    wait_child(child_);
  }

  // A keyword DSN that reaches the server through the proxy.
  [[nodiscard]] std::string dsn() const {
    const Server s = server();
    return "host=127.0.0.1 port=" + port_ + " dbname=" + s.database + " user=" + s.user;
  }

  // The port it listens on (127.0.0.1), for a DSN of one's own (a multi-host one).
  [[nodiscard]] const std::string& port() const noexcept { return port_; }

  // pass | delay MS | delay-sync MS | reset | freeze | drop-after-listen; returns once the proxy applies it.
  void set(const std::string& mode) { (void)ask(mode); }

  // The mode in force: "pass" once a drop-after-listen has fired.
  [[nodiscard]] std::string mode() { return ask("mode").substr(3); }

  // How many client connections it has accepted: a connect attempt each.
  [[nodiscard]] int accepted() { return std::stoi(ask("accepted").substr(3)); }

 private:
  // Sends one control line; returns the reply ("ok ...").
  std::string ask(const std::string& mode) {
    const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(sock >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(control_port_));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    const std::string line = mode + "\n";
    REQUIRE(::write(sock, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
    Child reply{-1, sock};
    const std::string answer = read_line(reply, std::chrono::milliseconds(5000));
    ::close(sock);
    REQUIRE(answer.starts_with("ok "));
    return answer;
  }

  pid_t pid_ = -1;
  Child child_;
  std::string port_;
  int control_port_ = 0;
};

}  // namespace itest
