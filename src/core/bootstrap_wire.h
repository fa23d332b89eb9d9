// The bootstrap's wire format, shared by its files: limits, little-endian encoding, the hellos
// that prove the secret and the root's replies.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/socket.h"
#include "base/wait.h"
#include "core/bootstrap.h"

namespace braid::bootstrap_detail {

constexpr int kMaxRanks = 1 << 20;
constexpr size_t kMaxInfoBytes = 64 << 10;
constexpr size_t kHelloHeaderBytes = 8 + 4 + 4 + 4 + 4 + 32 + kCommKeyBytes;
constexpr size_t kReplyHeaderBytes = 8 + 4 + 8;
constexpr size_t kCollectiveHeaderBytes = 8 + 8;
// A connection must prove itself this quickly: a stranger that sends nothing is dropped soon.
constexpr auto kHelloTimeout = std::chrono::seconds(1);

// How errors and logs name a communicator: the first bytes of its key.
std::string keyName(const CommKey& key);

enum HelloKind : uint32_t { kRootHello = 1, kRingHello = 2 };

// Little-endian encoding, so ids and messages mean the same on every host.
class WireWriter {
 public:
  template <typename T>
  void put(T value) {
    auto bits = static_cast<std::make_unsigned_t<T>>(value);
    for (size_t i = 0; i < sizeof(T); ++i)
      out_.push_back(static_cast<char>((static_cast<uint64_t>(bits) >> (8 * i)) & 0xff));
  }
  void putBytes(const void* data, size_t bytes) {
    out_.append(static_cast<const char*>(data), bytes);
  }
  void putAddress(const SocketAddress& address) {
    put<uint8_t>(address.family() == AF_INET6 ? 6 : 4);
    put<uint16_t>(address.port());
    std::vector<uint8_t> raw = address.bytes();
    raw.resize(16);
    putBytes(raw.data(), raw.size());
  }
  const std::string& data() const { return out_; }

 private:
  std::string out_;
};

class WireReader {
 public:
  WireReader(const void* data, size_t bytes, std::string what)
      : data_(static_cast<const uint8_t*>(data)), left_(bytes), what_(std::move(what)) {}

  template <typename T>
  T get() {
    need(sizeof(T));
    uint64_t bits = 0;
    for (size_t i = 0; i < sizeof(T); ++i) bits |= static_cast<uint64_t>(data_[i]) << (8 * i);
    advance(sizeof(T));
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(bits));
  }
  void getBytes(void* out, size_t bytes) {
    need(bytes);
    std::memcpy(out, data_, bytes);
    advance(bytes);
  }
  std::string getString(size_t bytes) {
    need(bytes);
    std::string s(reinterpret_cast<const char*>(data_), bytes);
    advance(bytes);
    return s;
  }
  SocketAddress getAddress() {
    auto family = get<uint8_t>();
    auto port = get<uint16_t>();
    uint8_t raw[16];
    getBytes(raw, sizeof raw);
    if (family != 4 && family != 6)
      fail(braidInvalidArgument, "{} holds an unknown address family {}", what_, family);
    return SocketAddress::fromBytes(family == 4 ? AF_INET : AF_INET6, raw, port);
  }
  size_t left() const { return left_; }

 private:
  void need(size_t bytes) const {
    if (bytes > left_) fail(braidInvalidArgument, "{} is truncated", what_);
  }
  void advance(size_t bytes) {
    data_ += bytes;
    left_ -= bytes;
  }
  const uint8_t* data_;
  size_t left_;
  std::string what_;
};

// ---- hellos: how a connection proves the secret ----

std::string encodeHello(HelloKind kind, int rank, int nranks, const BootstrapId& id,
                        const std::string& payload);

struct Hello {
  uint32_t kind = 0;
  int rank = 0;
  int nranks = 0;
  size_t payloadBytes = 0;
  CommKey key{};  // which communicator the rank belongs to
  std::string payload;
};

// Parses and checks a hello header; returns why it is not acceptable, or nothing.
std::optional<std::string> checkHelloHeader(const std::string& header, const uint8_t* secret,
                                            Hello* hello);

struct RootHello {
  SocketAddress listenAddress;
  Clock::time_point deadline;
  std::string info;
};

RootHello parseRootHello(const std::string& payload);

// ---- what a rank reads from the root ----

std::string encodeReply(braidResult_t code, const std::string& payload);

struct ReplyHeader {
  braidResult_t code = braidSuccess;
  uint64_t bytes = 0;  // of the body that follows: the rank table, or the error's sentence
};

ReplyHeader parseReplyHeader(const char* header, int nranks, size_t infoBytes,
                             const std::string& activity, const std::string& from);

void parseTable(const std::string& table, int nranks, size_t infoBytes, const std::string& activity,
                std::vector<SocketAddress>* addresses, std::vector<std::string>* infos);

}  // namespace braid::bootstrap_detail
