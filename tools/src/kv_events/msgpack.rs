//! The few MessagePack forms a `KVEventBatch` needs, written into a `Vec` (infallible, no allocation
//! beyond the buffer's growth). Lengths are the smallest form the spec allows, as msgspec writes them.

/// Appends an array header of `len` items.
pub fn array(out: &mut Vec<u8>, len: usize) {
    sized(out, len, 0x90, 16, [0xdc, 0xdd]);
}

/// Appends a map header of `len` pairs.
pub fn map(out: &mut Vec<u8>, len: usize) {
    sized(out, len, 0x80, 16, [0xde, 0xdf]);
}

/// Appends a UTF-8 string.
pub fn str(out: &mut Vec<u8>, text: &str) {
    prefixed(out, text.as_bytes(), Some(0xa0), [0xd9, 0xda, 0xdb]);
}

/// Appends a byte string (bin).
pub fn bin(out: &mut Vec<u8>, bytes: &[u8]) {
    prefixed(out, bytes, None, [0xc4, 0xc5, 0xc6]);
}

/// Appends `bytes` after their length: in the fixed form (lengths under 32) when the type has one, else
/// with an 8-, 16- or 32-bit length.
fn prefixed(out: &mut Vec<u8>, bytes: &[u8], fixed: Option<u8>, [marker8, marker16, marker32]: [u8; 3]) {
    match (fixed, bytes.len()) {
        (Some(fixed), len) if len < 32 => out.push(fixed | len as u8),
        (_, len) if len <= u8::MAX as usize => out.extend_from_slice(&[marker8, len as u8]),
        (_, len) if len <= u16::MAX as usize => {
            out.push(marker16);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (_, len) => {
            out.push(marker32);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(bytes);
}

/// Appends an unsigned integer.
pub fn uint(out: &mut Vec<u8>, value: u64) {
    match value {
        0..0x80 => out.push(value as u8),
        0x80..=0xff => out.extend_from_slice(&[0xcc, value as u8]),
        0x100..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(value as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(0xce);
            out.extend_from_slice(&(value as u32).to_be_bytes());
        }
        _ => {
            out.push(0xcf);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
}

/// Appends a 64-bit float.
pub fn f64(out: &mut Vec<u8>, value: f64) {
    out.push(0xcb);
    out.extend_from_slice(&value.to_be_bytes());
}

/// Appends nil.
pub fn nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

fn sized(out: &mut Vec<u8>, len: usize, fixed: u8, fixed_limit: usize, [marker16, marker32]: [u8; 2]) {
    if len < fixed_limit {
        out.push(fixed | len as u8);
    } else if len <= u16::MAX as usize {
        out.push(marker16);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(marker32);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_take_the_smallest_form_of_the_spec() {
        let mut out = Vec::new();
        array(&mut out, 15);
        array(&mut out, 16);
        map(&mut out, 2);
        str(&mut out, "type");
        bin(&mut out, &[7; 3]);
        uint(&mut out, 127);
        uint(&mut out, 128);
        uint(&mut out, 70_000);
        nil(&mut out);
        assert_eq!(
            out,
            [
                0x9f, 0xdc, 0, 16, 0x82, 0xa4, b't', b'y', b'p', b'e', 0xc4, 3, 7, 7, 7, 0x7f, 0xcc, 128, 0xce, 0, 1,
                0x11, 0x70, 0xc0
            ]
        );
    }

    #[test]
    fn long_strings_and_bytes_switch_to_their_wider_forms() {
        let mut out = Vec::new();
        str(&mut out, &"x".repeat(40));
        assert_eq!(&out[..2], &[0xd9, 40]);
        out.clear();
        bin(&mut out, &[0; 300]);
        assert_eq!(&out[..3], &[0xc5, 1, 44]);
    }
}
