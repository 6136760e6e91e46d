//! RDMA_CM private data of an NVMe/RDMA connection.
//!
//! ```text
//! REQUEST (host → controller, 32 bytes):  0 RECFMT u16 (0) | 2 QID u16 | 4 HRQSIZE u16 | 6 HSQSIZE u16 |
//!                                         8 CNTLID u16 | 10..32 reserved
//! ACCEPT  (controller → host, 32 bytes):  0 RECFMT u16 (0) | 2 CRQSIZE u16 | 4..32 reserved
//! REJECT  (controller → host, 4 bytes):   0 RECFMT u16 (0) | 2 STS u16
//! ```
//! HSQSIZE is 0's based (the host's submission queue holds HSQSIZE + 1 commands); HRQSIZE is the number of
//! response capsules the host has receives posted for, 1's based. Little-endian throughout.

/// Bytes of a REQUEST's and an ACCEPT's private data.
pub const PRIVATE_DATA_BYTES: usize = 32;
/// Bytes of a REJECT's private data.
pub const REJECT_BYTES: usize = 4;
/// The one record format defined.
pub const RECORD_FORMAT: u16 = 0;
/// The admin queue's depth at most (the controller's receives for its commands).
pub const ADMIN_QUEUE_DEPTH_MAX: u16 = 32;

/// Why a controller rejects a connection (the REJECT's STS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[repr(u16)]
pub enum RejectStatus {
    /// The private data is too short.
    #[error("invalid private data length")]
    InvalidLength = 1,
    /// RECFMT is not 0.
    #[error("invalid record format")]
    InvalidRecordFormat = 2,
    /// The queue ID is not one the controller can create.
    #[error("invalid queue ID")]
    InvalidQueueId = 3,
    /// HSQSIZE is out of bounds.
    #[error("invalid host send queue size")]
    InvalidHostSendQueueSize = 4,
    /// HRQSIZE is out of bounds.
    #[error("invalid host receive queue size")]
    InvalidHostReceiveQueueSize = 5,
    /// The controller has no resources for the queue.
    #[error("no resources")]
    NoResources = 6,
    /// The RDMA READs the host may have in flight (IRD) are too many.
    #[error("invalid IRD")]
    InvalidIrd = 7,
    /// The RDMA READs the host asks the controller to allow (ORD) are too many.
    #[error("invalid ORD")]
    InvalidOrd = 8,
}

impl RejectStatus {
    /// The status of an STS value, if it is one.
    pub fn from_u16(value: u16) -> Option<RejectStatus> {
        use RejectStatus::*;
        [InvalidLength, InvalidRecordFormat, InvalidQueueId, InvalidHostSendQueueSize, InvalidHostReceiveQueueSize]
            .into_iter()
            .chain([NoResources, InvalidIrd, InvalidOrd])
            .find(|status| *status as u16 == value)
    }
}

/// A host's connection request for one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The queue (0: the admin queue).
    pub queue_id: u16,
    /// Response capsules the host can receive at once (1's based).
    pub host_receive_queue_size: u16,
    /// The host's submission queue size, 0's based.
    pub host_send_queue_size: u16,
    /// The controller an I/O queue joins (0xffff or 0 when the host does not say; the Connect command
    /// that follows names it anyway).
    pub controller_id: u16,
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

impl ConnectRequest {
    /// The 32 bytes.
    pub fn encode(&self) -> [u8; PRIVATE_DATA_BYTES] {
        let mut bytes = [0u8; PRIVATE_DATA_BYTES];
        bytes[0..2].copy_from_slice(&RECORD_FORMAT.to_le_bytes());
        bytes[2..4].copy_from_slice(&self.queue_id.to_le_bytes());
        bytes[4..6].copy_from_slice(&self.host_receive_queue_size.to_le_bytes());
        bytes[6..8].copy_from_slice(&self.host_send_queue_size.to_le_bytes());
        bytes[8..10].copy_from_slice(&self.controller_id.to_le_bytes());
        bytes
    }

    /// Reads a request as a controller must: the reject status for private data that is short, of another
    /// format, or asks for queue sizes the controller does not serve (`max_queue_size`: the largest I/O
    /// queue, 1's based).
    pub fn decode(bytes: &[u8], max_queue_size: u16) -> Result<ConnectRequest, RejectStatus> {
        if bytes.len() < PRIVATE_DATA_BYTES {
            return Err(RejectStatus::InvalidLength);
        }
        if u16_at(bytes, 0) != RECORD_FORMAT {
            return Err(RejectStatus::InvalidRecordFormat);
        }
        let request = ConnectRequest {
            queue_id: u16_at(bytes, 2),
            host_receive_queue_size: u16_at(bytes, 4),
            host_send_queue_size: u16_at(bytes, 6),
            controller_id: u16_at(bytes, 8),
        };
        let most = if request.queue_id == 0 { ADMIN_QUEUE_DEPTH_MAX } else { max_queue_size };
        // A submission queue of one entry cannot hold a command while its head moves on.
        if request.host_send_queue_size == 0 || u32::from(request.host_send_queue_size) + 1 > u32::from(most) {
            return Err(RejectStatus::InvalidHostSendQueueSize);
        }
        if request.host_receive_queue_size == 0 || request.host_receive_queue_size > most {
            return Err(RejectStatus::InvalidHostReceiveQueueSize);
        }
        Ok(request)
    }

    /// Commands the controller must have receives posted for: the host's queue, 1's based.
    pub fn commands_in_flight(&self) -> u16 {
        self.host_send_queue_size + 1
    }
}

/// A controller's acceptance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectAccept {
    /// Commands the controller has receives posted for (1's based).
    pub controller_receive_queue_size: u16,
}

impl ConnectAccept {
    /// The 32 bytes.
    pub fn encode(&self) -> [u8; PRIVATE_DATA_BYTES] {
        let mut bytes = [0u8; PRIVATE_DATA_BYTES];
        bytes[2..4].copy_from_slice(&self.controller_receive_queue_size.to_le_bytes());
        bytes
    }

    /// Reads an acceptance as a host must: `None` for private data that is short or of another format.
    pub fn decode(bytes: &[u8]) -> Option<ConnectAccept> {
        (bytes.len() >= 4 && u16_at(bytes, 0) == RECORD_FORMAT)
            .then(|| ConnectAccept { controller_receive_queue_size: u16_at(bytes, 2) })
    }
}

/// A REJECT's 4 bytes.
pub fn encode_reject(status: RejectStatus) -> [u8; REJECT_BYTES] {
    let mut bytes = [0u8; REJECT_BYTES];
    bytes[2..4].copy_from_slice(&(status as u16).to_le_bytes());
    bytes
}

/// A REJECT's status: `None` for bytes that are short, of another format, or an unknown status.
pub fn decode_reject(bytes: &[u8]) -> Option<RejectStatus> {
    (bytes.len() >= REJECT_BYTES && u16_at(bytes, 0) == RECORD_FORMAT)
        .then(|| RejectStatus::from_u16(u16_at(bytes, 2)))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux's nvme-rdma host for an I/O queue 3 of 128 entries on controller 5: RECFMT 0, QID 3,
    /// HRQSIZE 128, HSQSIZE 127 (0's based), CNTLID 5.
    const LINUX_IO_QUEUE: [u8; 10] = [0, 0, 3, 0, 128, 0, 127, 0, 5, 0];

    #[test]
    fn a_request_round_trips_in_the_layout_hosts_send() {
        let request = ConnectRequest::decode(&[&LINUX_IO_QUEUE[..], &[0u8; PRIVATE_DATA_BYTES - 10]].concat(), 1024)
            .expect("a valid request");
        assert_eq!(
            request,
            ConnectRequest { queue_id: 3, host_receive_queue_size: 128, host_send_queue_size: 127, controller_id: 5 }
        );
        assert_eq!(request.commands_in_flight(), 128);
        assert_eq!(&request.encode()[..10], &LINUX_IO_QUEUE);
        assert!(request.encode()[10..].iter().all(|&byte| byte == 0));
    }

    #[test]
    fn bad_requests_get_the_reject_status_the_specification_names() {
        let valid = ConnectRequest {
            queue_id: 0,
            host_receive_queue_size: 32,
            host_send_queue_size: 31,
            controller_id: 0xffff,
        };
        assert!(ConnectRequest::decode(&valid.encode(), 128).is_ok());
        assert_eq!(ConnectRequest::decode(&valid.encode()[..31], 128), Err(RejectStatus::InvalidLength));
        let mut format = valid.encode();
        format[0] = 1;
        assert_eq!(ConnectRequest::decode(&format, 128), Err(RejectStatus::InvalidRecordFormat));
        let deep_admin = ConnectRequest { host_send_queue_size: 32, ..valid };
        assert_eq!(ConnectRequest::decode(&deep_admin.encode(), 128), Err(RejectStatus::InvalidHostSendQueueSize));
        let io = ConnectRequest { queue_id: 1, host_receive_queue_size: 128, host_send_queue_size: 127, ..valid };
        assert!(ConnectRequest::decode(&io.encode(), 128).is_ok());
        let deep_io = ConnectRequest { host_send_queue_size: 128, ..io };
        assert_eq!(ConnectRequest::decode(&deep_io.encode(), 128), Err(RejectStatus::InvalidHostSendQueueSize));
        let no_receives = ConnectRequest { host_receive_queue_size: 0, ..io };
        assert_eq!(ConnectRequest::decode(&no_receives.encode(), 128), Err(RejectStatus::InvalidHostReceiveQueueSize));
        let one_entry = ConnectRequest { host_send_queue_size: 0, ..io };
        assert_eq!(ConnectRequest::decode(&one_entry.encode(), 128), Err(RejectStatus::InvalidHostSendQueueSize));
    }

    #[test]
    fn accept_and_reject_round_trip() {
        let accept = ConnectAccept { controller_receive_queue_size: 128 };
        assert_eq!(&accept.encode()[..4], &[0, 0, 128, 0]);
        assert_eq!(ConnectAccept::decode(&accept.encode()), Some(accept));
        assert_eq!(ConnectAccept::decode(&[1, 0, 128, 0]), None, "another record format");
        assert_eq!(ConnectAccept::decode(&[0, 0]), None, "short");
        for status in (1..=8).filter_map(RejectStatus::from_u16) {
            assert_eq!(decode_reject(&encode_reject(status)), Some(status));
        }
        assert_eq!(RejectStatus::from_u16(9), None);
        assert_eq!(encode_reject(RejectStatus::InvalidQueueId), [0, 0, 3, 0]);
        assert_eq!(decode_reject(&[0, 0, 9, 0]), None, "an unknown status");
    }
}
