//! REGISTER frames: memory a local client hands the shard (a sealed memfd passed with the frame), or a
//! region it releases. Only a connection over the shard's Unix socket has regions; over TCP every
//! REGISTER is refused.

use strata_proto::{FrameHeader, REGISTER_RELEASE, ResponseItemHeader, Status, decode_request_body};

use super::client_stream::ClientStream;
use super::connection::Connection;
use super::{ConnectionError, reply_statuses};

pub(super) async fn handle_register(
    connection: &mut Connection,
    header: FrameHeader,
) -> Result<(u64, u64), ConnectionError> {
    // One item: each takes one descriptor, in order, and a batch would gain nothing.
    if header.count != 1 {
        return Err(ConnectionError::Protocol(Status::Invalid, "REGISTER takes one item".into()));
    }
    let mut body = vec![0u8; header.body_len as usize];
    connection.read_exact(&mut body).await?;
    let limits = strata_proto::Limits { max_batch_items: 1, ..strata_proto::Limits::default() };
    let items = decode_request_body(&header, &body, &limits)?;
    let item = items[0].header;
    let answer = match (&mut connection.stream, connection.shared.as_mut()) {
        (ClientStream::Local(socket), Some(regions)) => {
            if item.flags & REGISTER_RELEASE != 0 {
                let released = regions.release(item.offset);
                ResponseItemHeader::status(if released { Status::Ok } else { Status::NotFound })
            } else {
                let registered = socket
                    .take_descriptor()
                    .ok_or(super::shared_regions::RegisterError::NoDescriptor)
                    .and_then(|memory| regions.register(memory));
                match registered {
                    Ok(id) => ResponseItemHeader { status: Status::Ok, data_len: 0, data_crc: 0, object_len: id },
                    Err(error) => {
                        tracing::debug!("REGISTER refused: {error}");
                        ResponseItemHeader::status(error.status())
                    }
                }
            }
        }
        _ => ResponseItemHeader::status(Status::Invalid),
    };
    reply_statuses(connection, header, &[answer]).await
}
