/*
 * Includes only include/ringfeed.h, as C99 and C11 (-Wall -Wextra -Werror
 * -pedantic) and as C++11 and C++17 (-fsyntax-only): the header must be
 * self-contained, warning-free in each, and its static asserts (the C view of
 * the ABI, from ffi/cbindgen.toml) must hold. A few more facts of the ABI are
 * checked here, with the header's own RF_STATIC_ASSERT.
 */
#include "ringfeed.h"
#include "ringfeed.h" /* the include guard holds */

#define RF_TEST_ASSERT(cond, msg) RF_STATIC_ASSERT(cond, msg)

RF_TEST_ASSERT(RF_OK == 0 && RF_END == 1 && RF_TIMEOUT == 2, "non-negative codes");
RF_TEST_ASSERT(RF_E_INVALID == -1 && RF_E_CORRUPT == -2 && RF_E_VERSION == -3 && RF_E_RANK == -4, "error codes");
RF_TEST_ASSERT(RF_E_BUSY == -5 && RF_E_LOADER_GONE == -6 && RF_E_ABORTED == -7 && RF_E_STALE == -8, "error codes");
RF_TEST_ASSERT(RF_E_IO == -9 && RF_E_INTERNAL == -10, "error codes");
RF_TEST_ASSERT(RF_E_HELD == -11 && RF_E_FORKED == -12 && RF_E_UNTRUSTED == -13, "error codes");
RF_TEST_ASSERT(RF_ABI_VERSION == 1, "the ring ABI this header describes");
RF_TEST_ASSERT(sizeof(rf_status) == 4, "rf_status is an int32_t");
RF_TEST_ASSERT(sizeof(rf_sample) == 3 * sizeof(uint64_t), "rf_sample has no padding");
RF_TEST_ASSERT(offsetof(rf_batch, data) == 0, "rf_batch.data at 0");
RF_TEST_ASSERT(offsetof(rf_info, world_size) == 0, "rf_info.world_size at 0");
RF_TEST_ASSERT(offsetof(rf_info, rank) == 4, "rf_info.rank at 4");
RF_TEST_ASSERT(offsetof(rf_info, slots_per_rank) == 8, "rf_info.slots_per_rank at 8");
RF_TEST_ASSERT(offsetof(rf_info, max_samples_per_slot) == 12, "rf_info.max_samples_per_slot at 12");
RF_TEST_ASSERT(offsetof(rf_info, payload_region_bytes) == 32, "rf_info.payload_region_bytes at 32");

int main(void) {
    return 0;
}
