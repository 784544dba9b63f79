// SHA-256 (FIPS 180-4), used for kernel-cache keys and entry checksums. Written here rather than
// taken from OpenSSL because the GPU machines lack OpenSSL's headers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace opfuse::jit {

using Sha256Digest = std::array<std::uint8_t, 32>;

// Incremental hasher: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  // Pads, returns the digest and leaves the hasher unusable until reset().
  Sha256Digest finish();
  void reset();

 private:
  void compress_block(const std::uint8_t* block);

  std::array<std::uint32_t, 8> state_{};
  std::array<std::uint8_t, 64> pending_{};
  std::size_t pending_size_ = 0;
  std::uint64_t total_bytes_ = 0;
};

// Lower-case hex of a digest (64 characters).
std::string to_hex(const Sha256Digest& digest);
// Hex SHA-256 of a byte string in one call.
std::string sha256_hex(std::string_view bytes);

}  // namespace opfuse::jit
