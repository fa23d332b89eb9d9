// The bootstrap's wire format: encoding and checking hellos, root hellos and replies, the unique
// id's bytes, and the decoding the fuzz targets drive.
#include "core/bootstrap_wire.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "base/error.h"

namespace braid {
using namespace bootstrap_detail;
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kIdMagic = 0x44494272;  // "rBID" in the first bytes of a braidUniqueId
constexpr uint8_t kIdFormatVersion = 2;
constexpr uint8_t kIdFlagRootHostedByRank0 = 1;

// Every bootstrap message starts with this; change it when the wire format changes.
constexpr uint64_t kWireMagic = 0x32762D6469617262;  // "braid-v2"
constexpr size_t kMaxErrorBytes = 64 << 10;
constexpr size_t kAddressBytes = 1 + 2 + 16;  // family, port, address
constexpr size_t kMaxHelloPayload = kAddressBytes + 8 + kMaxInfoBytes;
// The longest wait a rank may announce to the root: a day.
constexpr int64_t kMaxWaitMs = int64_t{24} * 3600 * 1000;

}  // namespace

namespace bootstrap_detail {

std::string keyName(const CommKey& key) {
  return fmt::format("{:02x}", fmt::join(key.begin(), key.begin() + 6, ""));
}

// ---- hellos: how a connection proves the secret ----

std::string encodeHello(HelloKind kind, int rank, int nranks, const BootstrapId& id,
                        const std::string& payload) {
  WireWriter w;
  w.put(kWireMagic);
  w.put<uint32_t>(kind);
  w.put<int32_t>(rank);
  w.put<int32_t>(nranks);
  w.put<uint32_t>(static_cast<uint32_t>(payload.size()));
  w.putBytes(id.secret, sizeof id.secret);
  w.putBytes(id.key.data(), id.key.size());
  w.putBytes(payload.data(), payload.size());
  return w.data();
}

std::optional<std::string> checkHelloHeader(const std::string& header, const uint8_t* secret,
                                            Hello* hello) {
  WireReader r(header.data(), header.size(), "hello");
  auto magic = r.get<uint64_t>();
  if (magic != kWireMagic) return fmt::format("bad magic 0x{:016x}", magic);
  hello->kind = r.get<uint32_t>();
  hello->rank = r.get<int32_t>();
  hello->nranks = r.get<int32_t>();
  hello->payloadBytes = r.get<uint32_t>();
  uint8_t claimed[32];
  r.getBytes(claimed, sizeof claimed);
  if (std::memcmp(claimed, secret, sizeof claimed) != 0)
    return std::string("wrong secret (a unique id from another job?)");
  r.getBytes(hello->key.data(), hello->key.size());
  if (hello->kind != kRootHello && hello->kind != kRingHello)
    return fmt::format("unknown hello kind {}", hello->kind);
  if (hello->nranks < 1 || hello->nranks > kMaxRanks)
    return fmt::format("nranks {} outside 1..{}", hello->nranks, kMaxRanks);
  if (hello->rank < 0 || hello->rank >= hello->nranks)
    return fmt::format("rank {} outside 0..{}", hello->rank, hello->nranks - 1);
  if (hello->payloadBytes > kMaxHelloPayload)
    return fmt::format("hello payload of {} bytes exceeds {}", hello->payloadBytes,
                       kMaxHelloPayload);
  return std::nullopt;
}

RootHello parseRootHello(const std::string& payload) {
  WireReader r(payload.data(), payload.size(), "rendezvous hello");
  RootHello h;
  h.listenAddress = r.getAddress();
  // Clamped: a stranger's count of milliseconds must not overflow the clock (found by fuzzing).
  h.deadline = Clock::now() + milliseconds(std::clamp<int64_t>(r.get<int64_t>(), 0, kMaxWaitMs));
  h.info = r.getString(r.left());
  return h;
}

// ---- what a rank reads from the root ----

std::string encodeReply(braidResult_t code, const std::string& payload) {
  WireWriter w;
  w.put(kWireMagic);
  w.put<uint32_t>(code);
  w.put<uint64_t>(payload.size());
  w.putBytes(payload.data(), payload.size());
  return w.data();
}

ReplyHeader parseReplyHeader(const char* header, int nranks, size_t infoBytes,
                             const std::string& activity, const std::string& from) {
  WireReader r(header, kReplyHeaderBytes, activity);
  auto magic = r.get<uint64_t>();
  auto code = r.get<uint32_t>();
  auto bytes = r.get<uint64_t>();
  if (magic != kWireMagic)
    fail(braidRemoteError, "{}: {} sent a reply with bad magic 0x{:016x}", activity, from, magic);
  if (code != braidSuccess) {
    if (bytes > kMaxErrorBytes || code >= braidNumResults)
      fail(braidRemoteError, "{}: {} sent a malformed error (code {}, {} bytes)", activity, from,
           code, bytes);
    return {static_cast<braidResult_t>(code), bytes};
  }
  const uint64_t expected = uint64_t(nranks) * (kAddressBytes + infoBytes);
  if (bytes != expected)
    fail(braidRemoteError, "{}: {} sent a table of {} bytes, expected {}", activity, from, bytes,
         expected);
  return {braidSuccess, bytes};
}

void parseTable(const std::string& table, int nranks, size_t infoBytes, const std::string& activity,
                std::vector<SocketAddress>* addresses, std::vector<std::string>* infos) {
  WireReader t(table.data(), table.size(), activity + ": the rank table");
  for (int r = 0; r < nranks; ++r) {
    addresses->push_back(t.getAddress());
    infos->push_back(t.getString(infoBytes));
  }
}

}  // namespace bootstrap_detail

braidUniqueId BootstrapId::encode() const {
  if (port == 0) fail(braidInvalidArgument, "unique id: port 0 is not a rendezvous port");
  WireWriter w;
  w.put(kIdMagic);
  w.put(kIdFormatVersion);
  w.put<uint8_t>(rootHostedByRank0 ? kIdFlagRootHostedByRank0 : 0);
  w.putAddress(SocketAddress::fromNumeric(host, port, "unique id"));
  w.putBytes(secret, sizeof secret);
  w.putBytes(key.data(), key.size());
  static_assert(4 + 1 + 1 + kAddressBytes + 32 + kCommKeyBytes <= BRAID_UNIQUE_ID_BYTES);
  braidUniqueId id{};
  std::memcpy(id.internal, w.data().data(), w.data().size());
  return id;
}

BootstrapId BootstrapId::decode(const braidUniqueId& raw) {
  WireReader r(raw.internal, sizeof raw.internal, "commId");
  auto magic = r.get<uint32_t>();
  if (magic != kIdMagic)
    fail(braidInvalidArgument,
         "commId is not a braid unique id (bad magic 0x{:08x}, expected 0x{:08x}); pass the id "
         "braidGetUniqueId made",
         magic, kIdMagic);
  auto version = r.get<uint8_t>();
  if (version != kIdFormatVersion)
    fail(braidInvalidArgument,
         "commId has format version {}, this braid reads version {} (mixed braid versions?)",
         version, kIdFormatVersion);
  auto flags = r.get<uint8_t>();
  if ((flags & ~kIdFlagRootHostedByRank0) != 0)
    fail(braidInvalidArgument, "commId is not a braid unique id (unknown flags 0x{:02x})", flags);
  SocketAddress address = r.getAddress();
  if (address.port() == 0) fail(braidInvalidArgument, "commId is not a braid unique id (port 0)");
  BootstrapId id;
  id.host = address.host();
  id.port = address.port();
  r.getBytes(id.secret, sizeof id.secret);
  r.getBytes(id.key.data(), id.key.size());
  id.rootHostedByRank0 = (flags & kIdFlagRootHostedByRank0) != 0;
  return id;
}

namespace bootstrap_wire {

void decodeRootConnection(std::string_view bytes, const uint8_t* secret) {
  if (bytes.size() < kHelloHeaderBytes) fail(braidRemoteError, "hello is truncated");
  Hello hello;
  if (std::optional<std::string> why =
          checkHelloHeader(std::string(bytes.substr(0, kHelloHeaderBytes)), secret, &hello))
    fail(braidRemoteError, "hello refused: {}", *why);
  const std::string_view payload = bytes.substr(kHelloHeaderBytes);
  if (payload.size() < hello.payloadBytes) fail(braidRemoteError, "hello payload is truncated");
  if (hello.kind == kRootHello) parseRootHello(std::string(payload.substr(0, hello.payloadBytes)));
}

void decodeRootReply(std::string_view bytes, int nranks, size_t infoBytes) {
  if (bytes.size() < kReplyHeaderBytes) fail(braidRemoteError, "reply is truncated");
  const ReplyHeader reply = parseReplyHeader(bytes.data(), nranks, infoBytes, "reply", "the root");
  const std::string_view body = bytes.substr(kReplyHeaderBytes);
  if (body.size() < reply.bytes) fail(braidRemoteError, "reply body is truncated");
  if (reply.code != braidSuccess) return;
  std::vector<SocketAddress> addresses;
  std::vector<std::string> infos;
  parseTable(std::string(body.substr(0, reply.bytes)), nranks, infoBytes, "reply", &addresses,
             &infos);
}

}  // namespace bootstrap_wire

}  // namespace braid
