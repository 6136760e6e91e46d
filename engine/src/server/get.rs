//! GET and GET_RANGE frames: each item read here or at its owner, the reply one vectored write of the
//! headers and every value's own memory (the DRAM segment, pinned, or the NVMe read's buffers).

use std::io;
use std::time::Duration;

use strata_proto::{
    FRAME_STREAMED, FrameHeader, ITEM_WITH_VERSION, Opcode, RESPONSE_ITEM_BYTES, RequestItem, ResponseItemHeader,
    Status, VERSION_BYTES,
};

use super::connection::Connection;
use super::shared_regions::CopyFault;
use super::watch::on_socket;
use super::{ConnectionError, ShardServer, count};
use crate::forward::ForwardOp;
use crate::join::{InOrder, LocalFuture, join_in_order};
use crate::shard::{Prefetch, ReadData, ReadHit, Shard};
use crate::tenants::Scope;

/// One item's read: its hit, or the status to answer.
type ItemRead = Result<ReadHit, Status>;

/// Reads one item of a GET / GET_RANGE frame, here or at the key's owner.
async fn read_item(
    server: &ShardServer,
    scope: &Scope,
    user_key: &[u8],
    range: Option<(u32, u32)>,
    wait: Duration,
) -> Result<ReadHit, Status> {
    let key = scope.scoped(user_key);
    match server.other_owner(user_key) {
        None => server.shard.get(&key, range, wait).await.map_err(|error| error.status()),
        Some(owner) => {
            let reply = server.forward(owner, &key, ForwardOp::Get(range, wait)).await;
            if reply.status == Status::Ok {
                Ok(ReadHit {
                    data_crc: reply.data_crc,
                    object_len: reply.object_len,
                    data: ReadData::Owned(reply.data),
                    version: reply.version,
                })
            } else {
                Err(reply.status)
            }
        }
    }
}

pub(super) async fn handle_get<'a>(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
    items: &'a [RequestItem<'a>],
    scope: &Scope,
) -> Result<(u64, u64), ConnectionError> {
    let read = |item: &'a RequestItem<'a>| {
        let range = (header.opcode == Opcode::GetRange).then_some((item.header.offset, item.header.value_len));
        read_item(server, scope, item.key, range, item.header.wait())
    };
    // Items that asked for their version get it before their bytes (ITEM_WITH_VERSION).
    let with_version: Vec<bool> = items.iter().map(|item| item.header.flags & ITEM_WITH_VERSION != 0).collect();
    // Items MOVED (a cluster client under an older membership, see `ownership.rs`) are answered so, unread.
    let moved: Vec<Option<ResponseItemHeader>> =
        items.iter().map(|item| server.moved(item.key, header.epoch)).collect();
    let results: Vec<Result<ReadHit, Status>> = if moved.iter().any(Option::is_some) {
        let reads = items.iter().zip(&moved).map(|(item, moved)| match moved {
            Some(_) => Box::pin(async { Err(Status::Moved) }) as LocalFuture<'_, _>,
            None => Box::pin(read(item)) as LocalFuture<'_, _>,
        });
        join_in_order(reads.collect()).await
    } else if items.iter().any(|item| !item.header.wait().is_zero()) {
        // Items that may wait for their keys wait together: a batch of layers of several requests whose
        // prefills are still sending takes as long as the slowest, not the sum.
        join_in_order(items.iter().map(|item| Box::pin(read(item)) as LocalFuture<'_, _>).collect()).await
    } else {
        // What DRAM answers is answered at once, item by item; the rest (reads from the NVMe tier, items
        // another shard owns) then run together, the device reads bounded by the shard's queue depth.
        let mut results = answer_from_dram(server, scope, header.opcode, items);
        let pending: Vec<usize> = (0..items.len()).filter(|&at| results[at].is_none()).collect();
        if !pending.is_empty() {
            let reads: Vec<LocalFuture<'_, _>> = pending
                .iter()
                .map(|&at| Box::pin(async move { (at, read(&items[at]).await) }) as LocalFuture<'_, _>)
                .collect();
            if streams(connection, items) {
                return stream_reply(connection, header, (results, InOrder::new(reads)), &with_version).await;
            }
            for (at, result) in join_in_order(reads).await {
                results[at] = Some(result);
            }
        }
        results.into_iter().map(|result| result.unwrap_or(Err(Status::NotFound))).collect()
    };
    // Shared items are copied (a local client's) or written by RDMA into the client's memory now; their
    // replies carry no data. MOVED carries the node's epoch.
    let replies: Vec<Reply> = (answer_shared(server, scope, connection, items, results).await.into_iter().zip(moved))
        .map(|(reply, moved)| moved.map_or(reply, Reply::Answered))
        .collect();
    let body_len: u64 = replies
        .iter()
        .zip(&with_version)
        .map(|(reply, &versioned)| {
            let prefix = if versioned { VERSION_BYTES as u64 } else { 0 };
            RESPONSE_ITEM_BYTES as u64 + reply.sent().map_or(0, |hit| prefix + hit.len() as u64)
        })
        .sum();
    FrameHeader {
        opcode: header.opcode,
        flags: 0,
        request_id: header.request_id,
        count: replies.len() as u32,
        status: Status::Ok,
        body_len,
        epoch: 0,
    }
    .encode_into(&mut connection.output);
    write_replies(connection, &replies, &with_version).await?;
    Ok(count(replies.iter().map(Reply::status)))
}

/// Whether a GET's reply streams (FRAME_STREAMED) while some of its items are still being read: to a
/// client that accepted it, for a batch whose values all travel on the socket (a shared item's reply is a
/// header alone, already small).
fn streams(connection: &Connection, items: &[RequestItem<'_>]) -> bool {
    connection.streamed_replies && items.len() > 1 && items.iter().all(|item| item.shared.is_none())
}

/// A streamed run of ready items goes out early only if it carries at least this many bytes: each write
/// costs a system call and a wake-up of a client asleep in its read (25–30 µs together on this project's
/// machines), which a run pays back only if moving it takes as long (about 100 KiB over loopback TCP).
/// Sent item by item, 4 KiB tier gets in batches of 32 lost 2–3 % against whole replies.
const STREAM_RUN_BYTES: usize = 128 << 10;

/// A streamed reply: the frame header at once (no body length), then each run of items that are ready, in
/// order, in one vectored write once it carries [`STREAM_RUN_BYTES`], while the reads of later items go
/// on. An early item is not held back by a late one, and each hit's pin or read buffer is given back as
/// soon as it is sent.
async fn stream_reply(
    connection: &mut Connection,
    header: FrameHeader,
    (mut results, mut reads): (Vec<Option<ItemRead>>, InOrder<'_, (usize, ItemRead)>),
    with_version: &[bool],
) -> Result<(u64, u64), ConnectionError> {
    FrameHeader {
        opcode: header.opcode,
        flags: FRAME_STREAMED,
        request_id: header.request_id,
        count: results.len() as u32,
        status: Status::Ok,
        body_len: 0,
        epoch: 0,
    }
    .encode_into(&mut connection.output);
    let mut statuses = Vec::with_capacity(results.len());
    let mut sent = 0;
    while sent < results.len() {
        while let Some((at, result)) = reads.next_if_done().await {
            results[at] = Some(result);
        }
        let ready = results[sent..].iter().take_while(|result| result.is_some()).count();
        let run_bytes: usize = results[sent..sent + ready].iter().flatten().flatten().map(ReadHit::len).sum();
        let last = sent + ready == results.len();
        if ready == 0 || (!last && run_bytes < STREAM_RUN_BYTES) {
            // The first item not ready is the next read in order: wait for it (every read goes on meanwhile).
            let (at, result) = reads.next().await.unwrap_or((sent + ready, Err(Status::Io)));
            results[at] = Some(result);
            continue;
        }
        let replies: Vec<Reply> = results[sent..sent + ready]
            .iter_mut()
            .map(|result| Reply::Sent(result.take().unwrap_or(Err(Status::NotFound))))
            .collect();
        write_replies(connection, &replies, &with_version[sent..sent + ready]).await?;
        statuses.extend(replies.iter().map(Reply::status));
        sent += ready;
    }
    Ok(count(statuses.into_iter()))
}

/// Writes `replies` (with `connection.output`, which may begin with the frame's header) in one vectored
/// write (a few, past IOV_MAX pieces): the headers from one buffer, each value from its own memory (the DRAM
/// segment, pinned, or the NVMe read's buffers), no copy.
async fn write_replies(
    connection: &mut Connection,
    replies: &[Reply],
    with_version: &[bool],
) -> Result<(), ConnectionError> {
    let mut heads: Vec<usize> = Vec::with_capacity(replies.len());
    for (reply, &versioned) in replies.iter().zip(with_version) {
        match reply {
            Reply::Answered(answer) => answer.encode_into(&mut connection.output),
            Reply::Sent(Ok(hit)) if versioned => {
                let version = hit.version.unwrap_or_default().encode();
                ResponseItemHeader {
                    status: Status::Ok,
                    data_len: (VERSION_BYTES + hit.len()) as u32,
                    data_crc: strata_proto::crc32c_combine(strata_proto::crc32c(&version), hit.data_crc, hit.len()),
                    object_len: hit.object_len,
                }
                .encode_into(&mut connection.output);
                connection.output.extend_from_slice(&version);
            }
            Reply::Sent(Ok(hit)) => ResponseItemHeader {
                status: Status::Ok,
                data_len: hit.len() as u32,
                data_crc: hit.data_crc,
                object_len: hit.object_len,
            }
            .encode_into(&mut connection.output),
            Reply::Sent(Err(status)) => ResponseItemHeader::status(*status).encode_into(&mut connection.output),
        }
        heads.push(connection.output.len());
    }
    let output = std::mem::take(&mut connection.output);
    let mut pieces: Vec<io::IoSlice<'_>> = Vec::with_capacity(replies.len() * 2 + 1);
    let mut head_start = 0usize;
    for (reply, &head_end) in replies.iter().zip(&heads) {
        pieces.push(io::IoSlice::new(&output[head_start..head_end]));
        head_start = head_end;
        if let Some(hit) = reply.sent() {
            pieces.extend(hit.slices().into_iter().filter(|slice| !slice.is_empty()).map(io::IoSlice::new));
        }
    }
    let written = on_socket(&connection.watch, connection.stream.write_all_vectored(&mut pieces)).await;
    drop(pieces);
    connection.output = output;
    connection.output.clear();
    Ok(written?)
}

/// One item's answer: sent on the socket (its value follows its header), or a header alone (a value
/// copied into the client's shared memory, or MOVED with the node's epoch).
enum Reply {
    Sent(Result<ReadHit, Status>),
    Answered(ResponseItemHeader),
}

impl Reply {
    fn sent(&self) -> Option<&ReadHit> {
        match self {
            Reply::Sent(Ok(hit)) => Some(hit),
            _ => None,
        }
    }

    fn status(&self) -> Status {
        match self {
            Reply::Sent(result) => result.as_ref().map_or_else(|status| *status, |_| Status::Ok),
            Reply::Answered(answer) => answer.status,
        }
    }
}

/// Each item's reply, its value moved into the client's memory first for a shared item: copied into a
/// local client's shared memory, or RDMA-written into memory the connection registered (every write of
/// the batch posted before any is waited for; the hits' pins keep their bytes in place until then).
async fn answer_shared(
    server: &ShardServer,
    scope: &Scope,
    connection: &mut Connection,
    items: &[RequestItem<'_>],
    results: Vec<Result<ReadHit, Status>>,
) -> Vec<Reply> {
    let Some(link) = connection.rdma.as_mut().filter(|_| items.iter().any(|item| item.shared.is_some())) else {
        return results
            .into_iter()
            .zip(items)
            .map(|(result, item)| match (result, item.shared) {
                (Ok(hit), Some(span)) => Reply::Answered(match copy_to_client(connection, &span, &hit) {
                    Err(CopyFault::Differs) if !hit.bytes_match_crc() => damaged(server, scope, item.key, &hit),
                    answer => answer.unwrap_or_else(|fault| ResponseItemHeader::status(fault.status())),
                }),
                (result, _) => Reply::Sent(result),
            })
            .collect();
    };
    let mut answers: Vec<Option<ResponseItemHeader>> = vec![None; results.len()];
    let (mut transfers, mut written) = (Vec::new(), Vec::new());
    for (at, (result, item)) in results.iter().zip(items).enumerate() {
        let (Ok(hit), Some(span)) = (result, item.shared) else { continue };
        if hit.len() > span.len as usize {
            answers[at] = Some(too_large(hit));
        } else {
            transfers.push(super::rdma::Transfer { span, pieces: hit.slices() });
            written.push(at);
        }
    }
    for (at, outcome) in written.into_iter().zip(link.write(&transfers).await) {
        // Only hits were written.
        answers[at] = Some(match (outcome, &results[at]) {
            (Ok(()), Ok(hit)) => shared_answer(hit),
            (Err(status), _) | (Ok(()), &Err(status)) => ResponseItemHeader::status(status),
        });
    }
    drop(transfers);
    results
        .into_iter()
        .zip(answers)
        .map(|(result, answer)| answer.map_or(Reply::Sent(result), Reply::Answered))
        .collect()
}

/// Copies a hit into the span of the client's memory its item named, checked there: the answer says how
/// many bytes and their crc32c, or why not: the value does not fit in the span (`TooLarge`, with the
/// value's length), or the copy's fault.
fn copy_to_client(
    connection: &Connection,
    span: &strata_proto::SharedSpan,
    hit: &ReadHit,
) -> Result<ResponseItemHeader, CopyFault> {
    if hit.len() > span.len as usize {
        return Ok(too_large(hit));
    }
    let regions = connection.shared.as_ref().ok_or(CopyFault::NotTheConnections)?;
    regions.copy_into(span, &hit.slices(), hit.data_crc)?;
    Ok(shared_answer(hit))
}

/// The answer to a shared get whose copy differed because the node's own bytes are damaged (they no
/// longer hash to their stored crc): a damaged DRAM copy is dropped (`Shard::drop_damaged_dram`), and the
/// item answered `Checksum`, as a damaged record is. The client's next get reads the tier's record, or
/// misses.
fn damaged(server: &ShardServer, scope: &Scope, user_key: &[u8], hit: &ReadHit) -> ResponseItemHeader {
    if let Some(slot) = hit.dram_slot() {
        server.shard.drop_damaged_dram(&scope.scoped(user_key), slot);
    }
    ResponseItemHeader::status(Status::Checksum)
}

/// A value that does not fit its span: `TooLarge`, with the value's length.
fn too_large(hit: &ReadHit) -> ResponseItemHeader {
    ResponseItemHeader { object_len: hit.len() as u32, ..ResponseItemHeader::status(Status::TooLarge) }
}

/// A value moved into the client's memory: its length and crc32c (checked there by the node for a copy,
/// by the client for an RDMA write).
fn shared_answer(hit: &ReadHit) -> ResponseItemHeader {
    ResponseItemHeader { status: Status::Ok, data_len: 0, data_crc: hit.data_crc, object_len: hit.len() as u32 }
}

/// The items of a batch that DRAM answers (a hit, a miss, a bad range), each checked in order with the
/// lines it will touch asked for in stages up to three items ahead (a batch of small reads is otherwise a
/// chain of misses); `None` for an item that needs a device read or another shard.
fn answer_from_dram(
    server: &ShardServer,
    scope: &Scope,
    opcode: Opcode,
    items: &[RequestItem<'_>],
) -> Vec<Option<Result<ReadHit, Status>>> {
    let shard = &server.shard;
    let hashes = local_hashes(server, scope, items.iter().map(|item| item.key));
    let stages = [Prefetch::DramBytes, Prefetch::DramSlot, Prefetch::Entry, Prefetch::IndexSlot];
    let mut results = Vec::with_capacity(items.len());
    for (at, item) in items.iter().enumerate() {
        prefetch_stages(shard, &hashes, at, &stages);
        let range = (opcode == Opcode::GetRange).then_some((item.header.offset, item.header.value_len));
        let answer = hashes[at]
            .and_then(|hash| shard.get_now(&scope.scoped(item.key), hash, range))
            .map(|result| result.map_err(|error| error.status()));
        results.push(answer);
    }
    results
}

/// Each key's index hash as this shard stores it, or `None` for a key another shard owns (forwarded).
pub(super) fn local_hashes<'a>(
    server: &ShardServer,
    scope: &Scope,
    user_keys: impl Iterator<Item = &'a [u8]>,
) -> Vec<Option<u64>> {
    user_keys
        .map(|user_key| {
            server.other_owner(user_key).is_none().then(|| crate::index::index_hash(&scope.scoped(user_key)))
        })
        .collect()
}

/// Asks for one stage of lines for each of the items from `from` on: `stages[0]` (an operation's last
/// stage) for item `from`, `stages[1]` for the one after, and so on, so that each item gets its stages in
/// order over the calls before it runs (see `put::prefetch_next_puts`).
pub(super) fn prefetch_stages(shard: &Shard, hashes: &[Option<u64>], from: usize, stages: &[Prefetch]) {
    for (ahead, &stage) in stages.iter().enumerate() {
        if let Some(Some(hash)) = hashes.get(from + ahead) {
            shard.prefetch(*hash, stage);
        }
    }
}
