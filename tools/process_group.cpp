// The command's processes as the kernel groups them: who is left in a group, and
// reaping (process_group.hpp).
#include "process_group.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

namespace pgmutex::cli {
namespace {

struct ProcessStat {
  char state = '?';
  pid_t ppid = 0;
  pid_t pgid = 0;
};

// /proc/PID/stat: "pid (comm) state ppid pgrp ...". The command name may hold
// spaces and parentheses, so fields are counted from the last ')'.
std::optional<ProcessStat> read_stat(const char* pid) {
  std::ifstream file(std::string("/proc/") + pid + "/stat");
  std::string text;
  if (!std::getline(file, text)) return std::nullopt;
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  ProcessStat stat;
  long ppid = 0;
  long pgid = 0;
  if (!(fields >> stat.state >> ppid >> pgid)) return std::nullopt;
  stat.ppid = static_cast<pid_t>(ppid);
  stat.pgid = static_cast<pid_t>(pgid);
  return stat;
}

bool alive(const ProcessStat& stat) { return stat.state != 'Z' && stat.state != 'X'; }

// The live processes in /proc for which `wanted` holds.
std::optional<std::vector<pid_t>> live_processes(bool (*wanted)(const ProcessStat&, pid_t), pid_t key) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return std::nullopt;
  std::vector<pid_t> found;
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    const auto stat = read_stat(entry->d_name);  // gone meanwhile: not found
    if (stat && alive(*stat) && wanted(*stat, key)) found.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return found;
}

}  // namespace

void become_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    throw std::system_error(errno, std::generic_category(), "prctl(PR_SET_CHILD_SUBREAPER)");
}

void reap_children(const std::function<void(pid_t pid, int status)>& on_reaped) {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      on_reaped(pid, status);
      continue;
    }
    if (pid < 0 && errno == EINTR) continue;
    return;  // 0: children run on; ECHILD: none left
  }
}

std::optional<std::vector<pid_t>> live_members(pid_t pgid) {
  return live_processes([](const ProcessStat& stat, pid_t key) { return stat.pgid == key; }, pgid);
}

std::optional<std::vector<pid_t>> live_children(pid_t parent) {
  return live_processes([](const ProcessStat& stat, pid_t key) { return stat.ppid == key; }, parent);
}

bool group_is_empty(pid_t pgid) {
  if (::kill(-pgid, 0) != 0 && errno == ESRCH) return true;
  // kill() counts zombies too, and one whose parent is not ours may linger.
  const auto members = live_members(pgid);
  return members && members->empty();
}

std::string pid_list(const std::vector<pid_t>& pids) {
  constexpr std::size_t shown = 8;
  std::string text = pids.size() == 1 ? "pid " : "pids ";
  for (std::size_t i = 0; i < pids.size() && i < shown; ++i) text += (i > 0 ? ", " : "") + std::to_string(pids[i]);
  if (pids.size() > shown) text += ", ...";
  return text;
}

}  // namespace pgmutex::cli
