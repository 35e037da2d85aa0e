// CRC-32C (Castagnoli, the reflected polynomial 0x82F63B78), slicing-by-8:
// what every TFRecord frame is checked with (tfrecord.h).
#include <cstdint>

#include "worker/data/tfrecord.h"

namespace lockstep::worker {
namespace {

// Slicing-by-8: table[k][b] is the CRC of byte b followed by k zero bytes,
// so eight bytes are folded in with eight lookups.
struct Crc32cTables {
  uint32_t table[8][256];
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) {
        crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
      }
      table[0][i] = crc;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t i = 0; i < 256; ++i) {
        uint32_t prev = table[k - 1][i];
        table[k][i] = (prev >> 8) ^ table[0][prev & 0xFF];
      }
    }
  }
};

const Crc32cTables& Tables() {
  static const Crc32cTables* tables = new Crc32cTables;
  return *tables;
}

// Eight bytes, little-endian.
uint64_t Load64(const uint8_t* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto& t = Tables().table;
  crc = ~crc;
  while (size >= 8) {
    // The low four bytes, read little-endian, fold in the running CRC.
    uint64_t word = Load64(p) ^ crc;
    crc = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^
          t[5][(word >> 16) & 0xFF] ^ t[4][(word >> 24) & 0xFF] ^
          t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^
          t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

}  // namespace lockstep::worker
