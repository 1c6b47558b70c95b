//===- Crc32.h - CRC-32 (ISO 3309, zlib's) of byte ranges -------*- C++ -*-===//
//
// zlib's crc32 where the runtime is built with zlib, else a table-driven
// one with the same results. Incremental: pass the previous value to
// continue a checksum over several ranges (0 to start).
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_CRC32_H
#define MOERT_CRC32_H

#include <cstddef>
#include <cstdint>

#ifdef MOERT_HAVE_ZLIB
#include <zlib.h>
#endif

namespace moert {

inline uint32_t crc32Update(uint32_t crc, const void *data, size_t n) {
  const auto *p = static_cast<const unsigned char *>(data);
#ifdef MOERT_HAVE_ZLIB
  while (n > 0) {
    size_t chunk = n < (size_t(1) << 30) ? n : (size_t(1) << 30);
    crc = uint32_t(::crc32(uLong(crc), p, uInt(chunk)));
    p += chunk;
    n -= chunk;
  }
  return crc;
#else
  static const auto table = [] {
    struct Table {
      uint32_t v[256];
    } t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      t.v[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i)
    crc = table.v[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
#endif
}

} // namespace moert

#endif
