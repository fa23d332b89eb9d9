// A call of the C API (CollArgs) as one rank's RingCall, for the host and the device executors.
#pragma once

#include "coll/call.h"
#include "coll/ring_engine.h"

namespace braid {

template <class T>
RingCall<T> ringCallOf(const CollArgs& a, int nranks, int rank, const int* ringOrder) {
  return {a.coll,
          nranks,
          rank,
          a.root,
          static_cast<const T*>(a.sendbuff),
          static_cast<T*>(a.recvbuff),
          a.count,
          a.count,
          a.op == braidAvg ? nranks : 1,
          ringOrder};
}

}  // namespace braid
