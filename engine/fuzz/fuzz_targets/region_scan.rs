//! The region scan (what recovery and reclaim read a region with) over regions of real records, damaged
//! where the input says: it never panics, never reports a record that was not written there, and finds
//! every written record that no damage touched, however much damage comes before it (it resynchronises).
//! Raw headers are decoded too: any bytes give a header or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_engine::record::{
    RECORD_HEADER_BYTES, REGION_HEADER_BYTES, RecordHeader, RegionHeader, TierHeader,
};
use strata_engine::scan::{Scanned, scan_bytes};

const REGION_BYTES: usize = 2048;
const FORMAT_ID: u64 = 0x5eed;
const SEQ: u64 = 7;

/// Reads the input as: records (key length, value length, flags byte) until a zero byte, then damage
/// (offset, mask) pairs.
fn case(input: &[u8]) -> (Vec<(Vec<u8>, Vec<u8>, u16)>, Vec<(usize, u8)>) {
    let mut records = Vec::new();
    let mut at = 0;
    while at + 3 <= input.len() && input[at] != 0 && records.len() < 64 {
        let key = vec![input[at]; 1 + usize::from(input[at] % 17)];
        let value = vec![input[at + 1]; usize::from(input[at + 1]) * 3];
        let flags = if input[at + 2] % 7 == 0 { 1 } else { 0 };
        records.push((key, value, flags));
        at += 3;
    }
    let damage = input[at.min(input.len())..]
        .chunks_exact(3)
        .map(|pair| (usize::from(u16::from_le_bytes([pair[0], pair[1]])) % REGION_BYTES, pair[2].max(1)))
        .collect();
    (records, damage)
}

fuzz_target!(|input: &[u8]| {
    let _ = RecordHeader::decode(input, FORMAT_ID);
    let _ = RegionHeader::decode(input);
    let _ = TierHeader::decode(input);
    let (records, damage) = case(input);
    let mut region = vec![0u8; REGION_BYTES];
    let header = RegionHeader { region_seq: SEQ, shard: 0, region_id: 0, format_id: FORMAT_ID, epoch: 1 };
    region[..REGION_HEADER_BYTES].copy_from_slice(&header.encode());
    let mut written = Vec::new();
    let mut at = REGION_HEADER_BYTES;
    for (key, value, flags) in &records {
        let value: &[u8] = if *flags == 1 { &[] } else { value };
        let header = RecordHeader {
            region_seq: SEQ,
            key_hash: u64::from(key[0]),
            value_len: value.len() as u32,
            value_crc: if value.is_empty() { 0 } else { crc32c::crc32c(value) },
            key_len: key.len() as u16,
            flags: *flags,
            version: 1,
        };
        let len = header.record_len();
        if at + len + 8 > REGION_BYTES {
            break;
        }
        region[at..at + RECORD_HEADER_BYTES].copy_from_slice(&header.encode(key, FORMAT_ID));
        region[at + RECORD_HEADER_BYTES..at + RECORD_HEADER_BYTES + key.len()].copy_from_slice(key);
        region[at + header.value_offset()..at + header.value_offset() + value.len()].copy_from_slice(value);
        written.push((at, len, header, key.clone()));
        at += len;
    }
    let records_end = at;
    for &(offset, mask) in &damage {
        region[offset] ^= mask;
    }
    let touched = |from: usize, len: usize| damage.iter().any(|&(offset, _)| (from..from + len).contains(&offset));
    let found = scan_bytes(&region, SEQ, FORMAT_ID);
    let mut last = 0;
    for item in &found {
        let start = match item {
            Scanned::Record { at, .. } | Scanned::Damaged { at, .. } | Scanned::Seal { at } => *at,
            Scanned::Lost { from, to, .. } => {
                assert!(from < to && *to <= REGION_BYTES);
                *from
            }
        };
        assert!(start >= last && start < REGION_BYTES, "items in order, within the region");
        last = start;
        if let Scanned::Record { at, header, covered } = item {
            let original = written.iter().find(|(start, ..)| start == at);
            let Some((_, _, written_header, key)) = original else { panic!("a record nobody wrote at {at}") };
            assert_eq!((header, &covered[..]), (written_header, &key[..]), "a record other than the one written");
        }
    }
    // Zeroes where a record starts read as the end mark (the end of an unfinished write, in the newest
    // regions; `docs/NVME_FORMAT.md`, "What is not covered"): damage that makes them hides what follows.
    let false_end = (REGION_HEADER_BYTES..records_end)
        .step_by(8)
        .find(|&at| touched(at, 8) && region[at..at + 8].iter().all(|&byte| byte == 0))
        .unwrap_or(records_end);
    if !touched(records_end, 8) {
        for (start, len, ..) in written.iter().filter(|(start, len, ..)| !touched(*start, *len) && *start < false_end) {
            let intact_found = found.iter().any(|item| matches!(item, Scanned::Record { at, .. } if at == start));
            assert!(intact_found, "an untouched record at {start} (+{len}) was not found");
        }
    }
});
