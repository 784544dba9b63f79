// Philox4x32-10, the counter-based random number generator of Salmon et al. ("Parallel random
// numbers: as easy as 1, 2, 3", SC'11; Random123's philox4x32 with 10 rounds): four 32-bit words
// of output per (counter, key), no state. The same function runs on the host (the CPU oracle of
// micro-scaled casts, runtime/cpu/micro_scaling.cpp) and on the device (templates/micro_scale.cuh),
// so stochastic rounding draws the very same bits on both: this header compiles as plain C++17
// and under NVRTC/nvcc (functions __host__ __device__ there).
//
// Round: (c0, c1, c2, c3) -> (hi(M1 * c2) ^ c1 ^ k0, lo(M1 * c2), hi(M0 * c0) ^ c3 ^ k1,
// lo(M0 * c0)), the key bumped by the Weyl constants (W0, W1) between rounds.
// tests/unit/test_micro_scaling.cpp checks Random123's known-answer vectors.
#ifndef OPFUSE_TEMPLATES_COMMON_PHILOX_CUH_
#define OPFUSE_TEMPLATES_COMMON_PHILOX_CUH_

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define OPFUSE_PHILOX_FN __host__ __device__ __forceinline__
#else
#define OPFUSE_PHILOX_FN inline
#endif

namespace opfuse {

// Four 32-bit words (the counter, or the output). `unsigned int` is 32 bits on every target.
struct Philox4x32 {
  unsigned int v[4];
};

inline constexpr unsigned int kPhiloxM0 = 0xD2511F53u;
inline constexpr unsigned int kPhiloxM1 = 0xCD9E8D57u;
inline constexpr unsigned int kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr unsigned int kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
inline constexpr int kPhiloxRounds = 10;

// The high 32 bits of a 32 x 32 -> 64-bit product.
OPFUSE_PHILOX_FN unsigned int philox_mulhi(unsigned int a, unsigned int b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
#endif
}

// Philox4x32-10 of `counter` under the key (key0, key1).
OPFUSE_PHILOX_FN Philox4x32 philox4x32_10(Philox4x32 counter, unsigned int key0,
                                          unsigned int key1) {
  unsigned int c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const unsigned int hi0 = philox_mulhi(kPhiloxM0, c0);
    const unsigned int lo0 = kPhiloxM0 * c0;
    const unsigned int hi1 = philox_mulhi(kPhiloxM1, c2);
    const unsigned int lo1 = kPhiloxM1 * c2;
    c0 = hi1 ^ c1 ^ key0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ key1;
    c3 = lo0;
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// The random bits of stochastic rounding (templates/README.md, "Micro-scaled casts"): element `i`
// (its linear index in the quantized copy, unpacked) of a cast draws word i % 4 of
// philox4x32_10({i / 4 low, i / 4 high, stream, step}, {seed low, seed high}). One call serves
// four consecutive elements.
OPFUSE_PHILOX_FN Philox4x32 micro_scale_random_words(unsigned long long group,
                                                     unsigned long long seed, unsigned int stream,
                                                     unsigned int step) {
  const Philox4x32 counter{
      {static_cast<unsigned int>(group), static_cast<unsigned int>(group >> 32), stream, step}};
  return philox4x32_10(counter, static_cast<unsigned int>(seed),
                       static_cast<unsigned int>(seed >> 32));
}

// Dropout's random bits (note "Dropout" in docs/language.md): element i of a dropout's input (its
// row-major linear index) draws word i % 4 of
//   philox4x32_10({i / 4 low, i / 4 high, step, stream}, {seed low, seed high}),
// `step` the training step (the executor's counter), `stream` dropout_stream() of the op's
// instance name, `seed` its seed attribute. It is kept when that word >= dropout_threshold(p).
OPFUSE_PHILOX_FN Philox4x32 dropout_random_words(unsigned long long group, unsigned long long seed,
                                                 unsigned int step, unsigned int stream) {
  const Philox4x32 counter{
      {static_cast<unsigned int>(group), static_cast<unsigned int>(group >> 32), step, stream}};
  return philox4x32_10(counter, static_cast<unsigned int>(seed),
                       static_cast<unsigned int>(seed >> 32));
}

#if !defined(__CUDACC_RTC__)
// The counter's stream word of a dropout op: FNV-1a (32 bits) of its instance name ("dropout_0",
// or the `as NAME` given), so two dropouts of a sequence draw independent masks, and a name
// gives the same mask in any program. Host code only (codegen bakes it into the launch).
inline unsigned int dropout_stream(const char* instance, unsigned long long length) {
  unsigned int hash = 2166136261u;
  for (unsigned long long i = 0; i < length; ++i) {
    hash ^= static_cast<unsigned char>(instance[i]);
    hash *= 16777619u;
  }
  return hash;
}

// The keep threshold of drop probability p in [0, 1): u = word / 2^32 >= p exactly when
// word >= ceil(p * 2^32), computed once on the host in double (p * 2^32 is exact: a power-of-two
// scaling), so the device and the CPU reference compare integers. Returns 2^32 (nothing kept) for
// a p that close to 1; the front end refuses such p.
inline unsigned long long dropout_threshold(double p) {
  const double scaled = p * 4294967296.0;
  unsigned long long t = static_cast<unsigned long long>(scaled);
  if (static_cast<double>(t) < scaled) ++t;  // ceil without <cmath> (NVRTC has no host libm)
  return t;
}
#endif  // !__CUDACC_RTC__

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_PHILOX_CUH_
