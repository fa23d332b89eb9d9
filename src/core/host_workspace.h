// What a communicator's host executor keeps between calls: the one-shot exchange's scratch,
// the chooser of slot stores (what it measured carries over), the count of collectives (every
// slot of a collective is tagged with its number), a PreMulSum's scaled input, and the staging
// buffer of a group's fused pass (coll/group_plan.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coll/host_executor.h"
#include "coll/slot_stores.h"
#include "core/reduction_ops.h"

namespace braid {

class HostWorkspace {
 public:
  // stores: BRAID_SLOT_STORES's text (SlotStoreChooser).
  explicit HostWorkspace(const std::string& stores) : slotStores_(stores) {}

  // At init: the largest all-reduce the one-shot exchange takes (Selection::directMaxBytes) and
  // the scratch every call is lent, at least that large (Selection::scratchBytes).
  void setLimits(size_t directMaxBytes, size_t scratchBytes);
  // A call's share of the workspace: the scratch and the slot stores' chooser, and for a
  // collective (not send/recv) its number, one more than the last one's.
  void lendTo(CollContext& ctx, bool collective);
  // `count` elements at `input` times op's scalar (a PreMulSum), kept here: a network link may
  // send from them (the one-shot all-reduce's postFrom) until the call ends, and after a failure
  // until the links are gone.
  const void* scaled(const ReductionOps& ops, braidRedOp_t op, const void* input, size_t count);
  // A fused pass's staging buffer of at least `bytes` (a pass holds at most
  // BRAID_GROUP_FUSE_MAX_BYTES), not zeroed; asked for in the links' turn.
  uint8_t* staging(size_t bytes);
  // Once a PreMulSum's call or a fused pass is done: a scaled input larger than the one-shot
  // exchange takes, or a staging buffer above kKeptStagingBytes, is not kept. Up to the default
  // BRAID_GROUP_FUSE_MAX_BYTES it is: a training step's groups reuse it, rather than fault in
  // fresh pages each time. Not after a failure: a link may still send from them until the links
  // are gone.
  void releaseLargeBuffers();
  static constexpr size_t kKeptStagingBytes = 16 << 20;
  size_t scaledInputCapacity() const { return preMulSumInput_.capacity(); }
  size_t stagingCapacity() const { return stagingBytes_; }
  size_t scratchBytes() const { return scratch_.size(); }

  uint64_t collectives() const { return collectives_; }

 private:
  size_t directMaxBytes_ = 0;
  std::vector<unsigned char> scratch_;
  std::vector<uint8_t> preMulSumInput_;
  std::unique_ptr<uint8_t[]> staging_;
  size_t stagingBytes_ = 0;
  SlotStoreChooser slotStores_;
  uint64_t collectives_ = 0;
};

}  // namespace braid
