//===- DummyMain.cpp - run a fuzz target over files, without libFuzzer ----===//
//
// In a build without libFuzzer (no LLVM_USE_SANITIZE_COVERAGE) each fuzz
// target is a plain program: it runs LLVMFuzzerTestOneInput once on each
// file named (a directory: each file in it), so the inputs the fuzzers found
// stay regression tests of every build.
//
//===----------------------------------------------------------------------===//

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv);

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-')
      continue; // libFuzzer's flags mean nothing here
    if (!llvm::sys::fs::is_directory(argv[i])) {
      files.push_back(argv[i]);
      continue;
    }
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(argv[i], ec), end;
         it != end && !ec; it.increment(ec))
      if (!llvm::sys::fs::is_directory(it->path()))
        files.push_back(it->path());
    if (ec) {
      llvm::errs() << argv[0] << ": " << argv[i] << ": " << ec.message()
                   << "\n";
      return 1;
    }
  }
  std::sort(files.begin(), files.end());
  for (const std::string &file : files) {
    auto buffer = llvm::MemoryBuffer::getFile(file);
    if (!buffer) {
      llvm::errs() << argv[0] << ": " << file << ": "
                   << buffer.getError().message() << "\n";
      return 1;
    }
    LLVMFuzzerTestOneInput(
        reinterpret_cast<const uint8_t *>((*buffer)->getBufferStart()),
        (*buffer)->getBufferSize());
  }
  llvm::outs() << argv[0] << ": ran " << files.size() << " inputs\n";
  return 0;
}
