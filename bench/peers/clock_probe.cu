// A one-thread kernel that measures the SM clock where it runs: clock64() cycles over
// %globaltimer nanoseconds while it spins for a fixed time. bench/peers/after_gemm.py launches it
// right after FP8 GEMMs and after idle time to see the clock the next kernel gets. Built by
// after_gemm.py with nvcc into a shared library and called through ctypes.
#include <cuda_runtime.h>

namespace {

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// out[0] = cycles, out[1] = nanoseconds of one spin of at least spin_ns.
__global__ void clock_probe(long long* out, long long spin_ns) {
  const unsigned long long t0 = global_ns();
  const long long c0 = clock64();
  unsigned long long t1 = t0;
  while (static_cast<long long>(t1 - t0) < spin_ns) t1 = global_ns();
  const long long c1 = clock64();
  out[0] = c1 - c0;
  out[1] = static_cast<long long>(t1 - t0);
}

}  // namespace

// Launches the probe on `stream` (a cudaStream_t); returns the launch's cudaError_t.
extern "C" int clock_probe_launch(void* stream, long long* out, long long spin_ns) {
  clock_probe<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(out, spin_ns);
  return static_cast<int>(cudaGetLastError());
}
