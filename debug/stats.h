// The precision-debug statistics (TE's LogTensorStats and LogFp8TensorStats) and how partial
// results of micro-batches combine. A statistic is computed in two steps: a tensor (or a piece of
// it) is reduced to a fixed record of moments (TensorMoments, QuantizedMoments), records of pieces
// are merged, and value() turns the merged record into the logged number. Only the records travel
// between micro-batches (and later between ranks), so the merge rules here are the only place
// where "how does std combine" is decided.
//
// Decisions where TE's answer is missing or wrong (each is tested in
// tests/unit/test_debug_stats.cpp):
//  - std is the sample standard deviation (divisor N - 1), merged with Chan et al.'s parallel
//    update of the sum of squared deviations. TE merges std with a sign error; this does not.
//  - std of a single element is 0, not NaN (torch.std gives NaN): one value has no spread, and a
//    NaN in a debug log should mean that the data held a NaN.
//  - A tensor with no elements gives NaN for min, max, mean, std, mse, the percentages and (with
//    no scale_inv given) scale_inv_min/max: there is nothing to take them of. Its sums (l1_norm,
//    l2_norm), cur_amax and dynamic ranges are 0.
//  - dynamic_range of a tensor without a nonzero value is 0 (it spans no binade); a block without a
//    nonzero value is left out of max_blockwise_dynamic_range.
//  - NaN in the input makes every statistic that reads the value NaN (min, max, mean, std, l1_norm,
//    l2_norm, cur_amax, dynamic ranges, mse), whatever its position: min and max do not drop it as
//    std::min would depending on argument order. +-Inf gives +-Inf for min/max/mean/sums/amax/
//    dynamic range (NaN when every nonzero value is infinite: inf - inf), and NaN for std.
//    Nothing here traps or has undefined behaviour (checked under ASan+UBSan).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace opfuse::debug {

enum class StatKind : uint8_t {
  // LogTensorStats: of the high-precision tensor.
  Min,
  Max,
  Mean,
  Std,
  L1Norm,
  L2Norm,
  CurAmax,
  DynamicRange,
  MaxBlockwiseDynamicRange,
  // LogFp8TensorStats: of the quantized tensor against the high-precision one.
  Underflows,  // underflows%
  Overflows,   // overflows% (delayed scaling)
  ScaleInvMin,
  ScaleInvMax,
  Mse,
  // opfuse's per-block statistics of the block-scaled what-ifs (fp8_block_scaling_, mxfp8_).
  UnderflowBlocks,   // underflow_blocks%: blocks holding at least one underflow, of all blocks
  ScaleInvLog2Min,   // log2(scale_inv_min)
  ScaleInvLog2Max,   // log2(scale_inv_max)
  ScaleInvLog2Mean,  // mean of log2(scale_inv) over the blocks holding a nonzero finite value
  ScaleInvLog2Std,   // their population standard deviation (the spread of the scale exponents)
  // How many blocks have each scale exponent (ExponentHistogram): several logged values.
  ScaleExponentHistogram,
};

// Which TE feature a statistic belongs to (which record value() reads it from).
enum class StatFamily : uint8_t { Tensor, Quantized };

struct StatInfo {
  StatKind kind;
  std::string_view name;  // TE's spelling, as written in config.yaml and in the metric name
  StatFamily family;
};

// The one name table, in StatKind order. LogFp8TensorStats' recipe prefix
// ("fp8_current_scaling_mse") and "_columnwise" suffix are the config reader's business: the names
// here are the bare statistics.
inline constexpr StatInfo kStatTable[] = {
    {StatKind::Min, "min", StatFamily::Tensor},
    {StatKind::Max, "max", StatFamily::Tensor},
    {StatKind::Mean, "mean", StatFamily::Tensor},
    {StatKind::Std, "std", StatFamily::Tensor},
    {StatKind::L1Norm, "l1_norm", StatFamily::Tensor},
    {StatKind::L2Norm, "l2_norm", StatFamily::Tensor},
    {StatKind::CurAmax, "cur_amax", StatFamily::Tensor},
    {StatKind::DynamicRange, "dynamic_range", StatFamily::Tensor},
    {StatKind::MaxBlockwiseDynamicRange, "max_blockwise_dynamic_range", StatFamily::Tensor},
    {StatKind::Underflows, "underflows%", StatFamily::Quantized},
    {StatKind::Overflows, "overflows%", StatFamily::Quantized},
    {StatKind::ScaleInvMin, "scale_inv_min", StatFamily::Quantized},
    {StatKind::ScaleInvMax, "scale_inv_max", StatFamily::Quantized},
    {StatKind::Mse, "mse", StatFamily::Quantized},
    {StatKind::UnderflowBlocks, "underflow_blocks%", StatFamily::Quantized},
    {StatKind::ScaleInvLog2Min, "scale_inv_log2_min", StatFamily::Quantized},
    {StatKind::ScaleInvLog2Max, "scale_inv_log2_max", StatFamily::Quantized},
    {StatKind::ScaleInvLog2Mean, "scale_inv_log2_mean", StatFamily::Quantized},
    {StatKind::ScaleInvLog2Std, "scale_inv_log2_std", StatFamily::Quantized},
    {StatKind::ScaleExponentHistogram, "scale_exponent_histogram", StatFamily::Quantized},
};

// Whether `kind` is one of opfuse's per-block statistics (only for block-scaled what-ifs).
bool is_per_block_stat(StatKind kind);

// The spelling of `kind` ("?" for a value outside the table, which a cast from an int can make).
std::string_view stat_name(StatKind kind);
// The statistic spelled exactly `name` (case-sensitive, as TE); nullopt for any other text.
std::optional<StatKind> parse_stat(std::string_view name);
StatFamily stat_family(StatKind kind);

// What the LogTensorStats statistics of a tensor need, reduced so that two records merge.
//
// Fixed layout: only int64_t and double fields, 8 bytes each, no padding, trivially copyable, in
// this order. A device reduction kernel writes the same layout (one struct per block or per
// micro-batch) and the host merges the records with merge(); do not reorder or add fields of
// other types without changing that kernel. A default-constructed record is the empty tensor, the
// identity of merge().
struct TensorMoments {
  int64_t count = 0;
  double mean = 0;
  double m2 = 0;  // sum of squared deviations from `mean` (Chan's M2)
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum_abs = 0;  // l1_norm
  double sum_sq = 0;   // l2_norm = sqrt(sum_sq)
  double amax = 0;
  double min_nonzero_abs = std::numeric_limits<double>::infinity();  // +inf: no nonzero value yet
  double max_nonzero_abs = 0;                                        // 0: no nonzero value yet
  // max_blockwise_dynamic_range for the one block configuration the caller asked for (0 when it
  // did not or no block held a nonzero value). A tensor logged with several configurations keeps
  // one record per configuration, or the values alone: they merge by max.
  double max_blockwise_dynamic_range = 0;
};
static_assert(std::is_standard_layout_v<TensorMoments> &&
              std::is_trivially_copyable_v<TensorMoments> && sizeof(TensorMoments) == 11 * 8);

// The moments of x, computed in double in one fixed order (element 0 first; mean by a first pass,
// M2 by a second), so the same input gives bitwise the same record. max_blockwise_dynamic_range is
// left 0: it needs the tensor's shape (see below).
TensorMoments moments_of(std::span<const float> x);

// The moments of two disjoint pieces of one tensor (micro-batches of an activation or gradient;
// later, ranks). Exact for counts, min, max, amax and the dynamic ranges; sums and Chan's update
// for mean/M2 round, so the result is within a few ulps of moments_of(whole), not bitwise equal,
// and depends on the merge order: merge in a fixed order (micro-batch order) for reproducible
// logs. Weights are the same tensor in every micro-batch and must count once per iteration (the
// first micro-batch's record): that is the caller's policy, merge() cannot tell.
TensorMoments merge(const TensorMoments& a, const TensorMoments& b);

// The logged value of a LogTensorStats statistic. Throws std::invalid_argument for a
// LogFp8TensorStats kind.
double value(const TensorMoments& m, StatKind kind);

// TE's max_blockwise_dynamic_range of a row-major rows x cols matrix x: dims 1 cuts each row into
// blocks of block_size consecutive elements (the last block of a row partial when cols is not a
// multiple), dims 2 cuts the matrix into block_size x block_size tiles (partial at the right and
// bottom edges). Each block with a nonzero value gives log2(its amax) - log2(its smallest nonzero
// |x|); the result is the largest over blocks (0 when no block has a nonzero value; NaN when a
// block holds NaN). Throws std::invalid_argument for rows * cols != x.size(), block_size < 1 or
// dims other than 1 and 2.
double max_blockwise_dynamic_range(std::span<const float> x, int64_t rows, int64_t cols,
                                   int block_size, int dims);

// What the LogFp8TensorStats statistics of one quantized tensor need. Same fixed-layout rule as
// TensorMoments (int64_t and double only, no padding) and the same size: the executors keep one
// 88-byte record per statistics slot, a TensorMoments or a QuantizedMoments as the slot's
// plan::StatRecordKind says (as_record / as_quantized reinterpret one as the other, bit for bit).
// templates/quant_stats.cuh writes this layout. Default-constructed is merge()'s identity.
struct QuantizedMoments {
  int64_t count = 0;
  int64_t underflows = 0;  // x != 0 but its quantized value is 0
  int64_t overflows = 0;   // |x| > fp8_max * scale_inv (per-tensor delayed scale only, see below)
  double sq_err = 0;       // sum of (x - dequantized)^2
  double scale_inv_min = std::numeric_limits<double>::infinity();
  double scale_inv_max = -std::numeric_limits<double>::infinity();
  // Per-block statistics (block-scaled casts; 0 for a per-tensor scale). Only real blocks count:
  // a partial last block is a block, the padding of a scale tensor's layout never is.
  int64_t blocks = 0;
  int64_t underflow_blocks = 0;      // blocks with at least one underflow
  int64_t scaled_blocks = 0;         // blocks whose amax is finite and nonzero
  double log2_scale_inv_sum = 0;     // over the scaled blocks: sum of log2(scale_inv)
  double log2_scale_inv_sq_sum = 0;  // and of its square
};
static_assert(std::is_standard_layout_v<QuantizedMoments> &&
              std::is_trivially_copyable_v<QuantizedMoments> &&
              sizeof(QuantizedMoments) == sizeof(TensorMoments));

// The executor record of a Quantized slot, read as what it is, and back.
QuantizedMoments as_quantized(const TensorMoments& record);
TensorMoments as_record(const QuantizedMoments& moments);

// The quantization statistics of x given its dequantized copy (dequant(q), element for element:
// the caller applies the FP8 rounding and scale, so this library stays free of the runtime's
// numerics) and the scale_inv values the quantizer used: one for a per-tensor scale, one per real
// block for block scaling. The caller passes only the real blocks: TE counts the padding blocks of
// MXFP8/NVFP4 scale tensors too and reports scale_inv_min 0; we do not take padding at all.
// Overflows are counted only with one scale_inv (delayed scaling, where the scale comes from an
// older amax): a scale derived from this tensor's amax (current or block scaling) cannot overflow,
// and with several scale_invs the element-to-block map is not known here. Throws
// std::invalid_argument when x and dequantized differ in size or fp8_max is not positive.
QuantizedMoments quantized_moments(std::span<const float> x, std::span<const float> dequantized,
                                   std::span<const float> scale_invs, double fp8_max);

// Counts and sums add; scale_inv min/max combine by min/max. Same weight rule as the
// TensorMoments merge (the caller counts a weight once per iteration).
QuantizedMoments merge(const QuantizedMoments& a, const QuantizedMoments& b);

// The logged value of a LogFp8TensorStats statistic: underflows% = 100 * underflows / count,
// overflows% likewise, mse = sq_err / count, scale_inv_min/max as merged; underflow_blocks% =
// 100 * underflow_blocks / blocks, scale_inv_log2_min/max = log2 of scale_inv_min/max,
// scale_inv_log2_mean/std over the scaled blocks (NaN without any). Throws
// std::invalid_argument for a LogTensorStats kind and for ScaleExponentHistogram (several values:
// ExponentHistogram below).
double value(const QuantizedMoments& m, StatKind kind);

// The scale-exponent histogram of a block cast (opfuse's `scale_exponent_histogram`; TE's users
// ask for the distribution of the scale factors, not only their range, TE#2801): per real block,
// the binade of its scale_inv. Bin b counts the blocks whose fp32 scale_inv has the biased
// exponent field b, that is scale_inv in [2^(b-127), 2^(b-126)): under power-of-2 scales (MXFP8's
// E8M0, Float8BlockScaling's default) exactly the blocks with scale_inv = 2^(b - 127). Bin 0 holds
// 2^-127 and below (E8M0's smallest scale, and FP32 subnormals). Blocks of zeros have no scale to
// speak of and are not counted; blocks whose amax is NaN or Inf go to kNonFiniteBin. So the bins
// add up to the blocks with a nonzero amax.
//
// On the executors the 256 int64 counts ride in kExponentHistogramRecords records of 88 bytes
// (11 counts each, the last 8 counts unused) right after the Quantized record of the same cast
// (plan::StatSlot::exponent_histogram): the record layout stays one size.
inline constexpr int kExponentBins = 256;
inline constexpr int kNonFiniteBin = 255;
inline constexpr int kCountsPerRecord = 11;
inline constexpr int kExponentHistogramRecords =
    (kExponentBins + kCountsPerRecord - 1) / kCountsPerRecord;  // 24

struct ExponentHistogram {
  int64_t bins[kExponentBins] = {};
  friend bool operator==(const ExponentHistogram&, const ExponentHistogram&) = default;
};

// The bin of a block with amax `amax` cast with `scale_inv`; -1 for a block of zeros.
int exponent_bin(float amax, float scale_inv);
// A bin's suffix of the logged statistic: "e-12" (2^-12), "e0", "e3", "e-127" (bin 0: 2^-127 and
// below), "nonfinite" (kNonFiniteBin).
std::string exponent_bin_name(int bin);
// The bin named `name` (exponent_bin_name's inverse); nullopt for any other text.
std::optional<int> parse_exponent_bin(std::string_view name);

// The histogram from its executor records (`records` holds kExponentHistogramRecords records,
// read as int64 counts), and back.
ExponentHistogram histogram_of(std::span<const TensorMoments> records);
void histogram_to_records(const ExponentHistogram& h, std::span<TensorMoments> records);
// Bins add (micro-batches; a weight counts once per iteration, the caller's policy).
ExponentHistogram merge(const ExponentHistogram& a, const ExponentHistogram& b);

}  // namespace opfuse::debug
