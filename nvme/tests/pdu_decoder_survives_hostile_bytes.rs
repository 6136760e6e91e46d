//! The PDU decoder on hostile input, on stable Rust in every test run (the cargo-fuzz target in
//! `nvme/fuzz` runs the same properties under libFuzzer): random bytes and single-byte mutations of valid
//! PDUs give a PDU or a typed error, never a panic, and never more data than the negotiated bound.

use proptest::prelude::*;
use strata_nvme::spec::{Command, Completion, NvmeStatus, SglDescriptor};
use strata_nvme::tcp::pdu::{Decoder, Digests, PduHeader, decode_pdu, encode_data_digest, encode_header};

fn decoders() -> Vec<Decoder> {
    let mut all = Vec::new();
    for controller in [true, false] {
        for (header, data) in [(false, false), (true, true), (true, false)] {
            for max_data_bytes in [4096, 1 << 20] {
                all.push(Decoder { controller, digests: Digests { header, data }, max_data_bytes });
            }
        }
    }
    all
}

fn valid_pdus() -> Vec<Vec<u8>> {
    let digests = Digests { header: true, data: true };
    let mut write = Command::new(0x01, 7);
    write.sgl = SglDescriptor::in_capsule(512);
    let headers: Vec<(PduHeader, Vec<u8>)> = vec![
        (PduHeader::InitRequest { pfv: 0, hpda: 0, digests, maxr2t: 0 }, vec![]),
        (PduHeader::InitResponse { pfv: 0, cpda: 0, digests, maxh2cdata: 1 << 20 }, vec![]),
        (PduHeader::Command(write), vec![0xab; 512]),
        (PduHeader::Response(Completion::new(7, NvmeStatus::SUCCESS)), vec![]),
        (PduHeader::HostData { cccid: 7, ttag: 1, offset: 0, last: true }, vec![1; 1000]),
        (PduHeader::ControllerData { cccid: 7, offset: 0, last: true, success: true }, vec![2; 1000]),
        (PduHeader::ReadyToTransfer { cccid: 7, ttag: 1, offset: 0, len: 8192 }, vec![]),
        (PduHeader::TermRequest { from_host: true, fes: 1, fei: 0 }, vec![3; 24]),
    ];
    headers
        .into_iter()
        .map(|(header, data)| {
            let mut bytes = Vec::new();
            encode_header(&mut bytes, &header, digests, data.len() as u32, 4);
            bytes.extend_from_slice(&data);
            encode_data_digest(&mut bytes, &header, digests, &data);
            bytes
        })
        .collect()
}

fn check(bytes: &[u8]) {
    for decoder in decoders() {
        let mut rest = bytes;
        while let Ok((header, data, used)) = decode_pdu(&decoder, rest) {
            assert!(header.data_len <= decoder.max_data_bytes.max(152), "{header:?}");
            assert_eq!(data.len(), header.data_len as usize);
            assert!(used > 0 && used <= rest.len());
            rest = &rest[used..];
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        check(&bytes);
    }

    #[test]
    fn mutated_pdus_never_panic(which in 0usize..8, at in any::<prop::sample::Index>(), value in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let mut bytes = valid_pdus().swap_remove(which);
        let index = at.index(bytes.len());
        bytes[index] = value;
        check(&bytes);
        let keep = cut.index(bytes.len() + 1);
        check(&bytes[..keep]);
    }
}

#[test]
fn every_valid_pdu_decodes_for_its_receiver() {
    let digests = Digests { header: true, data: true };
    for bytes in valid_pdus() {
        let from_host = [0x00, 0x02, 0x04, 0x06].contains(&bytes[0]);
        let decoder = Decoder { controller: from_host, digests, max_data_bytes: 1 << 20 };
        let (_, _, used) = decode_pdu(&decoder, &bytes).unwrap_or_else(|error| panic!("type {:#x}: {error}", bytes[0]));
        assert_eq!(used, bytes.len());
    }
}
