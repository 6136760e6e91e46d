//! Little-endian field access at fixed offsets. Callers pass slices whose length they checked (or fixed-size
//! arrays), so the indexing here cannot go out of bounds on network input.

/// The little-endian `u16` at `at`.
pub fn get_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// The little-endian `u32` at `at`.
pub fn get_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The little-endian `u64` at `at`.
pub fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from(get_u32(bytes, at)) | (u64::from(get_u32(bytes, at + 4)) << 32)
}

pub(crate) fn put_u16(bytes: &mut [u8], at: usize, value: u16) {
    bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Writes `text` into the `width`-byte field at `at`, padded with `pad` (spaces for ASCII identity fields,
/// NUL for NQNs), truncated to the field.
pub(crate) fn put_str(bytes: &mut [u8], at: usize, width: usize, text: &str, pad: u8) {
    let field = &mut bytes[at..at + width];
    field.fill(pad);
    let len = text.len().min(width);
    field[..len].copy_from_slice(&text.as_bytes()[..len]);
}

/// Reads a padded string field: up to the first NUL, trailing spaces trimmed, invalid UTF-8 replaced.
pub(crate) fn read_str(bytes: &[u8], at: usize, width: usize) -> String {
    let field = &bytes[at..at + width];
    let end = field.iter().position(|&byte| byte == 0).unwrap_or(width);
    String::from_utf8_lossy(&field[..end]).trim_end_matches(' ').to_string()
}
