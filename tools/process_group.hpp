// The command's processes as the kernel groups them: who is still in a
// process group, and reaping whatever ends up as our child.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pgmutex::cli {

// Makes orphaned descendants our children instead of init's
// (PR_SET_CHILD_SUBREAPER): a background process the command leaves behind
// is then ours to reap, so its zombie never keeps its group alive.
void become_subreaper();

// Reaps every child that has ended (never blocks), reporting each pid with
// its wait status.
void reap_children(const std::function<void(pid_t pid, int status)>& on_reaped);

// The live (not zombie) members of process group `pgid`, from /proc;
// nullopt if /proc cannot be read.
[[nodiscard]] std::optional<std::vector<pid_t>> live_members(pid_t pgid);

// The live (not zombie) children of `parent`, from /proc; nullopt if /proc
// cannot be read.
[[nodiscard]] std::optional<std::vector<pid_t>> live_children(pid_t parent);

// True once no process of group `pgid` runs. A zombie that its parent has not
// reaped yet runs no code: it does not count.
[[nodiscard]] bool group_is_empty(pid_t pgid);

// "pid 12" or "pids 12, 13, 14" (the first few, then "..."): for one line on stderr.
[[nodiscard]] std::string pid_list(const std::vector<pid_t>& pids);

}  // namespace pgmutex::cli
