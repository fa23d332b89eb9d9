#include "coll/host_tree.h"

#include "base/binary_trees.h"
#include "coll/host_engine_policies.h"
#include "coll/tree_engine.h"

namespace braid {
namespace {

template <class T>
void runTreeAllReduceAs(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  const int n = ctx.nranks;
  const int me = ringPosition(ctx.ringOrder.data(), n, ctx.rank);
  const BinaryTrees trees(n);
  const kernels::ReduceFn reduce = kernels::reduceFn(a.type, a.op, false);
  const SimdMover<T> move{reduce, reduce, false, false};
  auto portsTo = [&](int position) {
    const int peer = ctx.ringOrder[position];
    return ConnectorPorts{ctx.recvFrom[peer], ctx.sendTo[peer], &tag, ctx.dog};
  };
  OneThread thread;
  for (int tree = 0; tree < 2; ++tree) {
    const TreeNode node = trees.node(tree, me);
    TreePorts<ConnectorPorts> ports{};
    if (node.parent >= 0) ports.parent = portsTo(node.parent);
    for (int c = 0; c < node.nChildren; ++c) ports.children[c] = portsTo(node.children[c]);
    const size_t begin = shareBegin<T>(a.count, tree, 2);
    const size_t end = shareBegin<T>(a.count, tree + 1, 2);
    const TreeCall<T> call{Collective::AllReduce,
                           static_cast<const T*>(a.sendbuff) + begin,
                           static_cast<T*>(a.recvbuff) + begin,
                           end - begin,
                           a.op == braidAvg ? n : 1,
                           node.parent >= 0,
                           node.nChildren};
    runTree(thread, move, call, ports);  // its waits throw rather than give up
  }
}

}  // namespace

void runTreeAllReduce(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  switch (kernels::typeSize(a.type)) {
    case 1: return runTreeAllReduceAs<uint8_t>(ctx, a, tag);
    case 2: return runTreeAllReduceAs<uint16_t>(ctx, a, tag);
    case 4: return runTreeAllReduceAs<uint32_t>(ctx, a, tag);
    default: return runTreeAllReduceAs<uint64_t>(ctx, a, tag);
  }
}

}  // namespace braid
