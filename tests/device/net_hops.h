// Hops of the device form through real network proxies (transport/net/proxy.h) over loopback TCP,
// as a CUDA communicator's hops to other hosts run: the sender's proxy drains the FIFO its blocks
// fill into a connection, the receiver's proxy fills the FIFO its blocks read (FIFOs in memory
// the proxies own, as pinned host memory on a GPU). A proxy per rank, all on the one progress
// thread of "lo"; each hop's connections are its own (the reverse direction of each pair is
// connected too, as addPeer takes both, and stays idle). Built only where the test links
// libbraid's internals (BRAID_DEVICE_FORM_NET).
#pragma once

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "base/socket.h"
#include "transport/fifo_view.h"
#include "transport/net/proxy.h"
#include "transport/net/socket_net.h"

namespace braid_test {

class NetHops {
 public:
  // `hops` hops of `ranks` ranks, FIFOs of `geometry`; flagged lines (the low-latency protocol)
  // are received aside and copied in whole (net::LinkFormat).
  NetHops(int ranks, size_t hops, const braid::FifoGeometry& geometry, bool flaggedLines)
      : format_{{}, flaggedLines}, send_(hops), recv_(hops) {
    using namespace braid::net;
    net_ = makeSocketNet(braid::findInterfaces("lo"), {1, 5000});
    listener_ = net_->listen(0, &handle_);
    for (int rank = 0; rank < ranks; ++rank)
      proxies_.push_back(std::make_unique<Proxy>(rank, geometry));
  }

  // Hop `hop` from `sender` to `receiver`; before start().
  void connect(size_t hop, int sender, int receiver) {
    auto forward = connection(), backward = connection();
    send_[hop] =
        proxies_[sender]
            ->addPeer(receiver, std::move(forward.first), std::move(backward.second), format_)
            .send;
    recv_[hop] =
        proxies_[receiver]
            ->addPeer(sender, std::move(backward.first), std::move(forward.second), format_)
            .recv;
  }

  void start() {
    for (auto& proxy : proxies_) {
      proxy->start("lo");
      proxy->operationStarted();  // kernels' FIFO moves cannot wake it: it keeps polling
    }
  }

  // The views of hop `hop` as its receiver and its sender reach them (their slot geometry kept).
  void receiveThrough(size_t hop, braid::FifoRecvView& in) const {
    in.words = &recv_[hop].control->words;
    in.slots = recv_[hop].slots;
  }
  void sendThrough(size_t hop, braid::FifoSendView& out) const {
    out.words = &send_[hop].control->words;
    out.slots = send_[hop].slots;
    out.used = send_[hop].control->bytes;
  }

 private:
  std::pair<std::unique_ptr<braid::net::SendComm>, std::unique_ptr<braid::net::RecvComm>>
  connection() {
    const auto deadline = braid::Clock::now() + std::chrono::seconds(30);
    std::pair<std::unique_ptr<braid::net::SendComm>, std::unique_ptr<braid::net::RecvComm>> c;
    c.first = net_->connect(0, handle_, 0, deadline);
    uint32_t tag = 0;
    c.second = net_->accept(*listener_, &tag, deadline);
    return c;
  }

  braid::net::LinkFormat format_;
  std::unique_ptr<braid::net::Net> net_;
  braid::net::Handle handle_;
  std::unique_ptr<braid::net::ListenComm> listener_;
  std::vector<std::unique_ptr<braid::net::Proxy>> proxies_;  // by rank; they own the FIFOs
  std::vector<braid::FifoDesc> send_, recv_;                 // by hop
};

}  // namespace braid_test
