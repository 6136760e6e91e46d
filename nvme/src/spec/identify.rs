//! Identify data structures (NVMe Base 2.0, 5.17.2; NVM Command Set 1.0, 4.1.5).

use super::IDENTIFY_BYTES;
use super::bytes::{get_u16, get_u32, get_u64, put_str, put_u16, put_u32, put_u64, read_str};

/// CNTRLTYPE (byte 111 of Identify Controller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerType {
    /// 0: not reported (controllers before NVMe 1.4).
    Unreported,
    /// 1: an I/O controller.
    Io,
    /// 2: a discovery controller.
    Discovery,
    /// 3: an administrative controller.
    Administrative,
}

impl ControllerType {
    fn to_byte(self) -> u8 {
        match self {
            Self::Unreported => 0,
            Self::Io => 1,
            Self::Discovery => 2,
            Self::Administrative => 3,
        }
    }

    fn from_byte(byte: u8) -> Self {
        match byte {
            1 => Self::Io,
            2 => Self::Discovery,
            3 => Self::Administrative,
            _ => Self::Unreported,
        }
    }
}

/// The Identify Controller fields Strata sets or reads (NVMe Base 2.0, figure 275). Fields not listed
/// are zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerIdentity {
    /// Bytes 0..2: PCI vendor ID (0 on fabrics without one).
    pub vid: u16,
    /// Bytes 4..24: serial number, ASCII, space padded.
    pub serial: String,
    /// Bytes 24..64: model number.
    pub model: String,
    /// Bytes 64..72: firmware revision.
    pub firmware: String,
    /// Byte 77: maximum data transfer size, as a power of two of 4 KiB pages (0: no limit).
    pub mdts: u8,
    /// Bytes 78..80: controller ID.
    pub cntlid: u16,
    /// Bytes 80..84: version (the VS property's layout).
    pub version: u32,
    /// Bytes 92..96: optional asynchronous events supported.
    pub oaes: u32,
    /// Byte 111: controller type.
    pub controller_type: ControllerType,
    /// Byte 259: asynchronous event request limit (0's based).
    pub aerl: u8,
    /// Byte 261: log page attributes (bit 2: extended data for Get Log Page, i.e. offsets and NUMDU).
    pub lpa: u8,
    /// Byte 262: error log page entries (0's based).
    pub elpe: u8,
    /// Bytes 320..322: keep-alive support, granularity in 100 ms units (0: keep alive not supported).
    pub kas: u16,
    /// Byte 512: submission queue entry sizes (required and maximum, log2).
    pub sqes: u8,
    /// Byte 513: completion queue entry sizes.
    pub cqes: u8,
    /// Bytes 514..516: maximum outstanding commands per queue.
    pub maxcmd: u16,
    /// Bytes 516..520: number of namespaces (the largest valid NSID).
    pub nn: u32,
    /// Bytes 520..522: optional NVM command support (bit 2 DSM, bit 3 Write Zeroes).
    pub oncs: u16,
    /// Byte 525: volatile write cache present (bit 0).
    pub vwc: u8,
    /// Bytes 536..540: SGL support.
    pub sgls: u32,
    /// Bytes 768..1024: subsystem NQN.
    pub subnqn: String,
    /// Bytes 1792..1796: I/O queue command capsule supported size, in 16-byte units.
    pub ioccsz: u32,
    /// Bytes 1796..1800: I/O queue response capsule supported size, in 16-byte units.
    pub iorcsz: u32,
    /// Bytes 1800..1802: in-capsule data offset, in 16-byte units.
    pub icdoff: u16,
    /// Byte 1803: maximum SGL data block descriptors.
    pub msdbd: u8,
}

impl ControllerIdentity {
    /// ONCS bit: Dataset Management.
    pub const ONCS_DSM: u16 = 1 << 2;
    /// ONCS bit: Write Zeroes.
    pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
    /// ONCS bit: Reservations.
    pub const ONCS_RESERVATIONS: u16 = 1 << 5;
    /// SGLS: SGLs supported with no alignment requirement (bits 1:0 = 01b) and the SGL offset of in-capsule
    /// data (bit 20).
    pub const SGLS_FABRICS: u32 = 1 | (1 << 20);
    /// SGLS bit 2: Keyed SGL Data Block descriptors, which an NVMe/RDMA host requires.
    pub const SGLS_KEYED: u32 = 1 << 2;
    /// LPA bit: extended data for Get Log Page.
    pub const LPA_EXTENDED_DATA: u8 = 1 << 2;

    /// The 4096 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; IDENTIFY_BYTES];
        put_u16(&mut bytes, 0, self.vid);
        put_u16(&mut bytes, 2, self.vid); // SSVID
        put_str(&mut bytes, 4, 20, &self.serial, b' ');
        put_str(&mut bytes, 24, 40, &self.model, b' ');
        put_str(&mut bytes, 64, 8, &self.firmware, b' ');
        bytes[77] = self.mdts;
        put_u16(&mut bytes, 78, self.cntlid);
        put_u32(&mut bytes, 80, self.version);
        put_u32(&mut bytes, 92, self.oaes);
        bytes[111] = self.controller_type.to_byte();
        bytes[259] = self.aerl;
        bytes[261] = self.lpa;
        bytes[262] = self.elpe;
        put_u16(&mut bytes, 320, self.kas);
        bytes[512] = self.sqes;
        bytes[513] = self.cqes;
        put_u16(&mut bytes, 514, self.maxcmd);
        put_u32(&mut bytes, 516, self.nn);
        put_u16(&mut bytes, 520, self.oncs);
        bytes[525] = self.vwc;
        put_u32(&mut bytes, 536, self.sgls);
        put_str(&mut bytes, 768, 256, &self.subnqn, 0);
        put_u32(&mut bytes, 1792, self.ioccsz);
        put_u32(&mut bytes, 1796, self.iorcsz);
        put_u16(&mut bytes, 1800, self.icdoff);
        bytes[1803] = self.msdbd;
        bytes
    }

    /// Decodes Identify Controller data (`None` when shorter than 4096 bytes).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < IDENTIFY_BYTES {
            return None;
        }
        Some(Self {
            vid: get_u16(bytes, 0),
            serial: read_str(bytes, 4, 20),
            model: read_str(bytes, 24, 40),
            firmware: read_str(bytes, 64, 8),
            mdts: bytes[77],
            cntlid: get_u16(bytes, 78),
            version: get_u32(bytes, 80),
            oaes: get_u32(bytes, 92),
            controller_type: ControllerType::from_byte(bytes[111]),
            aerl: bytes[259],
            lpa: bytes[261],
            elpe: bytes[262],
            kas: get_u16(bytes, 320),
            sqes: bytes[512],
            cqes: bytes[513],
            maxcmd: get_u16(bytes, 514),
            nn: get_u32(bytes, 516),
            oncs: get_u16(bytes, 520),
            vwc: bytes[525],
            sgls: get_u32(bytes, 536),
            subnqn: read_str(bytes, 768, 256),
            ioccsz: get_u32(bytes, 1792),
            iorcsz: get_u32(bytes, 1796),
            icdoff: get_u16(bytes, 1800),
            msdbd: bytes[1803],
        })
    }

    /// The largest transfer of one command in bytes (`None`: no limit).
    pub fn max_transfer_bytes(&self) -> Option<u64> {
        (self.mdts != 0).then(|| 4096u64 << self.mdts.min(40))
    }

    /// Bytes of data a command capsule may carry on an I/O queue.
    pub fn in_capsule_data_bytes(&self) -> usize {
        (self.ioccsz as usize * 16).saturating_sub(super::COMMAND_BYTES)
    }
}

/// The Identify Namespace fields Strata sets or reads (NVM Command Set 1.0, figure 97), with one LBA format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceIdentity {
    /// Bytes 0..8: namespace size in logical blocks.
    pub nsze: u64,
    /// Bytes 8..16: namespace capacity in logical blocks.
    pub ncap: u64,
    /// Bytes 16..24: namespace utilisation in logical blocks.
    pub nuse: u64,
    /// Byte 30: multi-path I/O and namespace sharing (bit 0: may be attached to several controllers).
    pub nmic: u8,
    /// Byte 31: reservation capabilities (bits 6:1: the types supported; bit 7: Ignore Existing Key as
    /// NVMe 1.3 defines it; bit 0: persist through power loss).
    pub rescap: u8,
    /// Byte 33: deallocate logical block features (bits 2:0 = 001b: deallocated blocks read as zeroes;
    /// bit 3: Write Zeroes can deallocate).
    pub dlfeat: u8,
    /// Bytes 104..120: namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// log2 of the logical block size, from LBA format 0 (bytes 128..132, LBADS in bits 23:16).
    pub lba_shift: u8,
}

impl NamespaceIdentity {
    /// The 4096 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; IDENTIFY_BYTES];
        put_u64(&mut bytes, 0, self.nsze);
        put_u64(&mut bytes, 8, self.ncap);
        put_u64(&mut bytes, 16, self.nuse);
        bytes[25] = 0; // NLBAF: one format (0's based)
        bytes[26] = 0; // FLBAS: format 0, no metadata
        bytes[30] = self.nmic;
        bytes[31] = self.rescap;
        bytes[33] = self.dlfeat;
        bytes[104..120].copy_from_slice(&self.nguid);
        put_u32(&mut bytes, 128, u32::from(self.lba_shift) << 16);
        bytes
    }

    /// Decodes Identify Namespace data, using the LBA format FLBAS selects.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < IDENTIFY_BYTES {
            return None;
        }
        let format = usize::from(bytes[26] & 0x0f);
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&bytes[104..120]);
        Some(Self {
            nsze: get_u64(bytes, 0),
            ncap: get_u64(bytes, 8),
            nuse: get_u64(bytes, 16),
            nmic: bytes[30],
            rescap: bytes[31],
            dlfeat: bytes[33],
            nguid,
            lba_shift: bytes[128 + 4 * format + 2],
        })
    }

    /// The logical block size in bytes (`None` when LBADS is outside 9..=16, which no device uses).
    pub fn logical_block_bytes(&self) -> Option<u64> {
        (9..=16).contains(&self.lba_shift).then(|| 1u64 << self.lba_shift)
    }
}

/// The Active Namespace ID list (CNS 02h): up to 1024 NSIDs greater than `after`, ascending, zero filled.
pub fn active_namespace_list(nsids: impl IntoIterator<Item = u32>, after: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; IDENTIFY_BYTES];
    let mut listed: Vec<u32> = nsids.into_iter().filter(|&nsid| nsid > after).collect();
    listed.sort_unstable();
    for (index, nsid) in listed.into_iter().take(IDENTIFY_BYTES / 4).enumerate() {
        put_u32(&mut bytes, 4 * index, nsid);
    }
    bytes
}

/// The Namespace Identification Descriptor list (CNS 03h): the NGUID (type 2) and a UUID (type 3).
pub fn namespace_descriptors(nguid: &[u8; 16], uuid: &[u8; 16]) -> Vec<u8> {
    let mut bytes = vec![0u8; IDENTIFY_BYTES];
    bytes[0] = 2; // NIDT: NGUID
    bytes[1] = 16; // NIDL
    bytes[4..20].copy_from_slice(nguid);
    bytes[20] = 3; // NIDT: UUID
    bytes[21] = 16;
    bytes[24..40].copy_from_slice(uuid);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ControllerIdentity {
        ControllerIdentity {
            vid: 0,
            serial: "S123".into(),
            model: "Strata".into(),
            firmware: "0.1".into(),
            mdts: 8,
            cntlid: 3,
            version: 0x0001_0300,
            oaes: 0,
            controller_type: ControllerType::Io,
            aerl: 3,
            lpa: ControllerIdentity::LPA_EXTENDED_DATA,
            elpe: 15,
            kas: 1,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: 128,
            nn: 2,
            oncs: ControllerIdentity::ONCS_DSM | ControllerIdentity::ONCS_WRITE_ZEROES,
            vwc: 1,
            sgls: ControllerIdentity::SGLS_FABRICS,
            subnqn: "nqn.2026-12.io.strata:s".into(),
            ioccsz: 4 + 1024,
            iorcsz: 1,
            icdoff: 0,
            msdbd: 1,
        }
    }

    #[test]
    fn identify_controller_fields_sit_at_the_offsets_of_figure_275() {
        let identity = sample();
        let bytes = identity.encode();
        assert_eq!(bytes.len(), 4096);
        assert_eq!(&bytes[4..8], b"S123");
        assert_eq!(bytes[23], b' ', "serial number is space padded");
        assert_eq!(&bytes[24..30], b"Strata");
        assert_eq!(bytes[77], 8);
        assert_eq!(&bytes[78..80], &[3, 0]);
        assert_eq!(&bytes[80..84], &[0x00, 0x03, 0x01, 0x00], "VER 1.3.0");
        assert_eq!(bytes[111], 1, "CNTRLTYPE I/O");
        assert_eq!(&bytes[320..322], &[1, 0], "KAS");
        assert_eq!(bytes[512], 0x66, "SQES");
        assert_eq!(bytes[513], 0x44, "CQES");
        assert_eq!(&bytes[514..516], &[128, 0], "MAXCMD");
        assert_eq!(&bytes[516..520], &[2, 0, 0, 0], "NN");
        assert_eq!(&bytes[520..522], &[0x0c, 0], "ONCS DSM + Write Zeroes");
        assert_eq!(&bytes[536..540], &[1, 0, 0x10, 0], "SGLS");
        assert_eq!(&bytes[768..772], b"nqn.");
        assert_eq!(&bytes[1792..1796], &(1028u32).to_le_bytes(), "IOCCSZ");
        assert_eq!(bytes[1803], 1, "MSDBD");
        assert_eq!(ControllerIdentity::decode(&bytes), Some(identity.clone()));
        assert_eq!(identity.max_transfer_bytes(), Some(1 << 20));
        assert_eq!(identity.in_capsule_data_bytes(), 16384);
        assert_eq!(ControllerIdentity::decode(&bytes[..4095]), None);
    }

    #[test]
    fn identify_namespace_fields_sit_at_the_offsets_of_figure_97() {
        let identity = NamespaceIdentity {
            nsze: 1 << 21,
            ncap: 1 << 21,
            nuse: 5,
            nmic: 1,
            rescap: 0xfe,
            dlfeat: 0x09,
            nguid: [0xab; 16],
            lba_shift: 12,
        };
        let bytes = identity.encode();
        assert_eq!(&bytes[0..8], &(1u64 << 21).to_le_bytes());
        assert_eq!(&bytes[16..24], &5u64.to_le_bytes());
        assert_eq!((bytes[30], bytes[31]), (1, 0xfe), "NMIC, RESCAP");
        assert_eq!(bytes[33], 0x09);
        assert_eq!(&bytes[104..120], &[0xab; 16]);
        assert_eq!(bytes[130], 12, "LBADS of LBA format 0");
        assert_eq!(NamespaceIdentity::decode(&bytes), Some(identity.clone()));
        assert_eq!(identity.logical_block_bytes(), Some(4096));
    }

    #[test]
    fn namespace_lists_and_descriptors_follow_cns_02_and_03() {
        let list = active_namespace_list([3, 1, 2], 1);
        assert_eq!(&list[0..12], &[2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        let descriptors = namespace_descriptors(&[1; 16], &[2; 16]);
        assert_eq!(&descriptors[0..4], &[2, 16, 0, 0]);
        assert_eq!(&descriptors[20..24], &[3, 16, 0, 0]);
        assert_eq!(descriptors[40], 0, "the list ends with a zero NIDT");
    }
}
