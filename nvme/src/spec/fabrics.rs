//! Fabrics Connect data and the controller properties a host reads and writes with Property Get/Set.

use super::NQN_MAX_BYTES;
use super::bytes::{get_u16, put_str, put_u16, read_str};

/// The Connect command's data, 1024 bytes (NVMe over Fabrics 1.1, figure 20).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    /// Bytes 0..16: host identifier (a UUID).
    pub host_id: [u8; 16],
    /// Bytes 16..18: the controller to attach an I/O queue to; 0xFFFF on the admin queue (dynamic model).
    pub cntlid: u16,
    /// Bytes 256..512: the subsystem NQN.
    pub subnqn: String,
    /// Bytes 512..768: the host NQN.
    pub hostnqn: String,
}

impl ConnectData {
    /// Encoded size.
    pub const BYTES: usize = 1024;
    /// CNTLID of an admin-queue Connect under the dynamic controller model.
    pub const DYNAMIC_CNTLID: u16 = 0xffff;

    /// The 1024 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; Self::BYTES];
        bytes[0..16].copy_from_slice(&self.host_id);
        put_u16(&mut bytes, 16, self.cntlid);
        put_str(&mut bytes, 256, 256, &self.subnqn, 0);
        put_str(&mut bytes, 512, 256, &self.hostnqn, 0);
        bytes
    }

    /// Decodes the data, or `None` when it is shorter than 1024 bytes or an NQN is not NUL-terminated
    /// within its 223 bytes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < Self::BYTES {
            return None;
        }
        let nqn_terminated = |at: usize| bytes[at..at + NQN_MAX_BYTES + 1].contains(&0);
        if !nqn_terminated(256) || !nqn_terminated(512) {
            return None;
        }
        let mut host_id = [0u8; 16];
        host_id.copy_from_slice(&bytes[0..16]);
        Some(Self {
            host_id,
            cntlid: get_u16(bytes, 16),
            subnqn: read_str(bytes, 256, 256),
            hostnqn: read_str(bytes, 512, 256),
        })
    }
}

/// Controller properties (NVMe Base 2.0, figure 33): offset and size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Property {
    /// Controller Capabilities, 8 bytes at 0x00.
    Cap,
    /// Version, 4 bytes at 0x08.
    Vs,
    /// Controller Configuration, 4 bytes at 0x14.
    Cc,
    /// Controller Status, 4 bytes at 0x1c.
    Csts,
}

impl Property {
    /// The property at this offset, if Strata implements it.
    pub fn from_offset(offset: u32) -> Option<Self> {
        Some(match offset {
            0x00 => Self::Cap,
            0x08 => Self::Vs,
            0x14 => Self::Cc,
            0x1c => Self::Csts,
            _ => return None,
        })
    }

    /// Its offset.
    pub fn offset(self) -> u32 {
        match self {
            Self::Cap => 0x00,
            Self::Vs => 0x08,
            Self::Cc => 0x14,
            Self::Csts => 0x1c,
        }
    }

    /// Its size in bytes (4 or 8).
    pub fn size(self) -> u8 {
        if self == Self::Cap { 8 } else { 4 }
    }
}

/// CAP fields (NVMe Base 2.0, figure 36).
pub mod cap {
    /// CAP for a controller with `max_queue_entries` entries per queue (MQES is 0's based), a ready timeout
    /// in 500 ms units, the NVM command set, and 4 KiB memory pages.
    pub fn encode(max_queue_entries: u16, timeout_500ms: u8) -> u64 {
        let mqes = u64::from(max_queue_entries.saturating_sub(1));
        let cqr = 1u64 << 16; // contiguous queues required: there is no memory to map on fabrics
        let to = u64::from(timeout_500ms) << 24;
        let css_nvm = 1u64 << 37;
        mqes | cqr | to | css_nvm
    }

    /// Maximum entries per queue (MQES + 1).
    pub fn max_queue_entries(cap: u64) -> u32 {
        (cap & 0xffff) as u32 + 1
    }

    /// Ready timeout in milliseconds.
    pub fn timeout_ms(cap: u64) -> u64 {
        ((cap >> 24) & 0xff) * 500
    }
}

/// CC fields (NVMe Base 2.0, figure 41).
pub mod cc {
    /// Enable.
    pub const ENABLE: u32 = 1;
    /// Shutdown notification, bits 15:14.
    pub const SHUTDOWN_MASK: u32 = 0b11 << 14;
    /// Normal shutdown notification.
    pub const SHUTDOWN_NORMAL: u32 = 0b01 << 14;
    /// I/O submission / completion queue entry sizes as log2 (64 and 16 bytes), bits 19:16 and 23:20.
    pub const IO_QUEUE_ENTRY_SIZES: u32 = (6 << 16) | (4 << 20);
}

/// CSTS fields (NVMe Base 2.0, figure 42).
pub mod csts {
    /// Ready.
    pub const READY: u32 = 1;
    /// Controller fatal status.
    pub const FATAL: u32 = 1 << 1;
    /// Shutdown status: shutdown processing complete (bits 3:2 = 10b).
    pub const SHUTDOWN_COMPLETE: u32 = 0b10 << 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_data_fields_sit_at_the_offsets_of_figure_20() {
        let data = ConnectData {
            host_id: [7; 16],
            cntlid: 0xffff,
            subnqn: "nqn.2026-12.io.strata:pool".into(),
            hostnqn: "nqn.2026-12.io.strata:host".into(),
        };
        let bytes = data.encode();
        assert_eq!(bytes.len(), 1024);
        assert_eq!(&bytes[16..18], &[0xff, 0xff]);
        assert_eq!(&bytes[256..260], b"nqn.");
        assert_eq!(&bytes[512..516], b"nqn.");
        assert_eq!(ConnectData::decode(&bytes), Some(data));
        assert_eq!(ConnectData::decode(&bytes[..1000]), None, "short data is refused");
        let mut unterminated = bytes.clone();
        unterminated[256..512].fill(b'a');
        assert_eq!(ConnectData::decode(&unterminated), None, "an NQN must end within 223 bytes");
    }

    #[test]
    fn cap_encodes_queue_entries_timeout_and_command_set() {
        let value = cap::encode(128, 20);
        assert_eq!(value & 0xffff, 127, "MQES is 0's based");
        assert_eq!(cap::max_queue_entries(value), 128);
        assert_eq!(cap::timeout_ms(value), 10_000);
        assert_ne!(value & (1 << 37), 0, "NVM command set");
        assert_eq!((value >> 48) & 0xf, 0, "MPSMIN 4 KiB");
    }
}
