//! SCAN: a node's keys, one shard and one page at a time (`Opcode::Scan`, docs/PROTOCOL.md).

use strata_proto::scan::{ScanEntry, decode_scan_entries};
use strata_proto::{MAX_SCAN_KEYS, Opcode, RequestItemHeader, SCAN_DONE, Status};

use crate::client::Client;
use crate::error::ClientError;

/// The longest page read: keys are bounded, and a node ends a page past 1 MiB of them.
const MAX_PAGE_BYTES: u32 = 8 << 20;

/// A page of a shard's keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// The keys, each with its value's length and tiers.
    pub entries: Vec<ScanEntry>,
    /// Where the next page starts; `None` after the shard's last.
    pub next: Option<u32>,
}

impl Client {
    /// One page of at most `max_keys` (1 to `MAX_SCAN_KEYS`) of the keys of shard `shard` (0 to
    /// [`Client::shard_count`]), from `cursor` (0 to begin, then each page's `next`). A key stored for the
    /// whole walk is listed once; one put or removed during it may or may not be.
    pub fn scan_shard(&mut self, shard: usize, cursor: u32, max_keys: u32) -> Result<ScanPage, ClientError> {
        if max_keys == 0 || max_keys > MAX_SCAN_KEYS {
            return Err(ClientError::Invalid(format!("a scan page of {max_keys} keys (1 to {MAX_SCAN_KEYS})")));
        }
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let result = self.scan_exchange(shard, request_id, cursor, max_keys);
        if matches!(result, Err(ClientError::Connection(_) | ClientError::Timeout | ClientError::Protocol(_)))
            && let Some(peer) = self.peers.get_mut(shard)
        {
            peer.connection = None;
        }
        result
    }

    fn scan_exchange(
        &mut self,
        shard: usize,
        request_id: u64,
        cursor: u32,
        max_keys: u32,
    ) -> Result<ScanPage, ClientError> {
        let connection = self.connection(shard)?;
        let wanted = RequestItemHeader { value_len: max_keys, offset: cursor, ..Default::default() };
        let (item, data) = connection.ask_one(Opcode::Scan, request_id, wanted, MAX_PAGE_BYTES)?;
        if item.status != Status::Ok {
            return Err(ClientError::from_status(item.status));
        }
        let entries = decode_scan_entries(&data).map_err(|error| ClientError::Protocol(format!("SCAN: {error}")))?;
        Ok(ScanPage { entries, next: (item.object_len != SCAN_DONE).then_some(item.object_len) })
    }
}
