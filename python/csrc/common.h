// What every part of the braid backend shares: torch's element types as braid's, a braid call's
// result as a Python exception with braid's sentence, and tensors as a braid call reads them.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "braid/braid.h"

namespace braid_torch {

// braid's datatype of torch's element type, if braid has one.
inline std::optional<braidDataType_t> braidTypeOf(c10::ScalarType type) {
  switch (type) {
    case at::kFloat: return braidFloat32;
    case at::kDouble: return braidFloat64;
    case at::kHalf: return braidFloat16;
    case at::kBFloat16: return braidBfloat16;
    case at::kChar: return braidInt8;
    case at::kByte:
    case at::kBool: return braidUint8;
    case at::kInt: return braidInt32;
    case at::kLong: return braidInt64;
    case at::kFloat8_e4m3fn: return braidFloat8e4m3;
    case at::kFloat8_e5m2: return braidFloat8e5m2;
    default: return std::nullopt;
  }
}

inline std::optional<braidDataType_t> braidTypeOf(const at::Tensor& t) {
  return braidTypeOf(t.scalar_type());
}

inline braidDataType_t braidType(const at::Tensor& t) {
  if (const std::optional<braidDataType_t> type = braidTypeOf(t)) return *type;
  throw std::invalid_argument("braid backend: tensors of type " +
                              std::string(c10::toString(t.scalar_type())) +
                              " are not supported (expected a float, integer or bool type)");
}

// Raises `message` as the backend's failures are raised: a DistBackendError (a RuntimeError), as
// torch's own backends fail. Without the C++ backtrace C10_THROW_ERROR puts in what(): Python
// showed it after point-to-point failures, as torch shows none after its own backends'.
[[noreturn]] inline void failBackend(const std::string& message) {
  throw c10::DistBackendError(message);
}

// Throws braid's error, with the communicator's last-error sentence, unless the call succeeded:
// a DistBackendError (a RuntimeError), as torch's own backends fail, and a timeout says "Timed
// out" as theirs do (Gloo's, ProcessGroupNCCL's watchdog), for code that looks for it.
inline void check(braidComm_t comm, braidResult_t result, const char* what) {
  if (result == braidSuccess) return;
  const std::string why = result == braidTimeout ? "Timed out waiting for a peer (braidTimeout)"
                                                 : braidGetErrorString(result);
  failBackend(std::string("braid backend: ") + what + " failed: " + why + ": " +
              braidGetLastError(comm));
}

// The tensors' one device: all on the CPU, or all on one CUDA device; else refused, naming the
// call and the devices.
inline c10::Device deviceOf(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(!tensors.empty(), "braid backend: ", what, " of no tensors");
  const c10::Device device = tensors[0].device();
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "braid backend: ", what, " of a tensor on ",
              device, " (expected CPU or CUDA tensors)");
  for (const at::Tensor& t : tensors)
    TORCH_CHECK(t.device() == device, "braid backend: ", what, " of tensors on ", device, " and ",
                t.device(), " (expected one device)");
  return device;
}

// Where one of the backend's calls runs: the communicator and the stream its braid calls take
// (none for a CPU communicator).
struct Where {
  braidComm_t comm;
  braidStream_t stream;
};

// A communicator's settings: its device ("cpu", or "cuda": the current one), its name in braid's
// logs, and the group's timeout (none: braid's default).
inline braidConfig_t commConfig(const char* device, const char* name,
                                std::chrono::milliseconds timeout) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = device;
  config.commName = name;
  if (timeout.count() > 0)
    config.timeoutMs = static_cast<int>(std::min<int64_t>(timeout.count(), INT_MAX));
  return config;
}

// Whether done() holds within `limit` (0: asked once), asked again after pauses growing from
// 0.1 to 10 ms: a store's state, which nothing signals.
template <typename Done>
bool pollUntil(std::chrono::milliseconds limit, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::chrono::microseconds pause(100);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
  return true;
}

// Whether `key` is set in the store within `limit` (0: now), asked without holding the store: a
// TCPStore's get holds its client while it waits, which would keep this rank's other users of the
// store from setting their keys meanwhile.
inline bool keySetWithin(c10d::Store& store, const std::string& key,
                         std::chrono::milliseconds limit) {
  return pollUntil(limit, [&] { return store.check({key}); });
}

// How long the backend waits for another rank through the store: the group's timeout, or the
// store's where the group has none, or a year where neither has one (a store made with
// kNoTimeout waits for ever; a limit of 0 would ask once).
inline std::chrono::milliseconds waitLimitOf(const c10d::Store& store,
                                             std::chrono::milliseconds groupTimeout) {
  if (groupTimeout.count() > 0) return groupTimeout;
  const auto storeTimeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(store.getTimeout());
  return storeTimeout.count() > 0 ? storeTimeout : std::chrono::hours(24 * 365);
}

// Waits until `key` is set (keySetWithin, for waitLimitOf(store, limit)); else fails as
// "Timed out", saying who waited for what (`waiting`: "rank 2 waited for rank 0 to ...").
inline void awaitKeyOrFail(c10d::Store& store, const std::string& key,
                           std::chrono::milliseconds limit, const std::string& waiting) {
  limit = waitLimitOf(store, limit);
  if (!keySetWithin(store, key, limit))
    failBackend("braid backend: Timed out after " + std::to_string(limit.count()) +
                " ms: " + waiting);
}

// Deletes `key` from the store, best effort (a store whose host has gone keeps nothing anyway).
inline void forgetKey(c10d::Store& store, const std::string& key) {
  try {
    store.deleteKey(key);
  } catch (const std::exception&) {
  }
}

// A communicator of `nranks` whose unique id the store carries under `key`: rank 0 makes it and
// sets it; the others wait for it by polling (keySetWithin: a TCPStore's get holds its client
// while it waits, and this rank's channels may have keys to publish through it meanwhile, as when
// the group's first collective of CUDA tensors makes the CUDA communicator), for `limit` (the
// group's timeout), saying who waited for what (`waiting`) if it never comes. Once its init has
// ended, rank 0 deletes the key (on success every rank has read it): torch names a group made again
// after destroy_process_group as before (an in-process restart over torchrun's store, which
// outlives it), and its ranks must not read this communicator's id (a failed init deletes it too).
// instanceTag: a text derived from the id, alike on every rank and new with every communicator,
// which begins the keys of the group's later meetings, so that a group made again by the same
// name never meets the keys the first one left (a failed monitored barrier's, a probe's).
inline braidComm_t commThroughStore(c10d::Store& store, const std::string& key, int rank,
                                    int nranks, braidConfig_t config,
                                    std::chrono::milliseconds limit, const std::string& waiting,
                                    const char* what, std::string* instanceTag = nullptr) {
  braidUniqueId id;
  if (rank == 0) {
    check(nullptr, braidGetUniqueId(&id), "braidGetUniqueId");
    store.set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal));
  } else {
    awaitKeyOrFail(store, key, limit, waiting);
    const std::vector<uint8_t> bytes = store.get(key);
    TORCH_CHECK(bytes.size() == sizeof id.internal, "braid backend: the store's ", key, " has ",
                bytes.size(), " bytes (expected ", sizeof id.internal, ")");
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  braidComm_t comm = nullptr;
  const braidResult_t result = braidCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (rank == 0) forgetKey(store, key);
  check(nullptr, result, what);
  if (instanceTag != nullptr)
    *instanceTag = std::to_string(std::hash<std::string_view>{}(
        std::string_view(reinterpret_cast<const char*>(id.internal), sizeof id.internal)));
  return comm;
}

// A tensor as a braid call reads and writes it: itself when contiguous, else a contiguous copy
// (made on the current stream, for a CUDA tensor) whose contents are copied back where it is an
// output (as torch's own backends). Its device is the call's (checked where the call is issued).
struct Flat {
  at::Tensor user, flat;
  explicit Flat(const at::Tensor& t) : user(t) {
    TORCH_CHECK(t.layout() == at::kStrided, "braid backend: a ", t.layout(),
                " tensor (expected a dense one; sparse COO tensors are taken by all_reduce with "
                "SUM only)");
    flat = t.is_contiguous() ? t : t.contiguous();
  }
  void* data() const { return flat.data_ptr(); }
  size_t count() const { return static_cast<size_t>(flat.numel()); }
  void writeBack() {
    if (!flat.is_same(user)) user.copy_(flat);
  }
};

// A message moves its tensor's elements as braid's datatype of them, or as bytes where braid has
// none (int16, uint16, uint32, uint64, ...: Gloo sends those too; no collective reduces them).
inline std::pair<braidDataType_t, size_t> messageOf(c10::ScalarType type, size_t numel) {
  if (const std::optional<braidDataType_t> braid = braidTypeOf(type)) return {*braid, numel};
  return {braidUint8, numel * c10::elementSize(type)};
}
inline std::pair<braidDataType_t, size_t> messageOf(const Flat& f) {
  return messageOf(f.flat.scalar_type(), f.count());
}

}  // namespace braid_torch
