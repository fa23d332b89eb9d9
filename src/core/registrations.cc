#include "core/registrations.h"

#include <algorithm>

#include "base/error.h"

namespace braid {

void* Registrations::add(void* buff, size_t size, bool window, uint64_t windowId) {
  const std::lock_guard<std::mutex> lock(mutex_);
  registrations_.push_back(
      std::make_unique<Registration>(Registration{buff, size, window, windowId}));
  return registrations_.back().get();
}

Registrations::List::const_iterator Registrations::find(void* handle, bool window,
                                                        const char* fn) const {
  auto it = std::find_if(registrations_.begin(), registrations_.end(),
                         [&](const auto& r) { return r.get() == handle && r->window == window; });
  if (it == registrations_.end())
    fail(braidInvalidArgument,
         "{} on rank {}: handle {} is not a registration of this communicator (expected one that "
         "{} returned and that was not deregistered)",
         fn, rank_, handle, window ? "braidCommWindowRegister" : "braidCommRegister");
  return it;
}

uint64_t Registrations::remove(void* handle, bool window, const char* fn) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = find(handle, window, fn);
  const uint64_t windowId = (*it)->windowId;
  registrations_.erase(it);
  return windowId;
}

void* Registrations::buffer(void* handle, bool window, const char* fn) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return (*find(handle, window, fn))->buff;
}

}  // namespace braid
