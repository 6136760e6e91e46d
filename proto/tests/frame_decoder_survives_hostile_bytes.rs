//! The frame decoder never panics and never reads past what it was given, whatever the bytes; frames that
//! a client encodes always decode to what was encoded. (The same property, coverage-guided: `proto/fuzz`.)

use proptest::prelude::*;
use strata_proto::{
    FRAME_HEADER_BYTES, FrameHeader, Limits, Opcode, RequestFrame, RequestItemHeader, decode_request_frame,
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_request_frame(&bytes, &Limits::default());
        let _ = FrameHeader::decode(&bytes);
    }

    #[test]
    fn a_valid_header_with_a_random_body_never_panics(
        opcode in 1u8..=6,
        count in 0u32..8,
        body in proptest::collection::vec(any::<u8>(), 0..512),
        declared in 0u64..1024,
    ) {
        let opcode = Opcode::from_u8(opcode).unwrap_or(Opcode::Get);
        let mut frame = Vec::new();
        FrameHeader::request(opcode, 1, count, declared).encode_into(&mut frame);
        frame.extend_from_slice(&body);
        if let Ok(RequestFrame::Items(header, items)) = decode_request_frame(&frame, &Limits::default()) {
            prop_assert_eq!(items.len() as u32, header.count);
            prop_assert!(FRAME_HEADER_BYTES as u64 + header.body_len <= frame.len() as u64);
        }
    }

    #[test]
    fn encoded_batches_decode_to_what_was_encoded(
        keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..64), 1..16),
    ) {
        let mut body = Vec::new();
        for key in &keys {
            RequestItemHeader { key_len: key.len() as u16, ..Default::default() }.encode_into(&mut body);
            body.extend_from_slice(key);
        }
        let mut frame = Vec::new();
        FrameHeader::request(Opcode::Exists, 3, keys.len() as u32, body.len() as u64).encode_into(&mut frame);
        frame.extend_from_slice(&body);
        let Ok(RequestFrame::Items(_, items)) = decode_request_frame(&frame, &Limits::default()) else {
            return Err(TestCaseError::fail("not decoded"));
        };
        let decoded: Vec<Vec<u8>> = items.iter().map(|item| item.key.to_vec()).collect();
        prop_assert_eq!(decoded, keys);
    }
}
