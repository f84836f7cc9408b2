// heartbeat_many: many grants' heartbeats in one statement per lock table,
// each distinct key sent once, each caller's key answered by its position.
#include <algorithm>
#include <set>
#include <unordered_map>

#include "backend_impl.hpp"
#include "statement_values.hpp"

namespace pgmutex {

using namespace postgres_detail;

namespace {

// A heartbeat key by view, to fold a batch's repeated keys.
struct KeyView {
  std::string_view name, instance;
  Fence fence;
  GrantToken token;
  bool operator==(const KeyView&) const = default;
};
struct KeyViewHash {
  std::size_t operator()(const KeyView& k) const noexcept {
    std::size_t h = std::hash<std::string_view>{}(k.name);
    for (std::size_t part : {std::hash<std::string_view>{}(k.instance), std::hash<Fence>{}(k.fence),
                             std::hash<GrantToken>{}(k.token)})
      h = h * 1099511628211ULL ^ part;
    return h;
  }
};

}  // namespace

Result<std::vector<bool>> PostgresBackend::heartbeat_many(std::span<const HolderKey> keys) noexcept {
  return heartbeat_many_of(impl_.get(), keys, false, false);
}

// `durable`: commit synchronously whatever the options say (a session's batch
// that carries a heartbeat due to be durable). `skip_locked`: a row another
// transaction locked is reported false instead of waited for.
Result<std::vector<bool>> PostgresBackend::heartbeat_many_of(Impl* impl, std::span<const HolderKey> keys,
                                                            bool durable, bool skip_locked) noexcept {
  if (impl == nullptr) return moved_from();
  const auto& impl_ = impl;
  std::vector<bool> held(keys.size(), false);
  if (keys.empty()) return held;
  try {
    std::lock_guard lock(impl_->mutex);
    // One statement per table (usually exactly one), bounded by the longest timeout asked for.
    std::set<std::string_view> tables;
    std::chrono::nanoseconds timeout{0};
    for (const HolderKey& key : keys) {
      tables.insert(key.lock.table);
      timeout = std::max(timeout, key.timeout);
      durable = durable || key.durable;  // one asks: the statement commits synchronously for all
    }
    for (std::string_view table : tables) {
      if (auto valid = validate_table_name(table); !valid) return tl::unexpected(std::move(valid.error()));
      // Each distinct key is sent once (the statement answers a key by its
      // position, and a row joined to two equal keys is returned once); a
      // repeated key gets its first copy's answer.
      std::vector<std::string_view> names, instances;
      std::vector<std::pair<std::size_t, std::size_t>> sent_as;  // (index in keys, position in the arrays)
      std::unordered_map<KeyView, std::size_t, KeyViewHash> position;
      std::string fences = "{", tokens = "{";
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (keys[i].lock.table != table) continue;
        const auto [at, fresh] = position.try_emplace(
            KeyView{keys[i].lock.lock_name, keys[i].instance_id, keys[i].fence, keys[i].token}, names.size());
        sent_as.emplace_back(i, at->second);
        if (!fresh) continue;
        names.push_back(keys[i].lock.lock_name);
        instances.push_back(keys[i].instance_id);
        if (fences.size() > 1) {
          fences.push_back(',');
          tokens.push_back(',');
        }
        fences += std::to_string(keys[i].fence);
        tokens += token_param(keys[i].token);
      }
      fences.push_back('}');
      tokens.push_back('}');
      auto beaten = impl_->run<std::vector<bool>>(
          "heartbeat " + std::to_string(sent_as.size()) + " locks in '" + std::string(table) + "'",
          Effect::idempotent_write, Bound::from(impl_->bound_of(timeout)),
          [&](Session& session, const Bound& bound) -> Outcome<std::vector<bool>> {
            const bool sync = durable || (impl_->mark && impl_->durable_due(session));
            const TableStatements& st = impl_->statements(table, session.unnamed() || sync);
            auto rows = session.run(skip_locked ? st.heartbeat_many_skip_locked : st.heartbeat_many,
                                    {text_array(names), text_array(instances), fences, tokens, bound.lock_timeout_param()},
                                    bound);
            if (!rows) return tl::unexpected(std::move(rows.error()));
            if (sync && impl_->mark) impl_->durable_done(session);
            impl_->last_durability = durability_of(*rows, !st.asynchronous, 1);
            return keys_beaten(*rows, names.size());
          },
          table);
      if (!beaten) return tl::unexpected(std::move(beaten.error()));
      for (const auto& [i, at] : sent_as) held[i] = (*beaten)[at];
    }
    return held;
  } catch (...) {
    return tl::unexpected(
        to_error(failure_from_current_exception(), "heartbeat_many", Effect::idempotent_write, impl_->secrets));
  }
}

namespace postgres_detail {

Result<std::vector<bool>> SharedAccess::heartbeat_many(PostgresBackend& backend, std::span<const HolderKey> keys,
                                                       bool durable, bool skip_locked) noexcept {
  return PostgresBackend::heartbeat_many_of(backend.impl_.get(), keys, durable, skip_locked);
}

}  // namespace postgres_detail
}  // namespace pgmutex
