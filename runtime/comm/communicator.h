// The NCCL layer of tensor-parallel runs: one Communicator per process and GPU (a launcher starts
// one process per GPU; comm/bootstrap.h hands every rank the same UniqueId), and the collectives
// the parallel layers need.
//
// Stream order. Every collective enqueues on the given stream and returns at once; it runs after
// the work queued before it on that stream, and later work on the stream sees its result. The
// buffers must stay valid until it has run. The collectives can be captured in a CUDA graph
// (NCCL supports stream capture), so a captured step may contain them; the graph must then be
// launched by every rank, as the collectives themselves must be called by every rank in the same
// order with the same counts and dtypes (a mismatch hangs or corrupts, NCCL cannot detect it).
//
// NVLink multicast (NVLS). On a shared machine the caller keeps it off (NCCL_NVLS_ENABLE=0 in the
// environment before the first Communicator is made): multicast objects are a machine-wide
// resource. The communicator never changes the environment; NCCL reads it at init.
//
// NCCL is loaded at first use (comm/nccl_library.h): building a Communicator or a UniqueId on a
// machine without NCCL throws UsageError saying how to install it. This header does not include
// nccl.h.
//
// Not thread-safe: one thread at a time uses a Communicator (as NCCL requires of a communicator).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "plan/enums.h"

// nccl.h's communicator (ncclComm_t is `struct ncclComm*`), declared here so that users of this
// header need not find nccl.h.
struct ncclComm;

namespace opfuse::comm {

enum class ReduceOp : uint8_t { Sum, Max };

// ncclUniqueId's bytes: made by one rank, given to every rank of the communicator.
struct UniqueId {
  std::array<char, 128> bytes{};
  friend bool operator==(const UniqueId&, const UniqueId&) = default;
};

// A new id from ncclGetUniqueId (which also picks the network interface rank 0 listens on).
// Throws UsageError without NCCL, CudaError ("NCCL") when NCCL fails.
UniqueId new_unique_id();

// The id as 256 lower-case hex digits, and back. unique_id_from_hex takes upper or lower case and
// throws UsageError saying what is wrong with any other text.
std::string unique_id_hex(const UniqueId& id);
UniqueId unique_id_from_hex(std::string_view hex);

class Communicator {
 public:
  // ncclCommInitRank on the calling thread's current CUDA device (cudaSetDevice first). Blocks
  // until all `size` ranks have joined with the same id. Throws UsageError when size < 1 or rank
  // is outside [0, size) (checked before NCCL is loaded) or NCCL is missing; CudaError ("NCCL")
  // when the init fails.
  Communicator(const UniqueId& id, int rank, int size);
  // ncclCommDestroy, or ncclCommAbort (which does not wait for other ranks) when an operation of
  // this communicator failed, NCCL reports an asynchronous error, or the CUDA context has faulted
  // (gpu/cuda_check.h). Never throws.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&&) = delete;
  Communicator& operator=(Communicator&&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Counts are elements of `dtype`; a zero count is a no-op (no NCCL call). send == recv is the
  // in-place form (for all_gather: send == recv + rank * send_count elements; for
  // reduce_scatter: send + rank * recv_count == recv). Reductions take BF16, FP16 and FP32
  // (UsageError for E4M3/E5M2: each rank's FP8 values carry their own scale, so reduce the
  // values before quantizing); all_gather and broadcast move FP8 as bytes. Failures throw CudaError
  // ("NCCL") naming the call, NCCL's error and last-error text, the rank and size, and what to
  // check.

  // recv[i] = op over ranks of send[i], on every rank; count elements each.
  void all_reduce(const void* send, void* recv, size_t count, plan::DType dtype, ReduceOp op,
                  cudaStream_t stream);
  // recv (size * send_count elements) holds every rank's send, rank-major.
  void all_gather(const void* send, void* recv, size_t send_count, plan::DType dtype,
                  cudaStream_t stream);
  // send holds size * recv_count elements; rank r receives op over ranks of its block r.
  void reduce_scatter(const void* send, void* recv, size_t recv_count, plan::DType dtype,
                      ReduceOp op, cudaStream_t stream);
  // recv on every rank gets root's send (count elements; send is read on root only).
  void broadcast(const void* send, void* recv, size_t count, plan::DType dtype, int root,
                 cudaStream_t stream);

  // Brackets several collectives into one NCCL group (ncclGroupStart/ncclGroupEnd): NCCL fuses
  // them and launches at group_end, which reports errors of any call in the group. Prefer
  // GroupScope.
  void group_start();
  void group_end();

  // Throws CudaError ("NCCL", call "ncclCommGetAsyncError") when NCCL reports that this
  // communicator has failed (a peer died, the network broke): an error found after a collective
  // was enqueued. One cheap query; call it after a step or while waiting for one.
  void check_async() const;

 private:
  // Throws CudaError for a failed `call`, marking the communicator failed first.
  [[noreturn]] void fail(const char* call, int status) const;
  struct ncclComm* comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  // An NCCL call failed or an asynchronous error was seen: the destructor aborts.
  mutable bool failed_ = false;
};

// One NCCL group for the scope's lifetime:
//
//   { GroupScope group(comm); comm.all_gather(...); comm.reduce_scatter(...); group.end(); }
//
// end() closes the group and throws its error. The destructor closes a group that end() did not
// (an exception left the scope); it cannot throw, so an error there only marks the communicator
// failed (it aborts at destruction).
class GroupScope {
 public:
  explicit GroupScope(Communicator& comm);
  ~GroupScope();
  GroupScope(const GroupScope&) = delete;
  GroupScope& operator=(const GroupScope&) = delete;
  GroupScope(GroupScope&&) = delete;
  GroupScope& operator=(GroupScope&&) = delete;
  void end();

 private:
  Communicator* comm_;
  bool open_ = true;
};

}  // namespace opfuse::comm
