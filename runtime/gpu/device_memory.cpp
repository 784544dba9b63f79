#include "gpu/device_memory.h"

#include <fmt/format.h>

#include <limits>
#include <utility>

#include "gpu/cuda_check.h"

namespace opfuse::gpu {

DeviceBuffer::DeviceBuffer(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes == 0) return;
  OPFUSE_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream),
                    fmt::format("allocating {} bytes", bytes));
  size_ = bytes;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      stream_(other.stream_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    stream_ = other.stream_;
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (data_ == nullptr) return;
  // Why the error is dropped: destructors must not throw, and the usual failure here is the CUDA
  // runtime already shutting down at process exit, when the memory goes away anyway.
  if (cudaFreeAsync(data_, stream_) != cudaSuccess) (void)cudaGetLastError();
  data_ = nullptr;
  size_ = 0;
}

namespace {

cudaMemPool_t current_pool() {
  int device = 0;
  OPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  OPFUSE_CUDA_CHECK(cudaDeviceGetMemPool(&pool, device));
  return pool;
}

std::uint64_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attribute) {
  std::uint64_t value = 0;  // cuuint64_t for every usage attribute
  OPFUSE_CUDA_CHECK(cudaMemPoolGetAttribute(pool, attribute, &value));
  return value;
}

}  // namespace

PoolUsage pool_usage() {
  const cudaMemPool_t pool = current_pool();
  PoolUsage usage;
  usage.used = pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent);
  usage.used_high = pool_attribute(pool, cudaMemPoolAttrUsedMemHigh);
  usage.reserved = pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent);
  usage.reserved_high = pool_attribute(pool, cudaMemPoolAttrReservedMemHigh);
  return usage;
}

void reset_pool_peak() {
  const cudaMemPool_t pool = current_pool();
  // Why 0: the only value CUDA accepts for the high-water marks; it restarts them from now.
  std::uint64_t zero = 0;
  OPFUSE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  OPFUSE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
}

void retain_pool_memory() {
  std::uint64_t keep_everything = std::numeric_limits<std::uint64_t>::max();
  OPFUSE_CUDA_CHECK(
      cudaMemPoolSetAttribute(current_pool(), cudaMemPoolAttrReleaseThreshold, &keep_everything));
}

}  // namespace opfuse::gpu
