// Read-only mappings of external-data files (see weight_map.h).
#include "weight_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ndp {

WeightFileMap::~WeightFileMap() {
  for (const File& file : files_) munmap(file.base, file.size);
}

std::string WeightFileMap::Map(const std::string& path, int64_t offset, size_t bytes, const void** data) {
  *data = nullptr;
  const File* found = nullptr;
  for (const File& file : files_)
    if (file.path == path) found = &file;
  if (found == nullptr) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "cannot open external data " + path + ": " + std::strerror(errno);
    struct stat info {};
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      close(fd);
      return "external data " + path + " is not a regular file";
    }
    File file{path, nullptr, static_cast<size_t>(info.st_size)};
    if (file.size > 0) {
      void* base = mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (base == MAP_FAILED) {
        const int error = errno;
        close(fd);
        return "cannot map external data " + path + ": " + std::strerror(error);
      }
      file.base = static_cast<uint8_t*>(base);
    }
    close(fd);
    files_.push_back(file);
    found = &files_.back();
  }
  if (offset < 0 || static_cast<uint64_t>(offset) > found->size || bytes > found->size - static_cast<size_t>(offset))
    return "external data " + path + " holds " + std::to_string(found->size) + " bytes, a tensor needs bytes " +
           std::to_string(offset) + ".." + std::to_string(static_cast<uint64_t>(offset) + bytes);
  *data = found->base + offset;
  return "";
}

void WeightFileMap::Release(const void* data, size_t bytes) const {
  const auto* start = static_cast<const uint8_t*>(data);
  for (const File& file : files_) {
    if (start < file.base || start >= file.base + file.size) continue;
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t first = reinterpret_cast<uintptr_t>(start) / page * page;
    const uintptr_t end = reinterpret_cast<uintptr_t>(file.base + file.size);
    const uintptr_t last = std::min(end, (reinterpret_cast<uintptr_t>(start) + bytes + page - 1) / page * page);
    // a read-only private file mapping never written: its pages come back from the file
    madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    return;
  }
}

std::string ExternalDataPath(const std::string& model_path, const std::string& relative) {
  if (relative.empty() || relative[0] == '/') return "";
  for (size_t start = 0; start <= relative.size();) {
    const size_t end = std::min(relative.find('/', start), relative.size());
    if (relative.compare(start, end - start, "..") == 0 && end - start == 2) return "";
    start = end + 1;
  }
  const size_t slash = model_path.rfind('/');
  return slash == std::string::npos ? relative : model_path.substr(0, slash + 1) + relative;
}

}  // namespace ndp
