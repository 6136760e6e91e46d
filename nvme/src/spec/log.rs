//! Log pages: the discovery log (NVMe over Fabrics 1.1, 5.3), error information and SMART / health
//! information (NVMe Base 2.0, 5.16.1.2 and 5.16.1.3).

use super::bytes::{get_u16, get_u64, put_str, put_u16, put_u64, read_str};
use super::status::NvmeStatus;

/// Log page identifiers Strata serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogPage {
    /// 01h: error information.
    Error = 0x01,
    /// 02h: SMART / health information.
    Smart = 0x02,
    /// 70h: discovery.
    Discovery = 0x70,
}

impl LogPage {
    /// The page for a LID, if served.
    pub fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0x01 => Self::Error,
            0x02 => Self::Smart,
            0x70 => Self::Discovery,
            _ => return None,
        })
    }
}

/// One discovery log page entry, 1024 bytes (NVMe over Fabrics 1.1, figure 37).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Byte 0: transport type (1: RDMA, 3: TCP).
    pub trtype: u8,
    /// Byte 1: address family (1: IPv4, 2: IPv6).
    pub adrfam: u8,
    /// Byte 2: subsystem type (2: NVM subsystem; 3: current discovery subsystem).
    pub subtype: u8,
    /// Byte 3: transport requirements (bits 1:0 secure channel; 2 = not required).
    pub treq: u8,
    /// Bytes 4..6: port ID.
    pub portid: u16,
    /// Bytes 6..8: controller ID (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Bytes 8..10: admin max submission queue size.
    pub asqsz: u16,
    /// Bytes 32..64: transport service identifier (the port), ASCII, space padded.
    pub trsvcid: String,
    /// Bytes 256..512: subsystem NQN.
    pub subnqn: String,
    /// Bytes 512..768: transport address, ASCII, space padded.
    pub traddr: String,
    /// Bytes 768..771, the start of the transport-specific address subtype (TSAS): for TCP the security
    /// type (0: none) then zeroes; for RDMA the QP service type, provider type and connection management
    /// ([`DiscoveryEntry::TSAS_RDMA`]).
    pub tsas: [u8; 3],
}

impl DiscoveryEntry {
    /// Encoded size.
    pub const BYTES: usize = 1024;
    /// TRTYPE for TCP.
    pub const TRTYPE_TCP: u8 = 3;
    /// TRTYPE for RDMA.
    pub const TRTYPE_RDMA: u8 = 1;
    /// TSAS of a TCP port without security.
    pub const TSAS_TCP: [u8; 3] = [0, 0, 0];
    /// TSAS of an RDMA port: reliable connected queue pairs (1), no provider specified (1), RDMA_CM (1).
    pub const TSAS_RDMA: [u8; 3] = [1, 1, 1];
    /// SUBTYPE of an NVM subsystem.
    pub const SUBTYPE_NVM: u8 = 2;
    /// SUBTYPE of the discovery subsystem answering (NVMe-oF 1.1 "current discovery subsystem").
    pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;

    fn encode_into(&self, bytes: &mut [u8]) {
        bytes[0] = self.trtype;
        bytes[1] = self.adrfam;
        bytes[2] = self.subtype;
        bytes[3] = self.treq;
        put_u16(bytes, 4, self.portid);
        put_u16(bytes, 6, self.cntlid);
        put_u16(bytes, 8, self.asqsz);
        put_str(bytes, 32, 32, &self.trsvcid, b' ');
        put_str(bytes, 256, 256, &self.subnqn, 0);
        put_str(bytes, 512, 256, &self.traddr, b' ');
        bytes[768..771].copy_from_slice(&self.tsas);
    }

    fn decode(bytes: &[u8]) -> Self {
        Self {
            trtype: bytes[0],
            adrfam: bytes[1],
            subtype: bytes[2],
            treq: bytes[3],
            portid: get_u16(bytes, 4),
            cntlid: get_u16(bytes, 6),
            asqsz: get_u16(bytes, 8),
            trsvcid: read_str(bytes, 32, 32),
            subnqn: read_str(bytes, 256, 256),
            traddr: read_str(bytes, 512, 256),
            tsas: [bytes[768], bytes[769], bytes[770]],
        }
    }
}

/// The discovery log page: a 1024-byte header (GENCTR, NUMREC, RECFMT) and its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryLog {
    /// Bytes 0..8: generation counter, changed whenever the log changes.
    pub generation: u64,
    /// The entries (NUMREC, bytes 8..16, is their count).
    pub entries: Vec<DiscoveryEntry>,
}

impl DiscoveryLog {
    /// Size of the header.
    pub const HEADER_BYTES: usize = 1024;

    /// The whole page.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; Self::HEADER_BYTES + self.entries.len() * DiscoveryEntry::BYTES];
        put_u64(&mut bytes, 0, self.generation);
        put_u64(&mut bytes, 8, self.entries.len() as u64);
        put_u16(&mut bytes, 16, 0); // RECFMT
        for (index, entry) in self.entries.iter().enumerate() {
            let at = Self::HEADER_BYTES + index * DiscoveryEntry::BYTES;
            entry.encode_into(&mut bytes[at..at + DiscoveryEntry::BYTES]);
        }
        bytes
    }

    /// The record count in a header (`None` if shorter than 16 bytes).
    pub fn record_count(header: &[u8]) -> Option<u64> {
        (header.len() >= 16).then(|| get_u64(header, 8))
    }

    /// Decodes a page; entries beyond the bytes given are left out.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let count = Self::record_count(bytes)?;
        let available = bytes.len().saturating_sub(Self::HEADER_BYTES) / DiscoveryEntry::BYTES;
        let entries = (0..(count as usize).min(available))
            .map(|index| {
                let at = Self::HEADER_BYTES + index * DiscoveryEntry::BYTES;
                DiscoveryEntry::decode(&bytes[at..at + DiscoveryEntry::BYTES])
            })
            .collect();
        Some(Self { generation: get_u64(bytes, 0), entries })
    }
}

/// SMART / health information, 512 bytes (NVMe Base 2.0, figure 207). Counters are kept honestly by the
/// target: data units are thousands of 512-byte units, rounded up, as the specification says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmartLog {
    /// Bytes 1..3: composite temperature in kelvins (0: not reported; a RAM or file namespace has none).
    pub temperature_kelvin: u16,
    /// Byte 3: available spare, percent.
    pub available_spare: u8,
    /// Byte 5: percentage used.
    pub percentage_used: u8,
    /// Bytes 32..48: data units read.
    pub data_units_read: u64,
    /// Bytes 48..64: data units written.
    pub data_units_written: u64,
    /// Bytes 64..80: host read commands.
    pub host_reads: u64,
    /// Bytes 80..96: host write commands.
    pub host_writes: u64,
    /// Bytes 128..144: power-on hours.
    pub power_on_hours: u64,
    /// Bytes 160..176: media and data integrity errors.
    pub media_errors: u64,
    /// Bytes 176..192: number of error information log entries over the controller's life.
    pub error_entries: u64,
}

impl SmartLog {
    /// Encoded size.
    pub const BYTES: usize = 512;

    /// The 512 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; Self::BYTES];
        put_u16(&mut bytes, 1, self.temperature_kelvin);
        bytes[3] = self.available_spare;
        bytes[4] = 10; // available spare threshold
        bytes[5] = self.percentage_used;
        put_u64(&mut bytes, 32, self.data_units_read);
        put_u64(&mut bytes, 48, self.data_units_written);
        put_u64(&mut bytes, 64, self.host_reads);
        put_u64(&mut bytes, 80, self.host_writes);
        put_u64(&mut bytes, 128, self.power_on_hours);
        put_u64(&mut bytes, 160, self.media_errors);
        put_u64(&mut bytes, 176, self.error_entries);
        bytes
    }

    /// Data units (thousands of 512-byte units, rounded up) for a byte count.
    pub fn data_units(bytes: u64) -> u64 {
        (bytes / 512).div_ceil(1000)
    }
}

/// One error information log entry, 64 bytes (NVMe Base 2.0, figure 205).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorLogEntry {
    /// Bytes 0..8: error count, unique and increasing (0 marks an empty entry).
    pub error_count: u64,
    /// Bytes 8..10: submission queue ID.
    pub sqid: u16,
    /// Bytes 10..12: command ID.
    pub cid: u16,
    /// Bytes 12..14: status field (bits 15:1, phase tag bit 0 clear).
    pub status: NvmeStatus,
    /// Bytes 16..24: LBA.
    pub lba: u64,
    /// Bytes 24..28: namespace.
    pub nsid: u32,
}

impl ErrorLogEntry {
    /// Encoded size.
    pub const BYTES: usize = 64;

    /// Appends the 64 bytes.
    pub fn encode_into(&self, bytes: &mut Vec<u8>) {
        let mut entry = [0u8; Self::BYTES];
        put_u64(&mut entry, 0, self.error_count);
        put_u16(&mut entry, 8, self.sqid);
        put_u16(&mut entry, 10, self.cid);
        put_u16(&mut entry, 12, self.status.to_field() << 1);
        put_u16(&mut entry, 14, 0xffff); // parameter error location: not specified
        put_u64(&mut entry, 16, self.lba);
        entry[24..28].copy_from_slice(&self.nsid.to_le_bytes());
        entry[29] = DiscoveryEntry::TRTYPE_TCP;
        bytes.extend_from_slice(&entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_log_fields_sit_at_the_offsets_of_figures_36_and_37() {
        let entry = DiscoveryEntry {
            trtype: DiscoveryEntry::TRTYPE_TCP,
            adrfam: 1,
            subtype: DiscoveryEntry::SUBTYPE_NVM,
            treq: 2,
            portid: 1,
            cntlid: 0xffff,
            asqsz: 32,
            trsvcid: "4420".into(),
            subnqn: "nqn.2026-12.io.strata:a".into(),
            traddr: "127.0.0.1".into(),
            tsas: DiscoveryEntry::TSAS_TCP,
        };
        let rdma =
            DiscoveryEntry { trtype: DiscoveryEntry::TRTYPE_RDMA, tsas: DiscoveryEntry::TSAS_RDMA, ..entry.clone() };
        let log = DiscoveryLog { generation: 9, entries: vec![entry, rdma] };
        let bytes = log.encode();
        assert_eq!(bytes.len(), 1024 + 2 * 1024);
        assert_eq!(&bytes[0..8], &9u64.to_le_bytes());
        assert_eq!(&bytes[8..16], &2u64.to_le_bytes());
        let first = &bytes[1024..2048];
        assert_eq!(first[0], 3, "TRTYPE TCP");
        assert_eq!(first[2], 2, "SUBTYPE NVM");
        assert_eq!(&first[6..8], &[0xff, 0xff]);
        assert_eq!(&first[32..37], b"4420 ", "TRSVCID is space padded");
        assert_eq!(&first[256..260], b"nqn.");
        assert_eq!(&first[512..521], b"127.0.0.1");
        let second = &bytes[2048..3072];
        assert_eq!((second[0], &second[768..771]), (1, &[1u8, 1, 1][..]), "TRTYPE RDMA, its TSAS: RC, none, RDMA_CM");
        assert_eq!(DiscoveryLog::decode(&bytes), Some(log));
        assert_eq!(DiscoveryLog::decode(&bytes[..2048]).map(|log| log.entries.len()), Some(1));
    }

    #[test]
    fn smart_and_error_entries_have_their_sizes_and_offsets() {
        let smart = SmartLog { data_units_read: 3, host_writes: 7, ..SmartLog::default() };
        let bytes = smart.encode();
        assert_eq!(bytes.len(), 512);
        assert_eq!(&bytes[32..40], &3u64.to_le_bytes());
        assert_eq!(&bytes[80..88], &7u64.to_le_bytes());
        assert_eq!(SmartLog::data_units(512 * 1000), 1);
        assert_eq!(SmartLog::data_units(512 * 1001), 2, "rounded up");
        let mut bytes = Vec::new();
        ErrorLogEntry { error_count: 1, sqid: 1, cid: 5, status: NvmeStatus::LBA_OUT_OF_RANGE, lba: 9, nsid: 1 }
            .encode_into(&mut bytes);
        assert_eq!(bytes.len(), 64);
        assert_eq!(get_u16(&bytes, 12) >> 1, 0x80);
        assert_eq!(get_u64(&bytes, 16), 9);
    }
}
