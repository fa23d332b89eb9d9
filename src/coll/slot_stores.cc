#include "coll/slot_stores.h"

#include <bit>

#include "base/error.h"

namespace braid {
namespace {

// Weight of the newest measurement: the placement switches abruptly, so the estimate should too.
constexpr double kNewWeight = 0.5;

SlotStoreChooser::Policy parsePolicy(const std::string& text) {
  if (text == "auto" || text.empty()) return SlotStoreChooser::Policy::kAuto;
  if (text == "cached") return SlotStoreChooser::Policy::kCached;
  if (text == "streaming") return SlotStoreChooser::Policy::kStreaming;
  fail(braidInvalidArgument, "BRAID_SLOT_STORES='{}' is not one of auto, cached, streaming", text);
}

}  // namespace

SlotStoreChooser::SlotStoreChooser(const std::string& policy) : policy_(parsePolicy(policy)) {}

int SlotStoreChooser::classOf(size_t bytes) {
  return std::bit_width(bytes) - 1 - std::countr_zero(kMinAdaptiveBytes);
}

SlotStores SlotStoreChooser::choose(size_t bytes) {
  if (policy_ == Policy::kCached) return SlotStores::kCached;
  if (policy_ == Policy::kStreaming) return SlotStores::kStreaming;
  if (bytes < kMinAdaptiveBytes) return SlotStores::kCached;
  SizeClass& c = classes_[classOf(bytes)];
  const unsigned call = c.calls++;
  const double cached = c.secondsPerByte[static_cast<int>(SlotStores::kCached)];
  const double streaming = c.secondsPerByte[static_cast<int>(SlotStores::kStreaming)];
  // The first call warms up (page faults, cold caches) and is not measured; then each way once.
  if (call == 0 || cached == 0) return SlotStores::kCached;
  if (streaming == 0) return SlotStores::kStreaming;
  const SlotStores faster = cached <= streaming ? SlotStores::kCached : SlotStores::kStreaming;
  const SlotStores other =
      faster == SlotStores::kCached ? SlotStores::kStreaming : SlotStores::kCached;
  return call % kRetryPeriod == kRetryPeriod - 1 ? other : faster;
}

void SlotStoreChooser::record(size_t bytes, SlotStores stores, double seconds) {
  if (policy_ != Policy::kAuto || bytes < kMinAdaptiveBytes || seconds <= 0) return;
  SizeClass& c = classes_[classOf(bytes)];
  if (c.calls <= 1) return;  // the warm-up call
  double& estimate = c.secondsPerByte[static_cast<int>(stores)];
  const double measured = seconds / static_cast<double>(bytes);
  estimate = estimate == 0 ? measured : (1 - kNewWeight) * estimate + kNewWeight * measured;
}

}  // namespace braid
