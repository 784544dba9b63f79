#include "jit/cubin_info.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace opfuse::jit {

namespace {

// ELF64 constants (System V gABI) and the CUDA ones (EM_CUDA, STO_CUDA_ENTRY).
constexpr std::size_t kElfHeaderSize = 64;
constexpr std::size_t kSectionHeaderSize = 64;
constexpr std::size_t kSymbolSize = 24;
constexpr unsigned char kElfClass64 = 2;
constexpr unsigned char kElfLittleEndian = 1;
constexpr std::uint64_t kMachineCuda = 190;
constexpr std::uint64_t kSectionTypeSymbolTable = 2;
constexpr std::uint64_t kSectionIndexExtended = 0xffff;  // SHN_XINDEX: the index is elsewhere
constexpr unsigned kSymbolTypeFunction = 2;
constexpr unsigned kSymbolOtherCudaEntry = 0x10;

// .nv.info records: 1 byte format, 1 byte attribute, 2 bytes (a value, or the payload size).
constexpr std::size_t kRecordHeaderSize = 4;
constexpr unsigned kFormatNoValue = 0x01;
constexpr unsigned kFormatByteValue = 0x02;
constexpr unsigned kFormatHalfValue = 0x03;
constexpr unsigned kFormatSizedValue = 0x04;
constexpr unsigned kAttributeFrameSize = 0x11;
constexpr unsigned kAttributeMinStackSize = 0x12;
constexpr unsigned kAttributeRegisterCount = 0x2f;
// Per-entry records in `.nv.info.<function>`: the parameter bank (symbol, offset, size), each
// parameter (index, ordinal, offset, flags with the size in bits 18..31) and the bank's size.
constexpr unsigned kAttributeParamCbank = 0x0a;
constexpr unsigned kAttributeKparamInfo = 0x17;
constexpr unsigned kAttributeCbankParamSize = 0x19;
constexpr unsigned kKparamSizeShift = 18;
constexpr std::uint64_t kKparamSizeMask = 0x3fff;

// A bounds-checked little-endian view: every read names what it reads, for the error message.
class ByteView {
 public:
  explicit ByteView(std::span<const char> bytes) : bytes_(bytes) {}

  std::size_t size() const { return bytes_.size(); }

  ByteView slice(std::uint64_t offset, std::uint64_t size, std::string_view what) const {
    if (offset > bytes_.size() || size > bytes_.size() - offset) {
      throw CubinFormatError(fmt::format("{} ({} bytes at offset {}) lies outside its {} bytes",
                                         what, size, offset, bytes_.size()));
    }
    return ByteView(bytes_.subspan(offset, size));
  }

  std::uint64_t unsigned_at(std::uint64_t offset, std::size_t width, std::string_view what) const {
    const ByteView field = slice(offset, width, what);
    std::uint64_t value = 0;
    for (std::size_t i = width; i-- > 0;) {
      value = (value << 8) | static_cast<unsigned char>(field.bytes_[i]);
    }
    return value;
  }

  // The NUL-terminated string at `offset`; the NUL must lie inside the view.
  std::string string_at(std::uint64_t offset, std::string_view what) const {
    const ByteView rest =
        slice(offset, bytes_.size() - std::min<std::uint64_t>(offset, size()), what);
    const auto end = std::find(rest.bytes_.begin(), rest.bytes_.end(), '\0');
    if (end == rest.bytes_.end()) throw CubinFormatError(fmt::format("{} is not terminated", what));
    return {rest.bytes_.begin(), end};
  }

 private:
  std::span<const char> bytes_;
};

struct SectionHeader {
  std::uint64_t name_offset = 0;
  std::uint64_t type = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint64_t link = 0;
};

SectionHeader read_section_header(const ByteView& file, std::uint64_t table_offset,
                                  std::uint64_t entry_size, std::uint64_t index) {
  // table_offset and entry_size were checked against the file size, so this cannot overflow.
  const ByteView header = file.slice(table_offset + index * entry_size, kSectionHeaderSize,
                                     fmt::format("section header {}", index));
  SectionHeader section;
  section.name_offset = header.unsigned_at(0, 4, "sh_name");
  section.type = header.unsigned_at(4, 4, "sh_type");
  section.offset = header.unsigned_at(24, 8, "sh_offset");
  section.size = header.unsigned_at(32, 8, "sh_size");
  section.link = header.unsigned_at(40, 4, "sh_link");
  return section;
}

int checked_int(std::uint64_t value, std::string_view what) {
  if (value > static_cast<std::uint64_t>(INT_MAX)) {
    throw CubinFormatError(fmt::format("{} value {} is out of range", what, value));
  }
  return static_cast<int>(value);
}

class CubinReader {
 public:
  explicit CubinReader(std::span<const char> cubin) : file_(cubin) {}

  CubinInfo read() {
    read_section_headers();
    read_function_symbols();
    for (const SectionHeader& section : sections_) {
      const std::string name = section_name(section);
      if (name == ".nv.info" || name.starts_with(".nv.info.")) read_info_records(section, name);
    }
    for (CubinFunction& function : info_.functions) {
      std::sort(function.params.begin(), function.params.end(),
                [](const CubinParam& a, const CubinParam& b) { return a.ordinal < b.ordinal; });
    }
    return std::move(info_);
  }

 private:
  void read_section_headers() {
    const ByteView header = file_.slice(0, kElfHeaderSize, "ELF header");
    if (header.unsigned_at(0, 4, "ELF magic") != 0x464c457fU) {
      throw CubinFormatError("not an ELF file (bad magic)");
    }
    if (header.unsigned_at(4, 1, "EI_CLASS") != kElfClass64 ||
        header.unsigned_at(5, 1, "EI_DATA") != kElfLittleEndian) {
      throw CubinFormatError("not a 64-bit little-endian ELF file");
    }
    const std::uint64_t machine = header.unsigned_at(18, 2, "e_machine");
    if (machine != kMachineCuda) {
      throw CubinFormatError(
          fmt::format("e_machine is {}, not EM_CUDA ({})", machine, kMachineCuda));
    }
    const std::uint64_t table_offset = header.unsigned_at(0x28, 8, "e_shoff");
    const std::uint64_t entry_size = header.unsigned_at(0x3a, 2, "e_shentsize");
    std::uint64_t count = header.unsigned_at(0x3c, 2, "e_shnum");
    std::uint64_t names_index = header.unsigned_at(0x3e, 2, "e_shstrndx");
    if (entry_size < kSectionHeaderSize) {
      throw CubinFormatError(fmt::format("e_shentsize {} is too small", entry_size));
    }
    file_.slice(table_offset, entry_size, "section header table");
    // Extended numbering: past 0xff00 sections the real values live in section header 0.
    const SectionHeader first = read_section_header(file_, table_offset, entry_size, 0);
    if (count == 0) count = first.size;
    if (names_index == kSectionIndexExtended) names_index = first.link;
    if (count > (file_.size() - table_offset) / entry_size) {
      throw CubinFormatError(fmt::format("{} section headers do not fit in the file", count));
    }
    sections_.reserve(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      sections_.push_back(read_section_header(file_, table_offset, entry_size, i));
    }
    if (names_index >= sections_.size()) {
      throw CubinFormatError(fmt::format("e_shstrndx {} is not a section", names_index));
    }
    section_names_ = contents(sections_[names_index], "section name table");
  }

  ByteView contents(const SectionHeader& section, std::string_view what) const {
    return file_.slice(section.offset, section.size, what);
  }

  std::string section_name(const SectionHeader& section) const {
    return section_names_->string_at(section.name_offset, "section name");
  }

  void read_function_symbols() {
    const auto table = std::find_if(sections_.begin(), sections_.end(), [](const auto& section) {
      return section.type == kSectionTypeSymbolTable;
    });
    if (table == sections_.end()) throw CubinFormatError("no symbol table");
    if (table->link >= sections_.size()) {
      throw CubinFormatError(fmt::format("symbol table links to section {}", table->link));
    }
    const ByteView symbols = contents(*table, "symbol table");
    const ByteView names = contents(sections_[table->link], "symbol name table");
    for (std::uint64_t index = 0; index < symbols.size() / kSymbolSize; ++index) {
      const ByteView symbol = symbols.slice(index * kSymbolSize, kSymbolSize, "symbol");
      const std::uint64_t type = symbol.unsigned_at(4, 1, "st_info") & 0xf;
      if (type != kSymbolTypeFunction) continue;
      CubinFunction function;
      function.name = names.string_at(symbol.unsigned_at(0, 4, "st_name"), "symbol name");
      function.is_entry = (symbol.unsigned_at(5, 1, "st_other") & kSymbolOtherCudaEntry) != 0;
      function_by_symbol_[index] = info_.functions.size();
      function_by_name_[function.name] = info_.functions.size();
      info_.functions.push_back(std::move(function));
    }
  }

  // EIATTR records of one .nv.info section: the usage records carry [symbol index, value]; a
  // `.nv.info.<function>` section also holds that function's parameter records.
  void read_info_records(const SectionHeader& section, const std::string& name) {
    const ByteView records = contents(section, name);
    CubinFunction* owner = nullptr;
    if (name.starts_with(".nv.info.")) {
      const auto found = function_by_name_.find(name.substr(std::string_view(".nv.info.").size()));
      if (found == function_by_name_.end()) {
        throw CubinFormatError(fmt::format("{} names no function of the symbol table", name));
      }
      owner = &info_.functions[found->second];
    }
    std::uint64_t offset = 0;
    while (offset < records.size()) {
      const std::uint64_t format = records.unsigned_at(offset, 1, "EIATTR format");
      const std::uint64_t attribute = records.unsigned_at(offset + 1, 1, "EIATTR attribute");
      const std::uint64_t half = records.unsigned_at(offset + 2, 2, "EIATTR size");
      std::uint64_t payload_size = 0;
      if (format == kFormatSizedValue) {
        payload_size = half;
      } else if (format != kFormatNoValue && format != kFormatByteValue &&
                 format != kFormatHalfValue) {
        throw CubinFormatError(
            fmt::format("{}: unknown EIATTR format {:#x} at byte {}", name, format, offset));
      }
      const ByteView payload =
          records.slice(offset + kRecordHeaderSize, payload_size, fmt::format("{} record", name));
      if (format == kFormatSizedValue) record_usage(attribute, payload, name);
      if (owner != nullptr) record_param(*owner, format, attribute, half, payload, name);
      offset += kRecordHeaderSize + payload_size;
    }
  }

  void record_usage(std::uint64_t attribute, const ByteView& payload, const std::string& name) {
    if (attribute != kAttributeRegisterCount && attribute != kAttributeFrameSize &&
        attribute != kAttributeMinStackSize) {
      return;
    }
    if (payload.size() != 8) {
      throw CubinFormatError(
          fmt::format("{}: EIATTR {:#x} has {} bytes, not 8", name, attribute, payload.size()));
    }
    const std::uint64_t symbol = payload.unsigned_at(0, 4, "EIATTR symbol");
    const auto function = function_by_symbol_.find(symbol);
    if (function == function_by_symbol_.end()) {
      throw CubinFormatError(
          fmt::format("{}: EIATTR {:#x} names symbol {}, not a function", name, attribute, symbol));
    }
    CubinFunction& usage = info_.functions[function->second];
    const int value = checked_int(payload.unsigned_at(4, 4, "EIATTR value"), "EIATTR");
    if (attribute == kAttributeRegisterCount) usage.registers = value;
    if (attribute == kAttributeFrameSize) usage.frame_bytes = value;
    if (attribute == kAttributeMinStackSize) usage.stack_bytes = value;
  }

  void record_param(CubinFunction& function, std::uint64_t format, std::uint64_t attribute,
                    std::uint64_t half, const ByteView& payload, const std::string& name) {
    if (attribute == kAttributeCbankParamSize && format == kFormatHalfValue) {
      function.params_bytes = checked_int(half, "EIATTR_CBANK_PARAM_SIZE");
    } else if (attribute == kAttributeParamCbank && format == kFormatSizedValue) {
      expect_payload(payload, 8, attribute, name);
      // Why only when unset: EIATTR_CBANK_PARAM_SIZE says the same and wins when present.
      if (function.params_bytes < 0) {
        function.params_bytes = checked_int(payload.unsigned_at(6, 2, "bank size"), "PARAM_CBANK");
      }
    } else if (attribute == kAttributeKparamInfo && format == kFormatSizedValue) {
      expect_payload(payload, 12, attribute, name);
      CubinParam param;
      param.ordinal = checked_int(payload.unsigned_at(4, 2, "ordinal"), "KPARAM_INFO");
      param.offset = checked_int(payload.unsigned_at(6, 2, "offset"), "KPARAM_INFO");
      const std::uint64_t flags = payload.unsigned_at(8, 4, "KPARAM_INFO flags");
      param.bytes = checked_int((flags >> kKparamSizeShift) & kKparamSizeMask, "KPARAM_INFO");
      function.params.push_back(param);
    }
  }

  static void expect_payload(const ByteView& payload, std::size_t bytes, std::uint64_t attribute,
                             const std::string& name) {
    if (payload.size() != bytes) {
      throw CubinFormatError(fmt::format("{}: EIATTR {:#x} has {} bytes, not {}", name, attribute,
                                         payload.size(), bytes));
    }
  }

  ByteView file_;
  std::vector<SectionHeader> sections_;
  std::optional<ByteView> section_names_;
  std::unordered_map<std::uint64_t, std::size_t> function_by_symbol_;
  std::unordered_map<std::string, std::size_t> function_by_name_;
  CubinInfo info_;
};

}  // namespace

std::vector<CubinFunction> CubinInfo::entry_functions() const {
  std::vector<CubinFunction> entries;
  std::copy_if(functions.begin(), functions.end(), std::back_inserter(entries),
               [](const CubinFunction& function) { return function.is_entry; });
  return entries;
}

CubinInfo read_cubin_info(std::span<const char> cubin) { return CubinReader(cubin).read(); }

}  // namespace opfuse::jit
