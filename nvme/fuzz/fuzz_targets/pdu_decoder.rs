//! The NVMe/TCP PDU decoder on hostile bytes, from both sides of a connection, with and without digests
//! and with tight or loose bounds: it must return a typed error or a PDU, never panic, and never read or
//! promise more data than the bounds allow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_nvme::tcp::pdu::{Decoder, Digests, decode_pdu};

fuzz_target!(|input: &[u8]| {
    let Some((&options, bytes)) = input.split_first() else { return };
    let decoder = Decoder {
        controller: options & 1 != 0,
        digests: Digests { header: options & 2 != 0, data: options & 4 != 0 },
        max_data_bytes: if options & 8 != 0 { 4096 } else { 1 << 20 },
    };
    let mut rest = bytes;
    while let Ok((header, data, used)) = decode_pdu(&decoder, rest) {
        assert!(header.data_len <= decoder.max_data_bytes.max(152));
        assert_eq!(data.len(), header.data_len as usize);
        assert!(used > 0 && used <= rest.len());
        rest = &rest[used..];
    }
});
