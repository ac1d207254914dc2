/*
 * crc32c — CRC-32C (Castagnoli), the checksum of the WAL records and segment headers, the
 * snapshot file and the remote-read streamed frames (Prometheus's ChunkedReadResponse).
 *
 *   polynomial   0x1EDC6F41, reflected 0x82F63B78 (iSCSI, ext4, SSE4.2's crc32 instruction)
 *   init, xorout 0xFFFFFFFF, input and output reflected
 *   check value  crc32c("123456789") = 0xE3069283
 *
 * The pre- and post-inversion happen inside each call, so a checksum over several pieces is
 * made by passing the previous result in: crc32c_update(crc32c_update(0, a, na), b, nb) equals
 * crc32c(a || b). An empty piece leaves the value unchanged; crc32c of nothing is 0.
 *
 * On x86-64 with SSE4.2 the crc32 instruction does the work; elsewhere slicing-by-8 over eight
 * 256-entry tables built on first use. Both give the same result (the unit test compares them).
 * Thread-safe.
 */
#ifndef SLUICE_UTIL_CRC32C_H
#define SLUICE_UTIL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over len bytes at data; returns the new value. */
uint32_t crc32c_update(uint32_t crc, const void *data, size_t len);

/* The CRC-32C of len bytes at data. */
static inline uint32_t crc32c(const void *data, size_t len)
{
    return crc32c_update(0, data, len);
}

/* The portable path alone, whatever the CPU has; for tests. */
uint32_t crc32c__sw(uint32_t crc, const void *data, size_t len);

#endif
