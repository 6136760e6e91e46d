//! REGISTER frames: memory a local client hands the shard (a sealed memfd passed with the frame), a span of
//! memory a client registered for RDMA (`REGISTER_REMOTE`, on a connection with a queue pair), or a region
//! it releases. Any other connection's REGISTER is refused.

use strata_proto::{FrameHeader, REGISTER_RELEASE, REGISTER_REMOTE, ResponseItemHeader, Status};

use super::client_stream::ClientStream;
use super::connection::Connection;
use super::{ConnectionError, reply_statuses};

pub(super) async fn handle_register(
    connection: &mut Connection,
    header: FrameHeader,
) -> Result<(u64, u64), ConnectionError> {
    // One item: each takes one descriptor, in order.
    let (item, key) = connection.read_one_item(header, "REGISTER").await?;
    let registered = |id: u32| ResponseItemHeader { status: Status::Ok, data_len: 0, data_crc: 0, object_len: id };
    let released = |found: bool| ResponseItemHeader::status(if found { Status::Ok } else { Status::NotFound });
    let (remote, release) = (item.flags & REGISTER_REMOTE != 0, item.flags & REGISTER_RELEASE != 0);
    let answer = match (&mut connection.stream, connection.shared.as_mut(), connection.rdma.as_mut()) {
        (_, _, Some(link)) if remote && !release => match link.register(&key) {
            Ok(id) => registered(id),
            Err(status) => ResponseItemHeader::status(status),
        },
        (_, _, Some(link)) if release => released(link.release(item.offset)),
        (ClientStream::Local(socket), Some(regions), _) if !remote => {
            if release {
                released(regions.release(item.offset))
            } else {
                let memory = socket
                    .take_descriptor()
                    .ok_or(super::shared_regions::RegisterError::NoDescriptor)
                    .and_then(|memory| regions.register(memory));
                match memory {
                    Ok(id) => registered(id),
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
