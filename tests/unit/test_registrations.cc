// A communicator's registered buffers (core/registrations.h): handles, their kinds, their window
// ids, and the errors for what is no registration.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "core/registrations.h"

namespace {

using braid::Registrations;

// Fails unless `call` throws braidInvalidArgument naming `fn`, the rank and what was expected.
template <class Call>
void expectNoRegistration(Call call, const std::string& fn, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << fn << " accepted what is no registration";
  } catch (const braid::Error& e) {
    EXPECT_EQ(e.code(), braidInvalidArgument);
    const std::string message = e.what();
    EXPECT_NE(message.find(fn + " on rank 5"), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

TEST(Registrations, HandlesNameTheirBuffersUntilRemoved) {
  Registrations r(5);
  int a = 0, b = 0;
  void* plain = r.add(&a, sizeof a, false, 0);
  void* window = r.add(&b, sizeof b, true, 7);
  EXPECT_NE(plain, window);
  EXPECT_EQ(r.buffer(plain, false, "braidCommRegister"), &a);
  EXPECT_EQ(r.buffer(window, true, "braidCommWindowRegister"), &b);
  EXPECT_EQ(r.remove(window, true, "braidCommWindowDeregister"), 7u);
  EXPECT_EQ(r.remove(plain, false, "braidCommDeregister"), 0u);
  expectNoRegistration([&] { r.buffer(plain, false, "braidCommDeregister"); },
                       "braidCommDeregister", "one that braidCommRegister returned");
}

// A handle of one kind is no handle of the other, and a foreign pointer is none at all.
TEST(Registrations, KindsAndForeignHandlesAreRefused) {
  Registrations r(5);
  int a = 0;
  void* plain = r.add(&a, sizeof a, false, 0);
  expectNoRegistration([&] { r.remove(plain, true, "braidCommWindowDeregister"); },
                       "braidCommWindowDeregister", "one that braidCommWindowRegister returned");
  expectNoRegistration([&] { r.remove(&a, false, "braidCommDeregister"); }, "braidCommDeregister",
                       "not a registration of this communicator");
  EXPECT_EQ(r.buffer(plain, false, "braidCommRegister"), &a);  // still there
}

}  // namespace
