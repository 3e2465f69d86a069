// Turns return addresses into module + function + offset when a report is written (never on
// the hot path). Functions come from the dynamic symbol table (dladdr) or, for code that does
// not export them (an executable's own functions), from the module's ELF symbol table.
// File and line are left to tools with debug-info readers (addr2line, the report tool).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace poolshim {

struct Frame {
  std::uintptr_t address = 0;
  std::string module;        // path of the object file; empty when unknown
  std::uint64_t offset = 0;  // address - the module's load bias (what addr2line takes)
  std::string function;      // demangled; empty when unknown
  std::uint64_t function_offset = 0;
};

class Symbolizer {
 public:
  Symbolizer();
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  /// `address` is a return address: it is looked up one byte earlier, inside the call.
  Frame symbolize(std::uintptr_t address);

 private:
  struct Module;
  const Module* module(const std::string& path);
  std::map<std::string, std::unique_ptr<Module>> modules_;
};

/// "main+0x12 (/usr/bin/app)", or "0x7f00... (/usr/lib/libx.so+0x1234)" without a name.
std::string describe_frame(const Frame& f);

}  // namespace poolshim
