// Checkpoint (state) files: a training program's parameters and quantizer state (amax history,
// scale, scale_inv) with the step count, written atomically, versioned and checksummed. The GPU
// API fills a StateFile from device memory and loads one back; this file is pure host code.
// The byte layout is documented in docs/state_files.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cpu/quantizer_math.h"
#include "opfuse/error.h"
#include "plan/enums.h"
#include "plan/parallel.h"
#include "plan/plan.h"

namespace opfuse::api {

// A state file that cannot be read or written: unreadable, not a state file, from a newer
// opfuse, truncated, damaged, or an I/O failure while writing. The message names the file and
// says what to do. (A well-formed file that does not fit the program is a UsageError instead.)
class StateFileError : public Error {
 public:
  using Error::Error;
};

// One parameter, row-major, exactly as it sits in device memory: bytes.size() must equal
// numel(shape) * plan::dtype_bytes(dtype).
struct StateTensor {
  std::string name;
  plan::DType dtype = plan::DType::FP32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;
  // A tensor-parallel rank's shard of the parameter: how the whole one is cut (plan/parallel.h).
  plan::ShardSpec shard;
};

// One delayed-scaling quantizer; its history length is amax_history.size() (at least 1).
struct StateQuantizer {
  std::string name;
  cpu::DelayedScalingState state;
};

struct StateFile {
  std::string program;    // which sequence, e.g. "mlp.fuse:mlp"
  std::string recipe;     // the plan's recipe string of the recipe it trained with
  std::int64_t step = 0;  // training steps done (not compared by state_mismatches)
  // A tensor-parallel sequence's file holds one rank's shards (docs/parallel.md): which rank of
  // how many. A file loads only into the same rank of the same group size.
  int tp = 1;
  int rank = 0;
  std::vector<StateTensor> tensors;        // names unique within the file
  std::vector<StateQuantizer> quantizers;  // names unique within the file
  // The quantizer state alone (Session::save with StateParts::Quantizers; the header's
  // "contents": "quantizers"): no tensors. As `expected` of state_mismatches: the tensors are
  // not compared (a load of the quantizer state alone).
  bool quantizers_only = false;
};

// The format version this build writes and the newest it reads.
inline constexpr std::uint32_t kStateFileFormatVersion = 1;

// Writes `state` to `path` atomically (a reader sees the old file or the whole new one, never a
// part) and durably (fsync of the file and its directory). The directory must exist: it is not
// created, so a mistyped path fails instead of scattering checkpoints. Throws UsageError (nothing
// written) when `state` is malformed (duplicate or empty names, bytes that do not match the
// shape, an empty amax history, a negative step) and StateFileError when the write fails; the
// old file at `path`, if any, is then left as it was.
void write_state_file(const std::string& path, const StateFile& state);

// Reads and verifies the whole file (magic, version, size, checksum, header, payload bounds)
// before building the result, so a bad file throws StateFileError and returns nothing.
StateFile read_state_file(const std::string& path);

// Every reason `file` cannot be loaded into a program laid out like `expected`: program, recipe,
// the rank and group size of a tensor-parallel run,
// tensors (matched by name: missing, extra, dtype, shape) and quantizers (missing, extra, history
// length). Only the layout of `expected` is read (its bytes and amax values may be empty). Empty
// when the file fits. With expected.quantizers_only the tensors are not compared; a file with
// quantizers_only does not fit an `expected` without it (a full load needs the parameters).
std::vector<std::string> state_mismatches(const StateFile& file, const StateFile& expected);

// Throws UsageError listing every state_mismatches() reason, naming `path` (where `file` came
// from), when `file` does not fit `expected`.
void require_state_fits(const StateFile& file, const StateFile& expected, const std::string& path);

// The one-rank state of a tensor-parallel run from every rank's file (docs/parallel.md,
// "Checkpoints"): `ranks` are the files of ranks 0..tp-1 in any order, each with the same program,
// recipe, step, tensors and quantizers. Sharded tensors are joined (plan::join_shards); the others
// and the quantizers (whose amaxes every rank reduced over the group) must be identical on every
// rank, and are taken from rank 0, except each history's slot 0 (the amax of a step in progress,
// not reduced yet), which becomes the max over the ranks. The result has tp = 1 and `program` as
// given (empty: the files'). Throws UsageError naming the first problem (a missing or repeated
// rank, files of different runs, a replicated tensor that differs between ranks).
StateFile merge_state_shards(const std::vector<StateFile>& ranks, const std::string& program = {});

// The layout (bytes and amaxes left empty) of the state file that rank `rank` of `plan` saves and
// loads under the name `program`: every parameter in buffer order, with its dtype, the shape
// `shape_of` gives for its buffer and its cut over the ranks; every quantizer with its history
// length. Session::save and Session::load use it, and `fusec split-state` checks its files
// against it.
StateFile plan_state_layout(
    const plan::SequencePlan& plan, const std::string& program, int rank,
    const std::function<std::vector<std::int64_t>(const plan::Buffer&)>& shape_of);

// The inverse: tp rank files of `program` from a one-rank state (docs/parallel.md,
// "Checkpoints"), to continue a one-GPU run tensor-parallel. `shards` names every parameter of
// the tensor-parallel program with its cut (plan::ShardSpec; dim < 0: replicated, every rank
// holds the whole tensor). Rank r's file holds rank r's shard of each cut tensor
// (plan::take_shard), the others whole, and every quantizer as it is (each rank casts with the
// whole tensor's scale); program, tp and rank as given, recipe and step from `whole`. Throws
// UsageError, nothing returned, for a file that is already a rank's, tp < 2, a parameter the file
// lacks, a tensor that is not a parameter of the program, or a dimension that does not divide.
std::vector<StateFile> split_state_file(const StateFile& whole, int tp,
                                        const std::map<std::string, plan::ShardSpec>& shards,
                                        const std::string& program);

}  // namespace opfuse::api
