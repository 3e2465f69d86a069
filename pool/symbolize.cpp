#include "symbolize.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace poolshim {

namespace {

std::string demangle(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) return name;
  std::string s(out);
  std::free(out);
  return s;
}

std::string executable_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = '\0';
  return buf;
}

}  // namespace

// The function symbols of one ELF file: (virtual address, size, name), sorted by address.
struct Symbolizer::Module {
  struct Symbol {
    std::uint64_t start;
    std::uint64_t size;
    std::string name;
  };
  std::vector<Symbol> symbols;

  explicit Module(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    Elf64_Ehdr eh{};
    if (!in.read(reinterpret_cast<char*>(&eh), sizeof eh)) return;
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) return;
    std::vector<Elf64_Shdr> sections(eh.e_shnum);
    in.seekg(static_cast<std::streamoff>(eh.e_shoff));
    if (!in.read(reinterpret_cast<char*>(sections.data()),
                 static_cast<std::streamsize>(sections.size() * sizeof(Elf64_Shdr)))) {
      return;
    }
    // Prefer the full symbol table; fall back to the dynamic one.
    for (Elf64_Word kind :
         {static_cast<Elf64_Word>(SHT_SYMTAB), static_cast<Elf64_Word>(SHT_DYNSYM)}) {
      for (const auto& sh : sections) {
        if (sh.sh_type != kind || sh.sh_link >= sections.size() || sh.sh_entsize == 0) continue;
        const Elf64_Shdr& strtab = sections[sh.sh_link];
        std::vector<char> names(strtab.sh_size);
        in.seekg(static_cast<std::streamoff>(strtab.sh_offset));
        if (!in.read(names.data(), static_cast<std::streamsize>(names.size()))) continue;
        std::vector<Elf64_Sym> syms(sh.sh_size / sizeof(Elf64_Sym));
        in.seekg(static_cast<std::streamoff>(sh.sh_offset));
        if (!in.read(reinterpret_cast<char*>(syms.data()),
                     static_cast<std::streamsize>(syms.size() * sizeof(Elf64_Sym)))) {
          continue;
        }
        for (const auto& s : syms) {
          if (ELF64_ST_TYPE(s.st_info) != STT_FUNC || s.st_value == 0 ||
              s.st_name >= names.size()) {
            continue;
          }
          symbols.push_back({s.st_value, s.st_size, std::string(&names[s.st_name])});
        }
      }
      if (!symbols.empty()) break;
    }
    std::sort(symbols.begin(), symbols.end(),
              [](const Symbol& a, const Symbol& b) { return a.start < b.start; });
  }

  const Symbol* find(std::uint64_t vaddr) const {
    auto it = std::upper_bound(symbols.begin(), symbols.end(), vaddr,
                               [](std::uint64_t v, const Symbol& s) { return v < s.start; });
    if (it == symbols.begin()) return nullptr;
    --it;
    if (it->size != 0 && vaddr >= it->start + it->size) return nullptr;
    return &*it;
  }
};

Symbolizer::Symbolizer() = default;
Symbolizer::~Symbolizer() = default;

const Symbolizer::Module* Symbolizer::module(const std::string& path) {
  auto it = modules_.find(path);
  if (it == modules_.end()) it = modules_.emplace(path, std::make_unique<Module>(path)).first;
  return it->second.get();
}

Frame Symbolizer::symbolize(std::uintptr_t address) {
  Frame f;
  f.address = address;
  const std::uintptr_t inside = address > 0 ? address - 1 : address;  // the call, not the return
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(inside), &info, reinterpret_cast<void**>(&map),
              RTLD_DL_LINKMAP) == 0 ||
      map == nullptr) {
    return f;
  }
  f.module = (info.dli_fname != nullptr && info.dli_fname[0] != '\0') ? info.dli_fname : "";
  if (f.module.empty() || map->l_name == nullptr || map->l_name[0] == '\0') {
    f.module = executable_path();  // the main program's link map has an empty name
  }
  const std::uint64_t vaddr = inside - map->l_addr;
  f.offset = vaddr;
  if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
    f.function = demangle(info.dli_sname);
    f.function_offset = inside - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
    return f;
  }
  if (const Module* m = module(f.module)) {
    if (const auto* s = m->find(vaddr)) {
      f.function = demangle(s->name.c_str());
      f.function_offset = vaddr - s->start;
    }
  }
  return f;
}

std::string describe_frame(const Frame& f) {
  char buf[64];
  const std::string module = f.module.empty() ? "?" : f.module;
  if (!f.function.empty()) {
    std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(f.function_offset));
    return f.function + buf + " (" + module + ")";
  }
  std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(f.offset));
  return "? (" + module + buf + ")";
}

}  // namespace poolshim
