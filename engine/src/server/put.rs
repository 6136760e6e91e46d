//! PUT frames: each item's value read from the socket straight into its DRAM reservation (or, for a key
//! another shard owns, into a buffer that is forwarded), through the shard's one put pipeline
//! (`Shard::admit_put`, `Shard::commit_put`), then one sync per region for the batch's durable items.

use std::collections::VecDeque;
use std::rc::Rc;

use strata_proto::{
    FrameHeader, Links, Opcode, PART_HEADER_BYTES, ProtoError, PutOptions, RequestItemHeader, ResponseItemHeader,
    SharedSpan, Status, decode_item_head, decode_part_header,
};

use super::connection::{Connection, OwnedHead};
use super::{ConnectionError, ShardServer};
use crate::forward::ForwardOp;
use crate::metrics::add;
use crate::peer_limits::PartialClaim;
use crate::shard::{DurablePoint, FillGuard, Prefetch, PutReservation, Shard};
use crate::tenants::Scope;

pub(super) async fn handle_put(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
    scope: &Scope,
) -> Result<Vec<ResponseItemHeader>, ConnectionError> {
    let shard = &server.shard;
    let limits = shard.config.limits;
    let mut statuses = Vec::with_capacity(header.count as usize);
    let mut body = BodyCursor { consumed: 0, len: header.body_len };
    let mut durable: Vec<(usize, DurablePoint)> = Vec::new();
    let mut ahead = VecDeque::with_capacity(3);
    for _ in 0..header.count {
        prefetch_next_puts(shard, connection, scope, &limits, &mut ahead);
        let Some(head) = connection.read_item_head(Opcode::Put, &limits, body.left()).await? else {
            return Err(ProtoError::BodyMismatch { items: body.len + 1, body: body.len }.into());
        };
        body.take(head.len as u64 + head.header.body_value_len(Opcode::Put))?;
        match put_item(server, connection, (scope, header.epoch), head, &mut body).await? {
            Stored::Durable(point) => {
                durable.push((statuses.len(), point));
                statuses.push(ResponseItemHeader::status(Status::Ok));
            }
            Stored::Answered(status) => statuses.push(ResponseItemHeader::status(status)),
            Stored::Moved(answer) => statuses.push(answer),
        }
    }
    if body.consumed != body.len {
        return Err(ProtoError::BodyMismatch { items: body.consumed, body: body.len }.into());
    }
    sync_batch(shard, &durable, &mut statuses).await;
    Ok(statuses)
}

/// How far a put frame's body was consumed: every byte read is counted, and none past the body's length.
struct BodyCursor {
    consumed: u64,
    len: u64,
}

impl BodyCursor {
    fn left(&self) -> u64 {
        self.len - self.consumed
    }

    /// Counts `bytes` more of the body; an item that runs past it breaks the protocol.
    fn take(&mut self, bytes: u64) -> Result<(), ConnectionError> {
        self.consumed += bytes;
        if self.consumed > self.len {
            return Err(ProtoError::BodyMismatch { items: self.consumed, body: self.len }.into());
        }
        Ok(())
    }
}

/// What became of one put item.
enum Stored {
    /// Committed; acknowledged once the log is durable up to this point.
    Durable(DurablePoint),
    /// Answered now.
    Answered(Status),
    /// Not this node's key under a newer membership: MOVED, with the node's epoch.
    Moved(ResponseItemHeader),
}

/// Receives and stores one put item whose head was read: here through the shard's put pipeline, or at the
/// key's owner. Its value is consumed from the stream whatever happens to it.
async fn put_item(
    server: &ShardServer,
    connection: &mut Connection,
    (scope, epoch): (&Scope, u64),
    head: OwnedHead,
    body: &mut BodyCursor,
) -> Result<Stored, ConnectionError> {
    let shard = &server.shard;
    let item = head.header;
    if u64::from(item.value_len) > shard.config.limits.max_value_bytes {
        skip_value(connection, &item, body).await?;
        return Ok(Stored::Answered(Status::TooLarge));
    }
    if let Some(moved) = server.moved(&head.key, epoch) {
        skip_value(connection, &item, body).await?;
        return Ok(Stored::Moved(moved));
    }
    let owner = server.other_owner(&head.key);
    let options = PutOptions::decode(&item, head.version);
    let shared = head.shared;
    let key = scope.scoped_owned(head.key);
    // The parent and the group are scoped like keys, so that tenants never link across.
    let parent = head.parent.map(|name| scope.scoped_owned(name));
    let group = head.group.map(|name| scope.scoped_owned(name));
    let Ok(claim) = claim_arriving_value(shard, connection, scope, &item, key.len()) else {
        add(&shard.metrics.partial_frame_refusals, 1);
        skip_value(connection, &item, body).await?;
        return Ok(Stored::Answered(Status::Quota));
    };
    let stored = match owner {
        Some(owner) => {
            let arrived = receive_value(connection, (&item, shared.as_ref()), body).await?;
            drop(claim);
            let (value, value_crc) = match arrived {
                Ok(arrived) => arrived,
                Err(status) => return Ok(Stored::Answered(status)),
            };
            let op = ForwardOp::Put { value, value_crc, options, parent, group };
            Stored::Answered(server.forward(owner, &key, op).await.status)
        }
        None => {
            let links = Links { parent: parent.as_deref(), group: group.as_deref() };
            put_here(shard, connection, (&key, item, options), (links, shared.as_ref()), body).await?
        }
    };
    Ok(stored)
}

/// Receives a value to forward into a buffer of its own; the status to answer if it failed its crc or
/// named memory the connection does not have.
async fn receive_value(
    connection: &mut Connection,
    (item, shared): (&RequestItemHeader, Option<&SharedSpan>),
    body: &mut BodyCursor,
) -> Result<Result<(Vec<u8>, u32), Status>, ConnectionError> {
    let mut value = vec![0u8; item.value_len as usize];
    if item.is_progressive() {
        let crc = receive_parts(connection, Destination::Buffer(&mut value), None, body).await?;
        return Ok(crc.map(|crc| (value, crc)).ok_or(Status::TransferChecksum));
    }
    Ok(receive_whole(connection, item, shared, &mut value).await?.map(|crc| (value, crc)))
}

/// Receives a whole (not progressive) value into `destination`, from the socket or from the client's
/// shared memory, and checks it against the item's crc: its crc, or the status to answer.
async fn receive_whole(
    connection: &mut Connection,
    item: &RequestItemHeader,
    shared: Option<&SharedSpan>,
    destination: &mut [u8],
) -> Result<Result<u32, Status>, ConnectionError> {
    let crc = match shared {
        None => connection.read_exact_crc(destination).await?,
        Some(span) if let Some(link) = connection.rdma.as_mut() => {
            if let Err(status) = link.read(span, destination).await {
                return Ok(Err(status));
            }
            // Checked on the node's own copy, as for shared memory.
            strata_proto::crc32c(destination)
        }
        Some(span) => {
            let copied = connection.shared.as_ref().is_some_and(|regions| regions.copy_out(span, destination));
            if !copied {
                return Ok(Err(Status::Invalid));
            }
            // Checked on the node's own copy: the client may write its memory meanwhile.
            strata_proto::crc32c(destination)
        }
    };
    Ok(if crc == item.value_crc { Ok(crc) } else { Err(Status::TransferChecksum) })
}

/// Stores a put item of this shard: admitted, its value read from the socket straight into its DRAM
/// reservation (readable as it arrives if progressive), then committed.
async fn put_here(
    shard: &Rc<Shard>,
    connection: &mut Connection,
    (key, item, mut options): (&[u8], RequestItemHeader, PutOptions),
    (links, shared): (Links<'_>, Option<&SharedSpan>),
    body: &mut BodyCursor,
) -> Result<Stored, ConnectionError> {
    let mut reservation = match shard.admit_put(key, item.value_len, &mut options).await {
        Ok(reservation) => reservation,
        Err(error) => {
            skip_value(connection, &item, body).await?;
            return Ok(Stored::Answered(error.status()));
        }
    };
    let key_len = key.len();
    reservation.bytes_mut(0, key_len).copy_from_slice(key);
    // A progressive put is readable (GET_RANGE) as its parts arrive, until it commits; `_fill` ends that
    // when dropped, after the commit.
    let (value_crc, _fill) = if item.is_progressive() {
        let fill = reservation.open_for_reads(key, item.value_len);
        let into = Destination::Reservation(&mut reservation, key_len);
        match receive_parts(connection, into, fill.as_ref(), body).await? {
            Some(crc) => (crc, fill),
            None => return Ok(Stored::Answered(Status::TransferChecksum)),
        }
    } else {
        let value = reservation.bytes_mut(key_len, item.value_len as usize);
        if let Err(status) = receive_whole(connection, &item, shared, value).await? {
            return Ok(Stored::Answered(status));
        }
        (item.value_crc, None)
    };
    Ok(match shard.commit_put(key, reservation, item.value_len, value_crc, options, links).await {
        Ok(Some(point)) => Stored::Durable(point),
        Ok(None) => Stored::Answered(Status::Ok),
        Err(error) => Stored::Answered(error.status()),
    })
}

/// Makes a batch's durable items (puts, or removals' tombstones) durable: one sync per region covers all of
/// its items (the last point of each region is the furthest); a failed sync fails every item of its region.
pub(super) async fn sync_batch(
    shard: &Rc<Shard>,
    durable: &[(usize, DurablePoint)],
    statuses: &mut [ResponseItemHeader],
) {
    for (index, (_, point)) in durable.iter().enumerate() {
        let last_of_region = durable[index + 1..].iter().all(|(_, later)| later.region_key() != point.region_key());
        if last_of_region && let Err(error) = shard.sync(*point).await {
            for (item, other) in durable {
                if other.region_key() == point.region_key() {
                    statuses[*item] = ResponseItemHeader::status(error.status());
                }
            }
        }
    }
}

/// Claims the bytes of a put item's key and value against the partial-frame caps while they arrive:
/// `Ok(None)` when the value is buffered already (nothing waits on the peer), `Err` past a cap.
fn claim_arriving_value(
    shard: &Shard,
    connection: &Connection,
    scope: &Scope,
    item: &RequestItemHeader,
    key_len: usize,
) -> Result<Option<PartialClaim>, ()> {
    if !item.is_progressive() && connection.buffered() as u64 >= item.body_value_len(Opcode::Put) {
        return Ok(None);
    }
    let bytes = key_len as u64 + u64::from(item.value_len);
    connection.peers.claim(scope.id, bytes, &shard.metrics).map(Some).ok_or(())
}

/// Asks for the lines the next put items will touch, in stages (`Shard::prefetch`): the one at the
/// front of the connection's buffered input, the next and the one after. The index and the DRAM tier's
/// bookkeeping are far larger than the cache, so each put's lookups were otherwise misses in a row (the
/// table slot, the entry it names, the replaced object's slot); an item's processing takes longer than
/// a miss, so asked an item or two ahead they hit.
///
/// `ahead` carries, from one item to the next, the hash and length of the items already read ahead,
/// starting with the one at the front (each item is parsed and hashed once, not once per stage); this
/// call drops the front one, which the caller consumes next. Were it ever out of step, only the hints
/// would be wrong.
fn prefetch_next_puts(
    shard: &Shard,
    connection: &Connection,
    scope: &Scope,
    limits: &strata_proto::Limits,
    ahead: &mut VecDeque<(u64, usize)>,
) {
    let stages = [Prefetch::DramSlot, Prefetch::Entry, Prefetch::IndexSlot];
    let buffered = &connection.input[connection.start..connection.end];
    let mut at: usize = ahead.iter().map(|&(_, len)| len).sum();
    while ahead.len() < stages.len() {
        let Some((key, len)) = buffered.get(at..).and_then(|rest| buffered_put_item(rest, limits)) else { break };
        ahead.push_back((crate::index::index_hash(&scope.scoped(key)), len));
        at += len;
    }
    for (&(hash, _), stage) in ahead.iter().zip(stages) {
        shard.prefetch(hash, stage);
    }
    ahead.pop_front();
}

/// The key and the length of the put item at the front of `bytes`, if its head is there (decoded by the
/// protocol's decoder) and its length is known from it (not progressive).
fn buffered_put_item<'a>(bytes: &'a [u8], limits: &strata_proto::Limits) -> Option<(&'a [u8], usize)> {
    let head = decode_item_head(bytes, Opcode::Put, limits).ok()??;
    if head.header.is_progressive() {
        return None;
    }
    Some((head.key, head.len + head.header.body_value_len(Opcode::Put) as usize))
}

/// Skips a refused put item's value: its bytes, or a progressive put's parts.
async fn skip_value(
    connection: &mut Connection,
    item: &RequestItemHeader,
    body: &mut BodyCursor,
) -> Result<(), ConnectionError> {
    if !item.is_progressive() {
        connection.skip(item.body_value_len(Opcode::Put)).await?;
        return Ok(());
    }
    let mut left = u64::from(item.value_len);
    while left > 0 {
        let (len, _) = read_part_header(connection, left, body).await?;
        connection.skip(u64::from(len)).await?;
        left -= u64::from(len);
    }
    Ok(())
}

/// Reads a progressive put's next part header, `(len, crc)`, with `left` bytes of value still to come.
async fn read_part_header(
    connection: &mut Connection,
    left: u64,
    body: &mut BodyCursor,
) -> Result<(u32, u32), ConnectionError> {
    let mut head = [0u8; PART_HEADER_BYTES];
    connection.read_exact(&mut head).await?;
    let (len, crc) = decode_part_header(&head, left)?;
    body.take(PART_HEADER_BYTES as u64)?;
    Ok((len, crc))
}

/// Where a progressive put's value goes: a buffer (a value to forward), or the value's part of a
/// reservation (after its key, `value_at` bytes in), taken part by part so that no slice covers the bytes
/// that readers may already be reading.
enum Destination<'a> {
    Buffer(&'a mut [u8]),
    Reservation(&'a mut PutReservation, usize),
}

impl Destination<'_> {
    fn len(&self) -> usize {
        match self {
            Destination::Buffer(bytes) => bytes.len(),
            Destination::Reservation(reservation, value_at) => reservation.len() - value_at,
        }
    }

    fn part(&mut self, at: usize, len: usize) -> &mut [u8] {
        match self {
            Destination::Buffer(bytes) => &mut bytes[at..at + len],
            Destination::Reservation(reservation, value_at) => reservation.bytes_mut(*value_at + at, len),
        }
    }
}

/// Receives a progressive put's parts into `value`, each checked against its crc before its bytes become
/// readable through `fill`; returns the whole value's crc, or `None` if a part failed its crc (the remaining
/// parts are still consumed, so the stream stays in step).
async fn receive_parts(
    connection: &mut Connection,
    mut value: Destination<'_>,
    fill: Option<&FillGuard>,
    body: &mut BodyCursor,
) -> Result<Option<u32>, ConnectionError> {
    let mut at = 0usize;
    let mut crc = 0u32;
    let mut intact = true;
    let value_len = value.len();
    while at < value_len {
        let (len, part_crc) = read_part_header(connection, (value_len - at) as u64, body).await?;
        let received = connection.read_exact_crc(value.part(at, len as usize)).await?;
        at += len as usize;
        intact &= received == part_crc;
        if intact {
            crc = strata_proto::crc32c_combine(crc, received, len as usize);
            if let Some(fill) = fill {
                fill.advance(at as u32);
            }
        }
    }
    Ok(intact.then_some(crc))
}

#[cfg(test)]
mod tests {
    use strata_proto::{ITEM_LINKS, ITEM_PROGRESSIVE, Limits, REQUEST_ITEM_BYTES};

    use super::*;

    fn item(key: &[u8], value_len: u32, flags: u16, out: &mut Vec<u8>) {
        RequestItemHeader { key_len: key.len() as u16, value_len, flags, ..Default::default() }.encode_into(out);
        out.extend_from_slice(key);
        out.extend(std::iter::repeat_n(7u8, value_len as usize));
    }

    #[test]
    fn buffered_put_items_are_read_ahead_only_when_whole_and_plain() {
        let limits = Limits::default();
        let mut body = Vec::new();
        item(b"first", 64, 0, &mut body);
        let second_at = body.len();
        item(b"second-key", 3, 0, &mut body);
        assert_eq!(buffered_put_item(&body, &limits), Some((&b"first"[..], second_at)));
        assert_eq!(buffered_put_item(&body[second_at..], &limits), Some((&b"second-key"[..], body.len() - second_at)));
        // A key cut short by the end of the buffered input, a header cut short, nothing at all.
        assert_eq!(buffered_put_item(&body[second_at..second_at + REQUEST_ITEM_BYTES + 4], &limits), None);
        assert_eq!(buffered_put_item(&body[..REQUEST_ITEM_BYTES - 1], &limits), None);
        assert_eq!(buffered_put_item(&[], &limits), None);
        // Items whose length depends on more than their header: not read ahead.
        for flags in [ITEM_LINKS, ITEM_PROGRESSIVE] {
            let mut other = Vec::new();
            item(b"k", 8, flags, &mut other);
            assert_eq!(buffered_put_item(&other, &limits), None, "flags {flags:#x}");
        }
        // A header the decoder refuses (a key longer than the node allows) is not read ahead either.
        let mut long = Vec::new();
        RequestItemHeader { key_len: u16::MAX, value_len: 1, ..Default::default() }.encode_into(&mut long);
        let small = Limits { max_key_bytes: 16, ..Limits::default() };
        assert_eq!(buffered_put_item(&long, &small), None);
    }
}
