#include "coll/host_tree.h"

#include "base/binary_trees.h"
#include "coll/host_engine_policies.h"
#include "coll/tree_engine.h"

namespace braid {
namespace {

// `p` + `elements`, or nullptr for a buffer the rank does not use (a broadcast's input or a
// reduce's output away from the root, which nccl.h lets be anything).
template <class P>
P* offset(P* p, size_t elements) {
  return p == nullptr ? nullptr : p + elements;
}

template <class T>
void runTreeAs(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  const int n = ctx.nranks;
  const int me = ringPosition(ctx.ringOrder.data(), n, ctx.rank);
  const bool rooted = a.coll != Collective::AllReduce;
  const TreesOfHosts trees(ctx.ringHosts,
                           rooted ? ringPosition(ctx.ringOrder.data(), n, a.root) : -1);
  const kernels::ReduceFn reduce = kernels::reduceFn(a.type, a.op, false);
  const SimdMover<T> move{reduce, reduce, false, false};
  auto portsTo = [&](int position) {
    const int peer = ctx.ringOrder[position];
    return ConnectorPorts{ctx.recvFrom[peer], ctx.sendTo[peer], &tag, ctx.dog};
  };
  const size_t slotBytes = ctx.sendTo[ctx.ringOrder[(me + 1) % n]]->slotBytes();
  const int parts = rooted && a.count * sizeof(T) <= slotBytes ? 1 : 2;
  OneThread thread;
  for (int tree = 0; tree < parts; ++tree) {
    const TreeNode node = trees.node(tree, me);
    TreePorts<ConnectorPorts> ports{};
    if (node.parent >= 0) ports.parent = portsTo(node.parent);
    for (int c = 0; c < node.nChildren; ++c) ports.children[c] = portsTo(node.children[c]);
    const size_t begin = shareBegin<T>(a.count, tree, parts);
    const size_t end = shareBegin<T>(a.count, tree + 1, parts);
    const TreeCall<T> call{a.coll,
                           offset(static_cast<const T*>(a.sendbuff), begin),
                           offset(static_cast<T*>(a.recvbuff), begin),
                           end - begin,
                           a.op == braidAvg ? n : 1,
                           node.parent >= 0,
                           node.nChildren};
    runTree(thread, move, call, ports);  // its waits throw rather than give up
  }
}

}  // namespace

void runTreeCollective(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  switch (kernels::typeSize(a.type)) {
    case 1: return runTreeAs<uint8_t>(ctx, a, tag);
    case 2: return runTreeAs<uint16_t>(ctx, a, tag);
    case 4: return runTreeAs<uint32_t>(ctx, a, tag);
    default: return runTreeAs<uint64_t>(ctx, a, tag);
  }
}

}  // namespace braid
