// How a rank writes the FIFO slots of a large ring collective: with ordinary (cached) stores, so
// the next rank reads the data from this core's cache, or with streaming (non-temporal) stores,
// so it reads them from memory. Which is faster depends on where the two cores sit: sharing a
// last-level cache, cached handoffs win (7.5-10.8 vs 4.5-5.8 GB/s for a 2-rank 64 MiB all-reduce
// here); without one (a VM whose vCPUs the hypervisor moves apart), cached handoffs fall to
// 1.5 GB/s while streaming ones keep 6.6-8.8. The placement can change while a job runs, so in
// auto mode each rank measures both and uses the faster, per size class, re-trying the other
// now and then. The choice is local to the sender: a receiver reads a slot the same either way.
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace braid {

enum class SlotStores { kCached = 0, kStreaming = 1 };  // also indexes SizeClass::secondsPerByte

class SlotStoreChooser {
 public:
  enum class Policy { kAuto, kCached, kStreaming };

  // policy: BRAID_SLOT_STORES's text (auto, cached or streaming); fails naming it otherwise.
  explicit SlotStoreChooser(const std::string& policy);

  // The stores for a ring collective of `bytes` (its user-visible size).
  SlotStores choose(size_t bytes);
  // What a call chosen as above took; auto mode learns from it.
  void record(size_t bytes, SlotStores stores, double seconds);

  // Collectives below this size keep cached stores: their data fits in caches either way.
  static constexpr size_t kMinAdaptiveBytes = size_t{1} << 20;
  // In auto mode, one call in this many per size class tries the slower-looking stores.
  static constexpr int kRetryPeriod = 16;

 private:
  struct SizeClass {
    std::array<double, 2> secondsPerByte{0, 0};  // smoothed, per SlotStores; 0: not measured
    unsigned calls = 0;
  };
  static constexpr int kClasses = 44;  // 2^20 .. 2^63 bytes
  static int classOf(size_t bytes);

  Policy policy_;
  std::array<SizeClass, kClasses> classes_{};
};

}  // namespace braid
