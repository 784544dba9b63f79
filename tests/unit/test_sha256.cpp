// SHA-256 against the FIPS 180-2 / NIST CAVS example vectors and the padding boundaries.
#include <gtest/gtest.h>

#include <string>

#include "jit/sha256.h"

namespace opfuse::jit {
namespace {

TEST(Sha256, EmptyMessageMatchesNistVector) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, AbcMatchesNistVector) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, TwoBlock448BitMessageMatchesNistVector) {
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, The896BitMessageMatchesNistVector) {
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjk"
                       "lmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, OneMillionLetterAMatchesNistVector) {
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// 55/56 and 119/120 bytes are where the length field stops fitting in the final block.
TEST(Sha256, PaddingBoundaryLengthsMatchReferenceDigests) {
  const std::pair<int, const char*> cases[] = {
      {55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"},
      {56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e"},
      {63, "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2"},
      {64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"},
      {65, "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9"},
      {119, "000b48d4edf0fa7bee3c6236ecd2785baa5db4eeb8bb54341b029e0d9fa5fb0c"},
      {120, "13f05a0b594787f5ecd315edc96141bd3243203d1b7d4f0836f37308b276ba98"},
  };
  for (const auto& [length, expected] : cases) {
    EXPECT_EQ(sha256_hex(std::string(length, 'x')), expected) << length << " bytes";
  }
}

TEST(Sha256, IncrementalUpdatesInOddChunksEqualOneShot) {
  std::string message;
  for (int i = 0; i < 1000; ++i) message.push_back(static_cast<char>(i * 131 + 7));
  for (std::size_t chunk : {1u, 3u, 63u, 64u, 65u, 200u}) {
    Sha256 hasher;
    for (std::size_t offset = 0; offset < message.size(); offset += chunk) {
      hasher.update(std::string_view(message).substr(offset, chunk));
    }
    EXPECT_EQ(to_hex(hasher.finish()), sha256_hex(message)) << "chunk " << chunk;
  }
}

TEST(Sha256, ResetStartsAFreshMessage) {
  Sha256 hasher;
  hasher.update("something else");
  (void)hasher.finish();
  hasher.reset();
  hasher.update("abc");
  EXPECT_EQ(to_hex(hasher.finish()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace opfuse::jit
