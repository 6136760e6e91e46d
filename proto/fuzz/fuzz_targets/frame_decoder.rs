//! The KV frame decoder on hostile bytes, with default and tight bounds: a typed error or a frame whose
//! items lie inside the input and within the bounds, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_proto::{FRAME_HEADER_BYTES, Limits, RequestFrame, decode_request_frame};

fuzz_target!(|input: &[u8]| {
    let Some((&options, bytes)) = input.split_first() else { return };
    let limits = if options & 1 != 0 {
        Limits { max_key_bytes: 8, max_value_bytes: 64, max_batch_items: 4, max_put_body_bytes: 256 }
    } else {
        Limits::default()
    };
    if let Ok(RequestFrame::Items(header, items)) = decode_request_frame(bytes, &limits) {
        assert!(FRAME_HEADER_BYTES as u64 + header.body_len <= bytes.len() as u64);
        assert!(items.len() as u32 <= limits.max_batch_items);
        for item in items {
            assert!(!item.key.is_empty() && item.key.len() <= limits.max_key_bytes as usize);
        }
    }
});
