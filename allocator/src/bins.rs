//! Small-float size bins: 5 bits of exponent and 3 bits of mantissa, 256 bins in all.
//!
//! A size (in allocation units) maps to a bin by keeping its three bits below the leading one. Values below 8
//! are exact (a denormal range); above, consecutive bins are 1/8 of a power of two apart, so rounding a
//! request *up* to its bin costs at most 12.5% (and 6.25% on average) of search precision, never of memory:
//! the allocator still carves the exact size. Free regions are filed under the bin their size rounds *down*
//! to, and a request searches bins from the one its size rounds *up* to, so any region found is big enough.
//! This is the scheme of Sebastian Aaltonen's OffsetAllocator, which Mooncake Store also uses.

/// Number of bins: 32 exponents × 8 mantissa values.
pub(crate) const BIN_COUNT: usize = 256;

const MANTISSA_BITS: u32 = 3;
const MANTISSA_VALUE: u64 = 1 << MANTISSA_BITS;
const MANTISSA_MASK: u64 = MANTISSA_VALUE - 1;

/// The largest bin index, under which every region at least that large is filed.
pub(crate) const LAST_BIN: u32 = (BIN_COUNT - 1) as u32;

/// A size's bin with its value rounded down, and whether bits below the mantissa were dropped.
fn bin_and_remainder(size: u64) -> (u32, bool) {
    if size < MANTISSA_VALUE {
        return (size as u32, false);
    }
    let highest_bit = 63 - size.leading_zeros();
    let mantissa_start = highest_bit - MANTISSA_BITS;
    let exponent = mantissa_start + 1;
    let mantissa = (size >> mantissa_start) & MANTISSA_MASK;
    let dropped = size & ((1u64 << mantissa_start) - 1) != 0;
    ((exponent << MANTISSA_BITS) + mantissa as u32, dropped)
}

/// The bin whose value is the smallest value ≥ `size`. May exceed [`LAST_BIN`] for huge sizes; callers
/// treat that as "too large for any bin".
pub(crate) fn bin_round_up(size: u64) -> u32 {
    // A mantissa of 8 carries into the exponent, which is the next bin: the increment does it.
    let (bin, dropped) = bin_and_remainder(size);
    bin + u32::from(dropped)
}

/// The bin whose value is the largest value ≤ `size`, clamped to [`LAST_BIN`] (regions larger than the last
/// bin's value are all filed there; they are still at least that large, so the search stays correct).
pub(crate) fn bin_round_down(size: u64) -> u32 {
    bin_and_remainder(size).0.min(LAST_BIN)
}

/// The smallest size filed under `bin`.
pub(crate) fn bin_value(bin: u32) -> u64 {
    let exponent = bin >> MANTISSA_BITS;
    let mantissa = u64::from(bin) & MANTISSA_MASK;
    if exponent == 0 { mantissa } else { (mantissa | MANTISSA_VALUE) << (exponent - 1) }
}

/// The largest request (in units) that some bin can serve: everything in the last bin is at least this big.
pub(crate) fn max_request_units() -> u64 {
    bin_value(LAST_BIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_sizes_are_exact() {
        for size in 0..8u64 {
            assert_eq!(bin_round_up(size), size as u32);
            assert_eq!(bin_round_down(size), size as u32);
            assert_eq!(bin_value(size as u32), size);
        }
    }

    #[test]
    fn bin_values_are_increasing_and_round_trip() {
        let mut previous = None;
        for bin in 0..BIN_COUNT as u32 {
            let value = bin_value(bin);
            if let Some(previous) = previous {
                assert!(value > previous, "bin {bin} value {value} not above {previous}");
            }
            assert_eq!(bin_round_up(value), bin, "round up of exact value {value}");
            assert_eq!(bin_round_down(value), bin, "round down of exact value {value}");
            previous = Some(value);
        }
    }

    #[test]
    fn rounding_brackets_the_size() {
        let mut size = 1u64;
        while size < (1u64 << 33) {
            for probe in [size, size + 1, size * 3 / 2 + 7] {
                let up = bin_round_up(probe);
                let down = bin_round_down(probe);
                assert!(bin_value(up) >= probe, "up({probe}) too small");
                assert!(bin_value(down) <= probe, "down({probe}) too large");
                assert!(up == down || up == down + 1, "bins of {probe} not adjacent: {down} {up}");
                // The precision promise: rounding up costs at most 1/8 of the size.
                assert!(bin_value(up) - probe <= probe / 8, "rounding of {probe} exceeds 12.5%");
            }
            size = size * 5 / 4 + 1;
        }
    }

    #[test]
    fn deepseek_block_rounds_up_by_about_five_percent() {
        // 61 layers × 576 × 2 B × 64 tokens, in 4 KiB units: the example of a size bins waste.
        let units = 4_497_408 / 4096;
        let rounded = bin_value(bin_round_up(units));
        let loss = (rounded - units) as f64 / units as f64;
        assert!((0.045..0.055).contains(&loss), "loss {loss}");
        assert!(bin_round_down(units) < bin_round_up(units), "an exact-size hole must not be found by bins");
    }

    #[test]
    fn huge_regions_clamp_to_last_bin() {
        assert_eq!(bin_round_down(u64::MAX), LAST_BIN);
        assert!(bin_round_up(max_request_units() + 1) > LAST_BIN);
        assert_eq!(bin_round_up(max_request_units()), LAST_BIN);
    }
}
