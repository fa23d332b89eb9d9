// An NCCL net plug-in that loads but cannot serve, for test_nccl_plugin's load errors: its init()
// fails while FAKE_NCCL_NET_INIT_FAILS is set, and it has no device.
#include <cstdlib>

#include "transport/net/nccl_net_v8.h"

using namespace braid::net::nccl;

namespace {

ncclResult_t fakeInit(ncclDebugLogger_t) {
  return std::getenv("FAKE_NCCL_NET_INIT_FAILS") != nullptr ? ncclSystemError : ncclSuccess;
}

ncclResult_t fakeDevices(int* ndev) {
  *ndev = 0;
  return ncclSuccess;
}

ncclNet_v8_t fakePlugin() {
  ncclNet_v8_t plugin{};  // nothing past devices() is called on a plug-in without a device
  plugin.name = "Fake";
  plugin.init = fakeInit;
  plugin.devices = fakeDevices;
  return plugin;
}

}  // namespace

extern "C" const ncclNet_v8_t ncclNetPlugin_v8 = fakePlugin();
