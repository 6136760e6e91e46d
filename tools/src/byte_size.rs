//! Byte sizes as fio and Strata's configs write them: `4096`, `4k`, `1m`, `4g`, `512KiB`, `8GiB`.
//!
//! Every suffix is a power of 1024, as in fio with its default `kb_base=1024` (so `4k`, `4KB` and `4KiB` are
//! all 4096 bytes): a storage engineer pasting a fio option gets what fio would do.

/// Why a byte size did not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    /// No digits, or digits followed by something that is not a unit.
    #[error("'{0}' is not a byte size (examples: 4096, 4k, 1m, 8GiB)")]
    Malformed(String),
    /// The value does not fit in 64 bits.
    #[error("'{0}' is too large")]
    Overflow(String),
}

/// Parses a byte size.
pub fn parse_byte_size(text: &str) -> Result<u64, ByteSizeError> {
    let trimmed = text.trim();
    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(ByteSizeError::Malformed(text.to_string()));
    }
    let value: u64 = digits.parse().map_err(|_| ByteSizeError::Overflow(text.to_string()))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => return Err(ByteSizeError::Malformed(text.to_string())),
    };
    value.checked_mul(1u64 << shift).ok_or_else(|| ByteSizeError::Overflow(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_and_config_spellings() {
        for (text, bytes) in [
            ("4096", 4096),
            ("4k", 4096),
            ("4K", 4096),
            ("4KiB", 4096),
            ("4kb", 4096),
            ("1m", 1 << 20),
            ("4g", 4 << 30),
            ("8GiB", 8 << 30),
            ("1TiB", 1 << 40),
            ("512 KiB", 512 << 10),
            ("0", 0),
        ] {
            assert_eq!(parse_byte_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn garbage_and_overflow_are_errors() {
        for text in ["", "k", "4x", "4 kilo", "-1", "1.5g"] {
            assert!(matches!(parse_byte_size(text), Err(ByteSizeError::Malformed(_))), "{text}");
        }
        assert!(matches!(parse_byte_size("16384p"), Err(ByteSizeError::Overflow(_))));
        assert!(matches!(parse_byte_size("99999999999999999999999"), Err(ByteSizeError::Overflow(_))));
    }
}
