// PrometheusMetrics::render() (pgmutex/metrics/prometheus.hpp): each lock's
// counters and histograms in the Prometheus text exposition format, their
// families taken from the one description of LockMetrics.
#include <type_traits>

#include "pgmutex/describe/lock_metrics.hpp"
#include "pgmutex/describe/record.hpp"
#include "pgmutex/metrics/exposition.hpp"
#include "pgmutex/metrics/prometheus.hpp"

namespace pgmutex {

std::string PrometheusMetrics::render() const {
  const auto locks = snapshot();  // formatted outside the lock: hooks never wait for render()
  std::string out;
  for (const describe::Field& field : describe::Description<LockMetrics>::fields) {
    exposition::family(out, field.metric, field.metric_type, field.doc);
    // Not a structured binding: clang 15 (the fuzz build) cannot capture one in a lambda.
    for (const auto& entry : locks) {
      const auto& lock = entry.first;
      const auto& numbers = entry.second;
      const std::string labels = exposition::labels({{"lock", lock}});
      describe::for_each_field(numbers, [&](const describe::Field& member, const auto& value) {
        if (&member != &field) return;
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(value)>, LatencyHistogram>) {
          const std::string bucket = std::string(field.metric) + "_bucket";
          for (std::size_t i = 0; i < value.bounds.size(); ++i)
            exposition::sample(out, bucket,
                               exposition::labels({{"lock", lock}, {"le", exposition::number(value.bounds[i])}}),
                               static_cast<double>(value.buckets[i]));
          exposition::sample(out, bucket, exposition::labels({{"lock", lock}, {"le", "+Inf"}}),
                             static_cast<double>(value.count));
          exposition::sample(out, std::string(field.metric) + "_sum", labels, value.sum);
          exposition::sample(out, std::string(field.metric) + "_count", labels, static_cast<double>(value.count));
        } else {
          exposition::sample(out, field.metric, labels, static_cast<double>(value));
        }
      });
    }
  }
  return out;
}

}  // namespace pgmutex
