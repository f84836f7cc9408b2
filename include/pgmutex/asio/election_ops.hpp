// The async forms of BasicElection, BasicLeadership and BasicObserver, for
// AsioExecutor (issue 18). Each takes an Asio completion token and
// completes with boost::system::error_code first:
//
//   election.async_campaign(value, timeout, token)  void(error_code, Leadership)
//   election.async_leader(token)                    void(error_code, std::optional<Leader>)
//   leadership.async_proclaim(value, token)         void(error_code)
//   leadership.async_resign(token)                  void(error_code)
//   observer.async_next(timeout, token)             void(error_code, std::optional<LeaderChange>)
//   observer.async_observe(token)                   void(error_code, LeaderChange)
//
// A campaign is the mutex's async_acquire (its queue, its timeout, its
// cancellation: a cancelled campaign leaves no row and no place behind),
// whose tries carry the value: the statement that grants announces, as the
// blocking campaign's; an empty leadership (the timeout passed) is an
// answer, as the blocking campaign's. An observer's wait
// holds a thread of the I/O pool while it waits (it is the blocking next(),
// stopped by the cancellation slot); a change it has taken is never
// dropped by a cancellation that comes with it: the handler gets the change.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/error.hpp>

#include "pgmutex/asio/async_ops.hpp"
#include "pgmutex/asio/completion.hpp"
#include "pgmutex/asio/error.hpp"
#include "pgmutex/asio/statements.hpp"
#include "pgmutex/election.hpp"

namespace pgmutex::asio_detail {

using Elections = detail::ElectionAccess;

// An async campaign's value and the announcement its tries carry (a view of
// the value: the two live together).
struct Campaign {
  explicit Campaign(std::string v) : value(std::move(v)) { announcement.value = value; }
  Campaign(const Campaign&) = delete;
  Campaign& operator=(const Campaign&) = delete;
  std::string value;
  GrantAnnouncement announcement;
};

template <class Election, class Token>
auto async_campaign(Election& election, std::string value, std::optional<std::chrono::nanoseconds> timeout,
                    Token&& token) {
  using Mutex = typename Election::mutex_type;
  using Guard = typename Mutex::guard_type;
  using Leadership = typename Election::leadership_type;
  return boost::asio::async_initiate<Token, void(boost::system::error_code, Leadership)>(
      [](auto handler, Mutex shared, std::string value, std::optional<std::chrono::nanoseconds> limit) {
        using Handler = decltype(handler);
        const auto loop = loop_of(*Access::state_of(shared));
        if (auto valid = validate_election_value(shared.lock_name(), value); !valid) {
          Completion<Handler>(std::move(handler), loop).complete(to_error_code(valid.error()), Leadership());
          return;
        }
        // The handler's cancellation slot goes to the acquire: a campaign
        // can be cancelled while it waits, not during its announce (one
        // statement, which cannot be interrupted).
        auto slot = boost::asio::get_associated_cancellation_slot(handler);
        auto done = std::make_shared<Completion<Handler>>(std::move(handler), loop);
        // Every try carries the value (the acquire's op keeps `campaign`
        // alive through `elect`): the statement that grants announces.
        auto campaign = std::make_shared<Campaign>(std::move(value));
        GrantAnnouncement* announce = &campaign->announcement;
        auto elect = [done, campaign](boost::system::error_code ec, Guard guard) mutable {
          auto* state = Access::guard_state(guard);
          if (ec || state == nullptr) return done->complete(ec, Elections::not_elected<Leadership>(std::move(guard)));
          // Announced with its grant: no statement left, the handler at once.
          // Else the announce, where the operation's statements run.
          const auto finish = [done, campaign](Guard g) {
            auto took = Elections::take_office<Leadership>(std::move(g), std::move(campaign->value),
                                                           campaign->announcement.announced);
            if (took) done->complete(boost::system::error_code(), std::move(*took));
            else done->complete(to_error_code(took.error()), Leadership());
          };
          if (campaign->announcement.announced) return finish(std::move(guard));
          run_statements_of(state, [finish, guard = std::move(guard)]() mutable { finish(std::move(guard)); });
        };
        async_acquire(shared, limit, boost::asio::bind_cancellation_slot(slot, std::move(elect)), announce);
      },
      token, Access::share(Elections::mutex_of(election)), std::move(value), timeout);
}

// One statement, which cannot be interrupted: no cancellation slot.
template <class Election, class Token>
auto async_leader(Election& election, Token&& token) {
  using Mutex = typename Election::mutex_type;
  return boost::asio::async_initiate<Token, void(boost::system::error_code, std::optional<Leader>)>(
      [](auto handler, Mutex shared) {
        auto* state = Access::state_of(shared);
        Completion<decltype(handler)> done(std::move(handler), loop_of(*state));
        run_statements_of(state, [done = std::move(done), shared = std::move(shared)]() mutable {
          auto who = detail::read_leader(*Access::state_of(shared));
          { Mutex gone = std::move(shared); }  // our share goes before the handler may run (see AcquireOp::finish)
          if (who) done.complete(boost::system::error_code(), std::move(*who));
          else done.complete(to_error_code(who.error()), std::optional<Leader>());
        });
      },
      token, Access::share(Elections::mutex_of(election)));
}

// The new value is written to the leadership's value on the handler's
// executor, just before the handler runs.
template <class Leadership, class Token>
auto async_proclaim(Leadership& leadership, std::string value, Token&& token) {
  using State = std::remove_pointer_t<decltype(Access::guard_state(leadership.guard()))>;
  const auto loop = loop_of_guard(leadership.guard());
  return boost::asio::async_initiate<Token, DoneSignature>(
      [](auto handler, Share<State> state, std::uint64_t generation, std::shared_ptr<std::string> slot,
         std::string value, boost::asio::any_io_executor on) {
        Completion<decltype(handler)> done(std::move(handler), on);
        if (state.get() == nullptr || !slot)
          return done.complete(to_error_code(Error(Errc::lock_not_held, "leadership holds no term")));
        if (auto valid = validate_election_value(state.get()->options.lock_name, value); !valid)
          return done.complete(to_error_code(valid.error()));
        auto* s = state.get();
        run_statements_of(s, [done = std::move(done), state = std::move(state), generation, slot = std::move(slot),
                              value = std::move(value)]() mutable {
          auto announced = detail::announce_grant(*state.get(), generation, value);
          { Share<State> gone = std::move(state); }  // before the handler may run (see AcquireOp::finish)
          if (!announced) return done.complete(to_error_code(announced.error()));
          done.complete_after([slot = std::move(slot), value = std::move(value)]() mutable { *slot = std::move(value); },
                              boost::system::error_code());
        });
      },
      token, Share<State>(Access::guard_state(leadership.guard())), Access::generation(leadership.guard()),
      Elections::value_slot(leadership), std::move(value), loop);
}

// The term leaves the user's leadership now (moved into the operation), as
// resign() takes it at once. A lost lease completes with success (as
// async_release); an empty leadership with lock_not_held.
template <class Leadership, class Token>
auto async_resign(Leadership&& leadership, Token&& token) {
  const auto loop = loop_of_guard(leadership.guard());
  return boost::asio::async_initiate<Token, DoneSignature>(
      [](auto handler, Leadership owned, boost::asio::any_io_executor on) {
        Completion<decltype(handler)> done(std::move(handler), on);
        auto* state = Access::guard_state(owned.guard());
        run_statements_of(state, [done = std::move(done), owned = std::move(owned)]() mutable {
          const bool held_a_term = owned.guard().owns_lock();
          auto resigned = owned.resign(nothrow);
          if (!resigned && held_a_term && resigned.error() == Errc::lock_not_held) resigned = {};
          done.complete(error_of(resigned));
        });
      },
      token, std::move(leadership), loop);
}

// An observer's wait, on the I/O pool (it blocks until a change, the
// timeout, or the cancellation slot's stop). `wait(observer, stop)` is
// next() or next_waiting_out(); nullopt with the stop requested is
// operation_aborted, without it the timeout.
template <class Change, class Observer, class Wait, class Token>
auto async_observer_wait(Observer& observer, Wait wait, Token&& token) {
  const auto loop = loop_of(*Elections::observer_state(observer));
  return boost::asio::async_initiate<Token, void(boost::system::error_code, Change)>(
      [](auto handler, Observer* watched, Wait wait, boost::asio::any_io_executor on) {
        auto stop = std::make_shared<std::stop_source>();
        Completion<decltype(handler)> done(std::move(handler), on);
        if (auto slot = done.cancellation_slot(); slot.is_connected())
          slot.assign([stop](boost::asio::cancellation_type type) {
            if (type != boost::asio::cancellation_type::none) stop->request_stop();
          });
        run_off_loop([done = std::move(done), watched, wait = std::move(wait), stop]() mutable {
          Result<std::optional<LeaderChange>> got = wait(*watched, stop->get_token());
          if (!got) return done.complete(to_error_code(got.error()), Change());
          if (*got) return done.complete(boost::system::error_code(), Change(std::move(**got)));
          if (stop->stop_requested())
            return done.complete(boost::system::error_code(boost::asio::error::operation_aborted), Change());
          done.complete(boost::system::error_code(), Change());  // the timeout passed (async_next only)
        });
      },
      token, &observer, std::move(wait), loop);
}

template <class Observer, class Token>
auto async_next(Observer& observer, std::optional<std::chrono::nanoseconds> timeout, Token&& token) {
  return async_observer_wait<std::optional<LeaderChange>>(
      observer,
      [timeout](Observer& o, std::stop_token stop) { return o.next(nothrow, timeout, std::move(stop)); },
      std::forward<Token>(token));
}

template <class Observer, class Token>
auto async_observe(Observer& observer, Token&& token) {
  return async_observer_wait<LeaderChange>(
      observer, [](Observer& o, const std::stop_token& stop) { return Elections::next_waiting_out(o, stop); },
      std::forward<Token>(token));
}

}  // namespace pgmutex::asio_detail
