//===- Data.cpp - A deterministic byte-level token stream -----------------===//

#include "Data.h"

#include "meshplan/Support/Hash.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace meshplan::trainer {

Result<TextData> TextData::load(const std::string &path) {
  TextData data;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end;
         it.increment(ec)) {
      if (!it->is_regular_file(ec))
        continue;
      std::string ext = it->path().extension().string();
      if (ext == ".md" || ext == ".txt")
        data.paths.push_back(it->path().string());
    }
    if (ec)
      return makeError(path + ": " + ec.message());
    std::sort(data.paths.begin(), data.paths.end());
    if (data.paths.empty())
      return makeError(path + ": no .md or .txt files in this directory");
  } else if (fs::is_regular_file(path, ec)) {
    data.paths.push_back(path);
  } else {
    return makeError(path + ": no such file or directory");
  }
  for (const std::string &p : data.paths) {
    std::ifstream in(p, std::ios::binary);
    if (!in)
      return makeError(p + ": cannot be read");
    std::ostringstream s;
    s << in.rdbuf();
    data.text += s.str();
    data.text += '\n';
  }
  return data;
}

void TextData::fill(uint64_t seed, int64_t step, int64_t microbatch,
                    int64_t first, int64_t batch, int64_t seqLen,
                    std::vector<int32_t> &tokens,
                    std::vector<int32_t> &targets) const {
  tokens.resize(size_t(batch * seqLen));
  targets.resize(size_t(batch * seqLen));
  uint64_t windows = uint64_t(size() - seqLen);
  for (int64_t b = 0; b < batch; ++b) {
    uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(step)) ^
                              (uint64_t(microbatch) << 32)) ^
                   uint64_t(first + b);
    uint64_t start = splitmix64(key) % windows;
    for (int64_t t = 0; t < seqLen; ++t) {
      tokens[size_t(b * seqLen + t)] =
          static_cast<unsigned char>(text[size_t(start) + size_t(t)]);
      targets[size_t(b * seqLen + t)] =
          static_cast<unsigned char>(text[size_t(start) + size_t(t) + 1]);
    }
  }
}

} // namespace meshplan::trainer
