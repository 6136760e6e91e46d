//! The region scan: what recovery and reclaim read out of a region's bytes. It walks the records of one
//! generation in order and says, for every byte it cannot account for, whether the key it belonged to is
//! known. It never stops at damage: it resynchronises on the next intact header of the generation, so
//! every record that can be proven intact is found. The argument for what recovery does with each item is
//! in `docs/NVME_FORMAT.md`.

use crate::log::Staged;
use crate::record::{
    END_MARK_BYTES, RECORD_ALIGN_BYTES, RECORD_HEADER_BYTES, RECORD_SEAL, RECORD_TOMBSTONE, REGION_HEADER_BYTES,
    RecordHeader,
};

/// What the scan found at one place of a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scanned {
    /// An intact record: header, key, links and value all pass their checksums.
    Record {
        /// Where it starts in the region.
        at: usize,
        /// Its header.
        header: RecordHeader,
        /// The key, then a linked record's links.
        covered: Vec<u8>,
    },
    /// A record whose fixed header is intact (so its key hash, version and length are known) but whose
    /// key, links or value is not.
    Damaged {
        /// Where it starts in the region.
        at: usize,
        /// Its fixed header.
        header: RecordHeader,
    },
    /// The seal record: the region was written whole, and its records end here.
    Seal {
        /// Where it starts in the region.
        at: usize,
    },
    /// Bytes where a record or the end mark should be and neither is: records of unknown keys may have
    /// been there.
    Lost {
        /// Where the bytes start.
        from: usize,
        /// Where the next intact record starts (the region's end if none does).
        to: usize,
        /// No intact record of the generation follows in the region.
        trailing: bool,
    },
}

/// The items of the region held in `staged` (the whole region), generation `seq`, of the tier whose
/// format id is `format_id`, in order. The records end at the end mark (zero bytes written after the
/// last record) or at the region's end.
pub(crate) fn scan_region(staged: &Staged, seq: u64, format_id: u64) -> impl Iterator<Item = Scanned> + '_ {
    let region_bytes = staged.len();
    let mut at = REGION_HEADER_BYTES;
    let mut done = false;
    std::iter::from_fn(move || {
        if done || at + END_MARK_BYTES > region_bytes || is_end_mark(staged, at) {
            return None;
        }
        if let Some((header, body_crc)) = header_at(staged, at, seq, format_id) {
            let start = at;
            if header.flags == RECORD_SEAL {
                done = true;
                return Some(Scanned::Seal { at: start });
            }
            at += header.record_len();
            return Some(if record_is_intact(staged, start, &header, body_crc) {
                let covered = staged.copy(start + RECORD_HEADER_BYTES, header.value_offset() - RECORD_HEADER_BYTES);
                Scanned::Record { at: start, header, covered }
            } else {
                Scanned::Damaged { at: start, header }
            });
        }
        let from = at;
        let next = (from + RECORD_ALIGN_BYTES..region_bytes)
            .step_by(RECORD_ALIGN_BYTES)
            .find(|&candidate| header_at(staged, candidate, seq, format_id).is_some());
        match next {
            Some(next) => {
                at = next;
                Some(Scanned::Lost { from, to: next, trailing: false })
            }
            None => {
                done = true;
                Some(Scanned::Lost { from, to: region_bytes, trailing: true })
            }
        }
    })
}

/// [`scan_region`] over a region's bytes in memory (the fuzz target's entry).
pub fn scan_bytes(bytes: &[u8], seq: u64, format_id: u64) -> Vec<Scanned> {
    let staged = Staged::from_vec(bytes.to_vec());
    scan_region(&staged, seq, format_id).collect()
}

/// The intact fixed header (and the crc its key and links must have) of a generation-`seq` record at
/// `at` that fits in the region, if there is one.
fn header_at(staged: &Staged, at: usize, seq: u64, format_id: u64) -> Option<(RecordHeader, u32)> {
    if at + RECORD_HEADER_BYTES > staged.len() {
        return None;
    }
    let (header, body_crc) = RecordHeader::decode_fixed(&staged.copy(at, RECORD_HEADER_BYTES), format_id).ok()?;
    (header.region_seq == seq && at + header.record_len() <= staged.len()).then_some((header, body_crc))
}

/// Whether the key, links and value of the record whose fixed header is intact at `at` pass their crcs.
fn record_is_intact(staged: &Staged, at: usize, header: &RecordHeader, body_crc: u32) -> bool {
    let body_len = header.value_offset() - RECORD_HEADER_BYTES;
    staged.crc(at + RECORD_HEADER_BYTES, body_len) == body_crc
        && (header.flags & RECORD_TOMBSTONE != 0
            || staged.crc(at + header.value_offset(), header.value_len as usize) == header.value_crc)
}

/// Whether the end mark (zeros) is at `at`.
fn is_end_mark(staged: &Staged, at: usize) -> bool {
    staged.slices(at, END_MARK_BYTES).iter().all(|part| part.iter().all(|&byte| byte == 0))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const FORMAT: u64 = 0xf0_12a7;
    const SEQ: u64 = 9;
    const REGION: usize = 4096;

    /// A region of generation `SEQ` holding `records` (key, value), the end mark after the last; returns
    /// the bytes and where each record starts.
    fn region(records: &[(&[u8], &[u8])]) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = vec![0xeeu8; REGION];
        bytes[..REGION_HEADER_BYTES].fill(1);
        let mut at = REGION_HEADER_BYTES;
        let mut starts = Vec::new();
        for (key, value) in records {
            let header = RecordHeader {
                region_seq: SEQ,
                key_hash: key.len() as u64 * 1000 + u64::from(key[0]),
                value_len: value.len() as u32,
                value_crc: strata_proto::crc32c(value),
                key_len: key.len() as u16,
                flags: 0,
                version: 1,
            };
            let mut record = header.encode(key, FORMAT).to_vec();
            record.extend_from_slice(key);
            record.extend_from_slice(value);
            record.resize(header.record_len(), 0);
            bytes[at..at + record.len()].copy_from_slice(&record);
            starts.push(at);
            at += record.len();
        }
        bytes[at..at + END_MARK_BYTES].fill(0);
        (bytes, starts)
    }

    fn scan(bytes: &[u8]) -> Vec<Scanned> {
        scan_region(&Staged::from_vec(bytes.to_vec()), SEQ, FORMAT).collect()
    }

    fn kinds(items: &[Scanned]) -> Vec<&'static str> {
        items
            .iter()
            .map(|item| match item {
                Scanned::Record { .. } => "record",
                Scanned::Damaged { .. } => "damaged",
                Scanned::Seal { .. } => "seal",
                Scanned::Lost { trailing: false, .. } => "lost",
                Scanned::Lost { trailing: true, .. } => "lost at the end",
            })
            .collect()
    }

    const THREE: [(&[u8], &[u8]); 3] = [(b"alpha", b"first value"), (b"bravo", b"second"), (b"charlie", b"third")];

    #[test]
    fn an_intact_region_yields_its_records_and_ends_at_the_end_mark() {
        let (bytes, starts) = region(&THREE);
        let items = scan(&bytes);
        assert_eq!(kinds(&items), ["record"; 3]);
        let Scanned::Record { at, covered, .. } = &items[1] else { panic!("a record") };
        assert_eq!((*at, covered.as_slice()), (starts[1], &b"bravo"[..]));
    }

    #[test]
    fn a_damaged_key_or_value_keeps_the_key_hash_and_the_scan_goes_on() {
        let (mut bytes, starts) = region(&THREE);
        bytes[starts[0] + RECORD_HEADER_BYTES + 1] ^= 1;
        bytes[starts[1] + RECORD_HEADER_BYTES + 5 + 2] ^= 1;
        let items = scan(&bytes);
        assert_eq!(kinds(&items), ["damaged", "damaged", "record"]);
        let Scanned::Damaged { header, .. } = &items[1] else { panic!("damaged") };
        assert_eq!(header.key_hash, 5000 + u64::from(b'b'));
    }

    #[test]
    fn a_damaged_fixed_header_is_a_lost_span_and_the_next_record_is_found() {
        let (mut bytes, starts) = region(&THREE);
        bytes[starts[1] + 20] ^= 0x40;
        let items = scan(&bytes);
        assert_eq!(kinds(&items), ["record", "lost", "record"]);
        assert_eq!(items[1], Scanned::Lost { from: starts[1], to: starts[2], trailing: false });
    }

    #[test]
    fn damage_to_the_last_record_is_lost_at_the_end_not_taken_for_the_end() {
        let (mut bytes, starts) = region(&THREE);
        bytes[starts[2]] ^= 0x01;
        assert_eq!(kinds(&scan(&bytes)), ["record", "record", "lost at the end"]);
    }

    #[test]
    fn a_sealed_region_ends_at_its_seal_record() {
        let (mut bytes, _) = region(&THREE);
        let end = REGION_HEADER_BYTES
            + THREE.iter().map(|(k, v)| (48 + k.len() + v.len()).next_multiple_of(8)).sum::<usize>();
        bytes[end..end + RECORD_HEADER_BYTES].copy_from_slice(&RecordHeader::seal(SEQ).encode(&[], FORMAT));
        assert_eq!(kinds(&scan(&bytes)), ["record", "record", "record", "seal"], "nothing is read past the seal");
    }

    #[test]
    fn records_of_another_generation_or_tier_are_not_taken() {
        let (bytes, _) = region(&THREE);
        assert_eq!(
            kinds(&scan_region(&Staged::from_vec(bytes.clone()), SEQ + 1, FORMAT).collect::<Vec<_>>()),
            ["lost at the end"]
        );
        assert_eq!(
            kinds(&scan_region(&Staged::from_vec(bytes), SEQ, FORMAT + 1).collect::<Vec<_>>()),
            ["lost at the end"]
        );
    }

    proptest! {
        /// Whatever bytes are flipped, every record the scan calls intact is one that was written, at its
        /// place, and the items cover the region in order without overlapping.
        #[test]
        fn flips_never_make_up_a_record(flips in proptest::collection::vec((0..REGION, any::<u8>()), 0..12)) {
            let records: Vec<(Vec<u8>, Vec<u8>)> =
                (0..12u8).map(|index| (vec![b'k', index], vec![index; 40 + usize::from(index) * 7])).collect();
            let borrowed: Vec<(&[u8], &[u8])> = records.iter().map(|(k, v)| (&k[..], &v[..])).collect();
            let (mut bytes, starts) = region(&borrowed);
            for (at, mask) in flips {
                bytes[at] ^= mask;
            }
            let mut next = REGION_HEADER_BYTES;
            for item in scan(&bytes) {
                let (from, to) = match &item {
                    Scanned::Record { at, header, covered } => {
                        let index = starts.iter().position(|start| start == at).expect("a written record's place");
                        prop_assert_eq!(covered.as_slice(), borrowed[index].0);
                        (*at, at + header.record_len())
                    }
                    Scanned::Damaged { at, header } => (*at, at + header.record_len()),
                    Scanned::Seal { at } => (*at, at + RECORD_HEADER_BYTES),
                    Scanned::Lost { from, to, .. } => (*from, *to),
                };
                prop_assert!(from >= next && to > from && to <= REGION, "{item:?} after {next}");
                next = to;
            }
        }
    }
}
