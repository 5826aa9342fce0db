/* crc32c.h - CRC-32C (Castagnoli), the checksum of the plan file format.
 *
 * Reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF:
 * the CRC of iSCSI, ext4, Btrfs and SSE4.2's crc32 instruction, so any
 * tool can recompute it.  Check value: CRC-32C("123456789") = 0xE3069283.
 *
 *     uint32_t c = mgc_crc32c(0, a, na);   // start with 0
 *     c = mgc_crc32c(c, b, nb);            // continue: same as one call over a||b
 *
 * Portable C, slicing-by-8 (about 1 byte per cycle). */
#ifndef MGC_CRC32C_H
#define MGC_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CRC-32C of buf[0..len) continuing from `crc` (0 to start). */
uint32_t mgc_crc32c(uint32_t crc, const void *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* MGC_CRC32C_H */
