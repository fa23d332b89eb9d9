// A communicator's registered buffers (braidCommRegister, braidCommWindowRegister): each a handle
// that names it until it is deregistered, with the window it made where it is one of a CUDA
// communicator's (core/window_table.h). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace braid {

class Registrations {
 public:
  explicit Registrations(int rank) : rank_(rank) {}

  // A new registration's handle. `windowId`: the window it made (0: none).
  void* add(void* buff, size_t size, bool window, uint64_t windowId);
  // Removes the registration `handle` of kind `window` and returns its window id (0: none); fails
  // (braidInvalidArgument, naming `fn` and the rank) where `handle` is no such registration.
  uint64_t remove(void* handle, bool window, const char* fn);
  // The buffer the registration `handle` of kind `window` was made with; fails as remove().
  void* buffer(void* handle, bool window, const char* fn) const;

 private:
  struct Registration {
    void* buff;
    size_t size;
    bool window;
    uint64_t windowId;
  };
  using List = std::vector<std::unique_ptr<Registration>>;
  // Where `handle` is (the caller holds mutex_).
  List::const_iterator find(void* handle, bool window, const char* fn) const;

  const int rank_;
  mutable std::mutex mutex_;
  List registrations_;
};

}  // namespace braid
