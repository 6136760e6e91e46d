//! Decoding requests: the head of one item (its fixed header, its key, an upsert's version and a put's
//! links block), the items
//! of a body that is in memory, and a whole frame. The node runs these very functions: it reads a put
//! item's head with [`decode_item_head`] as the bytes arrive and streams the value that follows, and it
//! decodes every other body with [`decode_request_body`]. [`decode_request_frame`], which the fuzz target
//! drives, is the two composed over a frame in memory.

use crate::codes::{Opcode, ProtoError};
use crate::frame::{FRAME_HEADER_BYTES, FrameHeader};
use crate::items::{HelloRequest, LINKS_HEADER_BYTES, Links, PART_HEADER_BYTES, RequestItemHeader, decode_part_header};
use crate::limits::{Limits, REQUEST_ITEM_BYTES};
use crate::shared::{SHARED_SPAN_BYTES, SharedSpan};
use crate::version::{VERSION_BYTES, Version};

/// The head of a request item: what comes before its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemHead<'a> {
    /// Its header.
    pub header: RequestItemHeader,
    /// Its key.
    pub key: &'a [u8],
    /// An upsert's version.
    pub version: Option<Version>,
    /// What a put links it to.
    pub links: Links<'a>,
    /// Where a shared item's value lies in the client's memory ([`ITEM_SHARED`](crate::ITEM_SHARED)).
    pub shared: Option<SharedSpan>,
    /// Bytes of the head (header, key, version, span, links block).
    pub len: usize,
}

/// The longest head an item of `limits` may have: its header, the longest key and, for a put, a links
/// version and a links block naming the longest parent and group.
pub fn max_item_head_bytes(limits: &Limits) -> usize {
    REQUEST_ITEM_BYTES + 3 * limits.max_key_bytes as usize + VERSION_BYTES + SHARED_SPAN_BYTES + LINKS_HEADER_BYTES
}

/// Decodes the head of the `opcode` item at the start of `bytes`: `Ok(None)` if `bytes` end before it
/// does (a streaming reader reads on; the head is never longer than [`max_item_head_bytes`]).
pub fn decode_item_head<'a>(
    bytes: &'a [u8],
    opcode: Opcode,
    limits: &Limits,
) -> Result<Option<ItemHead<'a>>, ProtoError> {
    let Some(fixed) = bytes.get(..REQUEST_ITEM_BYTES) else { return Ok(None) };
    let header = RequestItemHeader::decode(fixed, opcode, limits)?;
    let key_end = REQUEST_ITEM_BYTES + usize::from(header.key_len);
    let Some(key) = bytes.get(REQUEST_ITEM_BYTES..key_end) else { return Ok(None) };
    let (version, version_end) = if opcode == Opcode::Put && header.has_version() {
        let Some(version) = bytes.get(key_end..).and_then(Version::decode) else { return Ok(None) };
        (Some(version), key_end + VERSION_BYTES)
    } else {
        (None, key_end)
    };
    let (shared, span_end) = if header.is_shared() {
        let Some(span) = bytes.get(version_end..).and_then(SharedSpan::decode) else { return Ok(None) };
        if opcode == Opcode::Put && span.len != header.value_len {
            return Err(ProtoError::Field("a shared put's span length differs from its value length"));
        }
        (Some(span), version_end + SHARED_SPAN_BYTES)
    } else {
        (None, version_end)
    };
    if opcode != Opcode::Put || !header.has_links() {
        return Ok(Some(ItemHead { header, key, version, links: Links::NONE, shared, len: span_end }));
    }
    let links_at = span_end;
    let Some(links_header) = bytes.get(links_at..links_at + LINKS_HEADER_BYTES) else { return Ok(None) };
    let (parent_len, group_len) = Links::decode_header(links_header, limits)?;
    let end = links_at + LINKS_HEADER_BYTES + parent_len + group_len;
    if bytes.len() < end {
        return Ok(None);
    }
    let (links, links_len) = Links::decode(&bytes[links_at..end], limits)?;
    Ok(Some(ItemHead { header, key, version, links, shared, len: links_at + links_len }))
}

/// One item of a decoded request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestItem<'a> {
    /// Its header.
    pub header: RequestItemHeader,
    /// Its key.
    pub key: &'a [u8],
    /// An upsert's version.
    pub version: Option<Version>,
    /// What a put links it to.
    pub links: Links<'a>,
    /// Where a shared item's value lies in the client's memory.
    pub shared: Option<SharedSpan>,
    /// Its value (puts), else empty. For a progressive put: its parts with their headers, as sent (the
    /// framing is checked: the part lengths add up to the value length).
    pub value: &'a [u8],
}

/// A whole request frame decoded from memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestFrame<'a> {
    /// A HELLO.
    Hello(FrameHeader, HelloRequest),
    /// Any data opcode with its items.
    Items(FrameHeader, Vec<RequestItem<'a>>),
}

/// Decodes the items of the body of a request whose header is `header` (checked already): every item's
/// head and value, and that they fill the body exactly.
pub fn decode_request_body<'a>(
    header: &FrameHeader,
    body: &'a [u8],
    limits: &Limits,
) -> Result<Vec<RequestItem<'a>>, ProtoError> {
    let mut items = Vec::with_capacity(header.count.min(limits.max_batch_items) as usize);
    let mut at = 0usize;
    for _ in 0..header.count {
        let rest = &body[at..];
        let Some(head) = decode_item_head(rest, header.opcode, limits)? else {
            return Err(ProtoError::BodyMismatch { items: body.len() as u64 + 1, body: body.len() as u64 });
        };
        let value_len = if header.opcode == Opcode::Put && head.header.is_progressive() {
            progressive_len(&rest[head.len..], head.header.value_len)?
        } else {
            head.header.body_value_len(header.opcode) as usize
        };
        let end = head.len + value_len;
        if rest.len() < end {
            return Err(ProtoError::BodyMismatch { items: (at + end) as u64, body: body.len() as u64 });
        }
        let value = &rest[head.len..end];
        items.push(RequestItem {
            header: head.header,
            key: head.key,
            version: head.version,
            links: head.links,
            shared: head.shared,
            value,
        });
        at += end;
    }
    if at != body.len() {
        return Err(ProtoError::BodyMismatch { items: at as u64, body: body.len() as u64 });
    }
    Ok(items)
}

/// Decodes one request frame from `bytes` (header and body) with the checks the node applies: header,
/// bounds, every item, and that the items fill the body exactly.
pub fn decode_request_frame<'a>(bytes: &'a [u8], limits: &Limits) -> Result<RequestFrame<'a>, ProtoError> {
    let header = FrameHeader::decode(bytes)?;
    header.check_request(limits)?;
    let body = &bytes[FRAME_HEADER_BYTES..];
    if (body.len() as u64) < header.body_len {
        return Err(ProtoError::Truncated {
            needed: FRAME_HEADER_BYTES + header.body_len as usize,
            available: bytes.len(),
        });
    }
    let body = &body[..header.body_len as usize];
    if header.opcode == Opcode::Hello {
        return Ok(RequestFrame::Hello(header, HelloRequest::decode(body)?));
    }
    Ok(RequestFrame::Items(header, decode_request_body(&header, body, limits)?))
}

/// Bytes a progressive value of `value_len` takes at the start of `bytes` (parts with their headers).
fn progressive_len(bytes: &[u8], value_len: u32) -> Result<usize, ProtoError> {
    let mut at = 0usize;
    let mut left = u64::from(value_len);
    while left > 0 {
        let (len, _) = decode_part_header(bytes.get(at..).unwrap_or(&[]), left)?;
        left -= u64::from(len);
        at += PART_HEADER_BYTES + len as usize;
        if at > bytes.len() {
            return Err(ProtoError::Truncated { needed: at, available: bytes.len() });
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::items::{ITEM_LINKS, ITEM_UPSERT, PutOptions};

    #[test]
    fn an_item_head_is_decoded_once_all_of_it_is_there() {
        let mut bytes = Vec::new();
        RequestItemHeader { key_len: 3, flags: ITEM_LINKS, value_len: 5, ..Default::default() }.encode_into(&mut bytes);
        bytes.extend_from_slice(b"key");
        Links::parent(b"parent").encode_into(&mut bytes);
        bytes.extend_from_slice(b"value");
        let limits = Limits::default();
        let head_len = bytes.len() - 5;
        for cut in 0..head_len {
            assert_eq!(decode_item_head(&bytes[..cut], Opcode::Put, &limits), Ok(None), "cut at {cut}");
        }
        let head = decode_item_head(&bytes, Opcode::Put, &limits).expect("valid").expect("whole");
        assert_eq!((head.key, head.links, head.len), (&b"key"[..], Links::parent(b"parent"), head_len));
        assert!(head.len <= max_item_head_bytes(&limits));
        // A header the decoder refuses is refused before the rest arrives.
        let mut bad = bytes.clone();
        bad[2] = 0x80;
        assert!(decode_item_head(&bad[..REQUEST_ITEM_BYTES], Opcode::Put, &limits).is_err());
    }

    #[test]
    fn an_upserts_version_comes_between_its_key_and_its_links() {
        let version = Version { epoch: 9, sequence: 77 };
        let options = PutOptions { upsert: true, version: Some(version), replicas: 3, ..PutOptions::default() };
        let (flags, offset) = options.encode();
        let mut bytes = Vec::new();
        RequestItemHeader { key_len: 3, flags: flags | ITEM_LINKS, value_len: 2, offset, ..Default::default() }
            .encode_into(&mut bytes);
        bytes.extend_from_slice(b"key");
        bytes.extend_from_slice(&version.encode());
        Links::group(b"g").encode_into(&mut bytes);
        let head_len = bytes.len();
        bytes.extend_from_slice(b"vv");
        let limits = Limits::default();
        for cut in 0..head_len {
            assert_eq!(decode_item_head(&bytes[..cut], Opcode::Put, &limits), Ok(None), "cut at {cut}");
        }
        let head = decode_item_head(&bytes, Opcode::Put, &limits).expect("valid").expect("whole");
        assert_eq!((head.version, head.links, head.len), (Some(version), Links::group(b"g"), head_len));
        assert_eq!(PutOptions::decode(&head.header, head.version), options, "version and replica count");
        // A version on a plain put is refused: only an upsert replaces by version.
        let mut plain = bytes.clone();
        plain[2..4].copy_from_slice(&(flags & !ITEM_UPSERT | ITEM_LINKS).to_le_bytes());
        assert!(decode_item_head(&plain, Opcode::Put, &limits).is_err());
    }

    #[test]
    fn a_shared_items_value_is_in_the_clients_memory_not_in_the_body() {
        use crate::shared::{ITEM_SHARED, SharedSpan};
        let limits = Limits::default();
        let span = SharedSpan { region: 1, len: 4096, offset: 8192 };
        let mut body = Vec::new();
        RequestItemHeader { key_len: 3, flags: ITEM_SHARED, value_len: 4096, value_crc: 7, ..Default::default() }
            .encode_into(&mut body);
        body.extend_from_slice(b"put");
        span.encode_into(&mut body);
        let frame = FrameHeader::request(Opcode::Put, 1, 1, body.len() as u64);
        let items = decode_request_body(&frame, &body, &limits).expect("a shared put");
        assert_eq!((items[0].shared, items[0].value.len()), (Some(span), 0), "no value bytes follow");
        for cut in 0..body.len() {
            assert_eq!(decode_item_head(&body[..cut], Opcode::Put, &limits), Ok(None), "cut at {cut}");
        }
        // A put's span must be as long as its value.
        let mut bad = body.clone();
        bad[REQUEST_ITEM_BYTES + 3 + 4..REQUEST_ITEM_BYTES + 3 + 8].copy_from_slice(&4095u32.to_le_bytes());
        assert!(decode_item_head(&bad, Opcode::Put, &limits).is_err());
        // A get's span is the room the client offers; it may not also ask for the object's version.
        let mut get = Vec::new();
        RequestItemHeader { key_len: 3, flags: ITEM_SHARED, ..Default::default() }.encode_into(&mut get);
        get.extend_from_slice(b"get");
        span.encode_into(&mut get);
        let frame = FrameHeader::request(Opcode::Get, 2, 1, get.len() as u64);
        assert_eq!(decode_request_body(&frame, &get, &limits).expect("a shared get")[0].shared, Some(span));
        get[2..4].copy_from_slice(&(ITEM_SHARED | crate::items::ITEM_WITH_VERSION).to_le_bytes());
        assert!(decode_request_body(&frame, &get, &limits).is_err());
        // Only gets and puts name spans.
        let frame = FrameHeader::request(Opcode::Exists, 3, 1, get.len() as u64);
        get[2..4].copy_from_slice(&ITEM_SHARED.to_le_bytes());
        assert!(decode_request_body(&frame, &get, &limits).is_err());
    }
}
