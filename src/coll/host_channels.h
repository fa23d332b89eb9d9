// Several channels of one host call at once: each a thread with a watchdog of its own, the first
// failure stopping the others.
#pragma once

#include <functional>
#include <span>

#include "base/wait.h"

namespace braid {

// Runs body(channel, dog) for channels 0..dogs.size()-1 at once: channel 0 on this thread, each
// other on a thread of its own, channel c waiting with dogs[c]. The first to fail makes the
// others' waits fail at their next poll (a slice of their sleep at most), and its error is
// rethrown once every channel has ended.
void runOnChannels(std::span<Watchdog* const> dogs,
                   const std::function<void(int channel, Watchdog& dog)>& body);

}  // namespace braid
