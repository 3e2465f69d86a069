// The lines of a text file, for tests that read what the worker wrote.
#pragma once

#include <fstream>
#include <string>
#include <vector>

namespace poolshim::testing {

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

}  // namespace poolshim::testing
