#include "comm/communicator.h"

#include <fmt/format.h>

#include <cstring>

#include "comm/nccl_library.h"
#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "opfuse/error.h"

namespace opfuse::comm {

static_assert(sizeof(UniqueId::bytes) == sizeof(ncclUniqueId),
              "UniqueId must hold exactly ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES)");
static_assert(sizeof(UniqueId::bytes) == NCCL_UNIQUE_ID_BYTES);

namespace {

const char* result_name(ncclResult_t status) {
  switch (status) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "an unknown ncclResult_t";
  }
}

// What to check for each kind of failure; NCCL's own log is the next step for all of them.
const char* result_hint(ncclResult_t status) {
  switch (status) {
    case ncclSystemError:
    case ncclRemoteError:
      return "Another rank failed or exited, or the connection between the ranks broke (a "
             "socket, shared memory, the network): check the other ranks' output first. ";
    case ncclUnhandledCudaError:
      return "A CUDA call inside NCCL failed: the GPU, its driver, or a faulted CUDA context. ";
    case ncclInvalidArgument:
      return "NCCL rejected an argument: the buffers must be device memory on this rank's GPU, "
             "the stream must belong to it, and the root and counts must be in range. ";
    case ncclInvalidUsage:
      return "NCCL was called out of order (e.g. an unbalanced group, or a communicator used "
             "after a failure). ";
    default:
      return "";
  }
}

// The message of a failed NCCL call. `comm` may be null (ncclGetUniqueId, a failed init): NCCL's
// last-error text is then the process's.
std::string nccl_error_message(const NcclLibrary& nccl, std::string_view call, ncclResult_t status,
                               ncclComm_t comm, std::string_view who) {
  const char* last = nccl.get_last_error(comm);
  const std::string last_text =
      last == nullptr || *last == '\0' ? std::string() : fmt::format("; NCCL says: {}", last);
  return fmt::format(
      "{} failed{}: {} ({}){}. {}Run with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,COLL) for "
      "NCCL's log (NCCL {}, {})",
      call, who, result_name(status), nccl.get_error_string(status), last_text, result_hint(status),
      nccl_version_text(nccl.version), nccl.path);
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

// NCCL's dtype for `dtype`. `reduction` names the collective when it reduces (FP8 is refused
// there), nullptr for a copy (FP8 moves as bytes).
ncclDataType_t nccl_dtype(plan::DType dtype, const char* reduction) {
  switch (dtype) {
    case plan::DType::BF16:
      return ncclBfloat16;
    case plan::DType::FP16:
      return ncclFloat16;
    case plan::DType::FP32:
      return ncclFloat32;
    case plan::DType::E4M3:
    case plan::DType::E5M2:
      if (reduction != nullptr) {
        throw UsageError(fmt::format(
            "{} of {} values is not supported: each rank's FP8 values carry their own scale, so "
            "their sum or max means nothing. Reduce the BF16/FP32 values and quantize after",
            reduction, plan::dtype_name(dtype)));
      }
      return ncclUint8;
    case plan::DType::E2M1:  // packed codes of a quantized boundary, which TP refuses
    case plan::DType::E8M0:
      break;
  }
  throw UsageError(
      fmt::format("dtype {} cannot be given to a collective", plan::dtype_name(dtype)));
}

}  // namespace

UniqueId new_unique_id() {
  const NcclLibrary& nccl = nccl_library();
  ncclUniqueId raw{};
  if (const ncclResult_t status = nccl.get_unique_id(&raw); status != ncclSuccess) {
    throw CudaError(nccl_error_message(nccl, "ncclGetUniqueId", status, nullptr, ""), "NCCL",
                    status);
  }
  UniqueId id;
  std::memcpy(id.bytes.data(), raw.internal, id.bytes.size());
  return id;
}

std::string unique_id_hex(const UniqueId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(id.bytes.size() * 2);
  for (const char c : id.bytes) {
    const auto byte = static_cast<unsigned char>(c);
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 0xf];
  }
  return hex;
}

UniqueId unique_id_from_hex(std::string_view hex) {
  UniqueId id;
  if (hex.size() != id.bytes.size() * 2) {
    throw UsageError(fmt::format(
        "not an NCCL unique id: expected {} hex digits, got {} characters; pass the text "
        "unique_id_hex() made, unchanged",
        id.bytes.size() * 2, hex.size()));
  }
  const auto digit = [&](size_t i) {
    const char c = hex[i];
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw UsageError(
        fmt::format("not an NCCL unique id: character {} ('{}') is not a hex digit; pass the text "
                    "unique_id_hex() made, unchanged",
                    i, c));
  };
  for (size_t i = 0; i < id.bytes.size(); ++i) {
    id.bytes[i] = static_cast<char>(digit(2 * i) << 4 | digit(2 * i + 1));
  }
  return id;
}

// --- Communicator
// ---------------------------------------------------------------------------------

Communicator::Communicator(const UniqueId& id, int rank, int size) : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw UsageError(fmt::format(
        "bad communicator rank {} of size {}: the size must be >= 1 and the rank in [0, size); "
        "check the launcher's OPFUSE_RANK and OPFUSE_WORLD_SIZE",
        rank, size));
  }
  std::string why;
  if (!gpu::gpu_available(&why)) {
    throw UsageError(
        fmt::format("cannot make an NCCL communicator (rank {} of {}): {}", rank, size, why));
  }
  const NcclLibrary& nccl = nccl_library();
  // NCCL has its own copy of the CUDA runtime and takes the device from the thread's current
  // context: setting the device again makes the primary context of this runtime's device current,
  // so both agree even if nothing has touched the GPU yet on this thread.
  int device = 0;
  OPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  OPFUSE_CUDA_CHECK(cudaSetDevice(device));

  ncclUniqueId raw{};
  std::memcpy(raw.internal, id.bytes.data(), id.bytes.size());
  ncclComm_t comm = nullptr;
  const ncclResult_t status = nccl.comm_init_rank(&comm, size, raw, rank);
  if (status != ncclSuccess) {
    std::string message =
        nccl_error_message(nccl, "ncclCommInitRank", status, comm,
                           fmt::format(" on rank {} of {} (GPU {})", rank, size, device));
    // NCCL frees a communicator whose blocking init failed; older releases may leave it.
    if (comm != nullptr) nccl.comm_abort(comm);
    throw CudaError(message, "NCCL", status);
  }
  comm_ = comm;
}

Communicator::~Communicator() {
  if (comm_ == nullptr) return;
  const NcclLibrary& nccl = nccl_library();
  bool abort = failed_;
  ncclResult_t async = ncclSuccess;
  if (!abort && (nccl.comm_get_async_error(comm_, &async) != ncclSuccess ||
                 (async != ncclSuccess && async != ncclInProgress))) {
    abort = true;
  }
  if (!abort) {
    try {
      gpu::throw_if_faulted();
    } catch (const ContextFaultError&) {
      abort = true;
    }
  }
  // Abort does not wait for the other ranks or for queued work, which may never finish after a
  // failure; destroy finishes this rank's queued collectives first.
  (void)(abort ? nccl.comm_abort(comm_) : nccl.comm_destroy(comm_));
}

void Communicator::fail(const char* call, int status) const {
  failed_ = true;
  const NcclLibrary& nccl = nccl_library();
  const auto result = static_cast<ncclResult_t>(status);
  throw CudaError(
      nccl_error_message(nccl, call, result, comm_, fmt::format(" on rank {} of {}", rank_, size_)),
      "NCCL", status);
}

void Communicator::all_reduce(const void* send, void* recv, size_t count, plan::DType dtype,
                              ReduceOp op, cudaStream_t stream) {
  const ncclDataType_t type = nccl_dtype(dtype, "all_reduce");
  if (count == 0) return;
  gpu::throw_if_faulted();
  const ncclResult_t status =
      nccl_library().all_reduce(send, recv, count, type, nccl_op(op), comm_, stream);
  if (status != ncclSuccess) fail("ncclAllReduce", status);
}

void Communicator::all_gather(const void* send, void* recv, size_t send_count, plan::DType dtype,
                              cudaStream_t stream) {
  const ncclDataType_t type = nccl_dtype(dtype, nullptr);
  if (send_count == 0) return;
  gpu::throw_if_faulted();
  const ncclResult_t status =
      nccl_library().all_gather(send, recv, send_count, type, comm_, stream);
  if (status != ncclSuccess) fail("ncclAllGather", status);
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count,
                                  plan::DType dtype, ReduceOp op, cudaStream_t stream) {
  const ncclDataType_t type = nccl_dtype(dtype, "reduce_scatter");
  if (recv_count == 0) return;
  gpu::throw_if_faulted();
  const ncclResult_t status =
      nccl_library().reduce_scatter(send, recv, recv_count, type, nccl_op(op), comm_, stream);
  if (status != ncclSuccess) fail("ncclReduceScatter", status);
}

void Communicator::broadcast(const void* send, void* recv, size_t count, plan::DType dtype,
                             int root, cudaStream_t stream) {
  const ncclDataType_t type = nccl_dtype(dtype, nullptr);
  if (root < 0 || root >= size_) {
    throw UsageError(
        fmt::format("broadcast from root {} on a communicator of size {}: the root "
                    "must be a rank in [0, {})",
                    root, size_, size_));
  }
  if (count == 0) return;
  gpu::throw_if_faulted();
  const ncclResult_t status =
      nccl_library().broadcast(send, recv, count, type, root, comm_, stream);
  if (status != ncclSuccess) fail("ncclBroadcast", status);
}

void Communicator::group_start() {
  if (const ncclResult_t status = nccl_library().group_start(); status != ncclSuccess) {
    fail("ncclGroupStart", status);
  }
}

void Communicator::group_end() {
  if (const ncclResult_t status = nccl_library().group_end(); status != ncclSuccess) {
    fail("ncclGroupEnd", status);
  }
}

void Communicator::check_async() const {
  ncclResult_t async = ncclSuccess;
  if (const ncclResult_t status = nccl_library().comm_get_async_error(comm_, &async);
      status != ncclSuccess) {
    fail("ncclCommGetAsyncError", status);
  }
  // ncclInProgress belongs to non-blocking communicators still initialising; this one blocks.
  if (async != ncclSuccess && async != ncclInProgress) {
    failed_ = true;
    const NcclLibrary& nccl = nccl_library();
    throw CudaError(nccl_error_message(nccl, "the NCCL communicator (ncclCommGetAsyncError)", async,
                                       comm_, fmt::format(" on rank {} of {}", rank_, size_)),
                    "NCCL", async);
  }
}

// --- GroupScope ---------------------------------------------------------------------------------

GroupScope::GroupScope(Communicator& comm) : comm_(&comm) { comm.group_start(); }

GroupScope::~GroupScope() {
  if (!open_) return;
  try {
    comm_->group_end();
  } catch (const Error&) {
    // group_end marked the communicator failed; the exception that left the scope is the one
    // the caller sees.
  }
}

void GroupScope::end() {
  open_ = false;
  comm_->group_end();
}

}  // namespace opfuse::comm
