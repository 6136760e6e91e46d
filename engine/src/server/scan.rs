//! SCAN frames: one page of the receiving shard's keys (`Opcode::Scan`, docs/PROTOCOL.md).

use strata_proto::scan::encode_scan_entry;
use strata_proto::{FrameHeader, MAX_SCAN_KEYS, RequestItem, ResponseItemHeader, Status};

use super::connection::Connection;
use super::{ConnectionError, ShardServer, reply_one};
use crate::tenants::Scope;

/// The most bytes of keys one page carries: a page of long keys ends early, with a cursor to go on from.
const MAX_PAGE_BYTES: usize = 1 << 20;

/// Answers a SCAN frame: exactly one item, its `offset` the cursor and its `value len` the keys wanted
/// (1 to `MAX_SCAN_KEYS`; otherwise `INVALID`).
pub(super) async fn handle_scan(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
    items: &[RequestItem<'_>],
    scope: &Scope,
) -> Result<(u64, u64), ConnectionError> {
    // One item: a frame of many would have the shard walk its index many times for one frame.
    let [item] = items else {
        return Err(ConnectionError::Protocol(Status::Invalid, "SCAN takes one item".into()));
    };
    let wanted = item.header.value_len;
    if wanted == 0 || wanted > MAX_SCAN_KEYS {
        reply_one(connection, header, ResponseItemHeader::status(Status::Invalid), &[]).await?;
        return Ok((1, 0));
    }
    let page = server.shard.scan(scope.prefix(), item.header.offset, wanted as usize, MAX_PAGE_BYTES).await;
    let mut data = Vec::with_capacity(page.keys.iter().map(|key| key.key.len() + 7).sum());
    for key in &page.keys {
        encode_scan_entry(&mut data, &key.key, key.value_len, key.tiers, key.replicas);
    }
    let item = ResponseItemHeader {
        status: Status::Ok,
        data_len: data.len() as u32,
        data_crc: strata_proto::crc32c(&data),
        object_len: page.next,
    };
    reply_one(connection, header, item, &data).await.map(|()| (0, 0))
}
