//! Submission queue entries (commands), SGL descriptors and completion queue entries.

use super::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use super::status::NvmeStatus;
use super::{COMMAND_BYTES, COMPLETION_BYTES};

/// Admin command opcodes (NVMe Base 2.0, figure 28) that Strata's target serves or its host sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminOpcode {
    /// Get Log Page.
    GetLogPage = 0x02,
    /// Identify.
    Identify = 0x06,
    /// Abort.
    Abort = 0x08,
    /// Set Features.
    SetFeatures = 0x09,
    /// Get Features.
    GetFeatures = 0x0a,
    /// Asynchronous Event Request.
    AsyncEventRequest = 0x0c,
    /// Keep Alive.
    KeepAlive = 0x18,
}

/// NVM command set I/O opcodes (NVM Command Set 1.0, figure 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOpcode {
    /// Flush.
    Flush = 0x00,
    /// Write.
    Write = 0x01,
    /// Read.
    Read = 0x02,
    /// Write Zeroes.
    WriteZeroes = 0x08,
    /// Dataset Management (deallocate).
    DatasetManagement = 0x09,
    /// Reservation Register.
    ReservationRegister = 0x0d,
    /// Reservation Report.
    ReservationReport = 0x0e,
    /// Reservation Acquire.
    ReservationAcquire = 0x11,
    /// Reservation Release.
    ReservationRelease = 0x15,
}

/// The opcode of every Fabrics command; the command type is in byte 4 (FCTYPE).
pub const FABRICS_OPCODE: u8 = 0x7f;

/// Fabrics command types (NVMe over Fabrics 1.1, figure 10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricsType {
    /// Property Set.
    PropertySet = 0x00,
    /// Connect.
    Connect = 0x01,
    /// Property Get.
    PropertyGet = 0x04,
    /// Disconnect (NVMe-oF 1.1+).
    Disconnect = 0x08,
}

impl FabricsType {
    /// The type for an FCTYPE byte, if Strata knows it.
    pub fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            0x00 => Self::PropertySet,
            0x01 => Self::Connect,
            0x04 => Self::PropertyGet,
            0x08 => Self::Disconnect,
            _ => return None,
        })
    }
}

/// An SGL descriptor (NVMe Base 2.0, 4.1.2), 16 bytes at command bytes 24..40.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SglDescriptor {
    /// Address (for NVMe/TCP: an offset into the capsule, or 0).
    pub address: u64,
    /// Length in bytes.
    pub length: u32,
    /// SGL identifier: descriptor type (bits 7:4) and subtype (bits 3:0).
    pub identifier: u8,
}

impl SglDescriptor {
    /// Data Block, subtype Offset: data that travels inside the command capsule (NVMe/TCP in-capsule data).
    pub const IN_CAPSULE: u8 = 0x01;
    /// Transport SGL Data Block, subtype Transport specific: data moved by the transport (NVMe/TCP
    /// H2CData / C2HData PDUs).
    pub const TRANSPORT: u8 = 0x5a;

    /// Data carried in the capsule, `length` bytes at offset 0.
    pub fn in_capsule(length: u32) -> Self {
        Self { address: 0, length, identifier: Self::IN_CAPSULE }
    }

    /// Data moved by transport PDUs.
    pub fn transport(length: u32) -> Self {
        Self { address: 0, length, identifier: Self::TRANSPORT }
    }
}

/// A submission queue entry: 64 bytes (NVMe Base 2.0, figure 88). Command-specific fields are decoded by
/// the code that handles the opcode, from the command dwords.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Command {
    /// Byte 0: opcode.
    pub opcode: u8,
    /// Byte 1: FUSE (bits 1:0) and PSDT (bits 7:6; 01b = SGL, which NVMe-oF requires).
    pub flags: u8,
    /// Bytes 2..4: command identifier, unique among the commands outstanding on the queue.
    pub cid: u16,
    /// Bytes 4..8: namespace ID (for Fabrics commands, byte 4 is FCTYPE).
    pub nsid: u32,
    /// Bytes 8..12, 12..16: command dwords 2 and 3.
    pub cdw2: u32,
    /// See `cdw2`.
    pub cdw3: u32,
    /// Bytes 16..24: metadata pointer.
    pub mptr: u64,
    /// Bytes 24..40: the data pointer, an SGL descriptor.
    pub sgl: SglDescriptor,
    /// Bytes 40..64: command dwords 10 to 15.
    pub cdw: [u32; 6],
}

impl Command {
    /// PSDT = 01b: the data pointer is an SGL (required on fabrics).
    pub const FLAGS_SGL: u8 = 0x40;

    /// A command with this opcode and identifier, an SGL data pointer and everything else zero.
    pub fn new(opcode: u8, cid: u16) -> Self {
        Self { opcode, flags: Self::FLAGS_SGL, cid, ..Self::default() }
    }

    /// Command dword `n` (10 ..= 15).
    pub fn cdw(&self, n: usize) -> u32 {
        self.cdw[n - 10]
    }

    /// Sets command dword `n` (10 ..= 15).
    pub fn set_cdw(&mut self, n: usize, value: u32) {
        self.cdw[n - 10] = value;
    }

    /// For a Fabrics command: FCTYPE (byte 4).
    pub fn fabrics_type(&self) -> u8 {
        self.nsid as u8
    }

    /// The 64 bytes on the wire.
    pub fn encode(&self) -> [u8; COMMAND_BYTES] {
        let mut bytes = [0u8; COMMAND_BYTES];
        bytes[0] = self.opcode;
        bytes[1] = self.flags;
        put_u16(&mut bytes, 2, self.cid);
        put_u32(&mut bytes, 4, self.nsid);
        put_u32(&mut bytes, 8, self.cdw2);
        put_u32(&mut bytes, 12, self.cdw3);
        put_u64(&mut bytes, 16, self.mptr);
        put_u64(&mut bytes, 24, self.sgl.address);
        put_u32(&mut bytes, 32, self.sgl.length);
        bytes[39] = self.sgl.identifier;
        for (index, dword) in self.cdw.iter().enumerate() {
            put_u32(&mut bytes, 40 + 4 * index, *dword);
        }
        bytes
    }

    /// Decodes 64 bytes (any bit pattern is a command; meaning is checked by the handler).
    pub fn decode(bytes: &[u8; COMMAND_BYTES]) -> Self {
        let mut cdw = [0u32; 6];
        for (index, dword) in cdw.iter_mut().enumerate() {
            *dword = get_u32(bytes, 40 + 4 * index);
        }
        Self {
            opcode: bytes[0],
            flags: bytes[1],
            cid: get_u16(bytes, 2),
            nsid: get_u32(bytes, 4),
            cdw2: get_u32(bytes, 8),
            cdw3: get_u32(bytes, 12),
            mptr: get_u64(bytes, 16),
            sgl: SglDescriptor { address: get_u64(bytes, 24), length: get_u32(bytes, 32), identifier: bytes[39] },
            cdw,
        }
    }

    /// For Read / Write / Write Zeroes: the starting LBA (CDW10-11).
    pub fn slba(&self) -> u64 {
        u64::from(self.cdw(10)) | (u64::from(self.cdw(11)) << 32)
    }

    /// For Read / Write / Write Zeroes: the number of logical blocks (CDW12 bits 15:0 are 0's based).
    pub fn block_count(&self) -> u32 {
        (self.cdw(12) & 0xffff) + 1
    }

    /// Sets the LBA range of a Read / Write / Write Zeroes (`blocks` ≥ 1, ≤ 65536).
    pub fn set_lba_range(&mut self, slba: u64, blocks: u32) {
        self.set_cdw(10, slba as u32);
        self.set_cdw(11, (slba >> 32) as u32);
        self.set_cdw(12, (blocks - 1) & 0xffff);
    }
}

/// A completion queue entry: 16 bytes (NVMe Base 2.0, figure 89).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Completion {
    /// Dword 0: command specific.
    pub dw0: u32,
    /// Dword 1: command specific.
    pub dw1: u32,
    /// SQ head pointer.
    pub sq_head: u16,
    /// SQ identifier.
    pub sq_id: u16,
    /// The identifier of the command this completes.
    pub cid: u16,
    /// The status (bits 15:1 of the status field; the phase tag, bit 0, has no meaning on fabrics).
    pub status: NvmeStatus,
}

impl Completion {
    /// A completion of `cid` with `status`.
    pub fn new(cid: u16, status: NvmeStatus) -> Self {
        Self { cid, status, ..Self::default() }
    }

    /// The 16 bytes on the wire.
    pub fn encode(&self) -> [u8; COMPLETION_BYTES] {
        let mut bytes = [0u8; COMPLETION_BYTES];
        put_u32(&mut bytes, 0, self.dw0);
        put_u32(&mut bytes, 4, self.dw1);
        put_u16(&mut bytes, 8, self.sq_head);
        put_u16(&mut bytes, 10, self.sq_id);
        put_u16(&mut bytes, 12, self.cid);
        put_u16(&mut bytes, 14, self.status.to_field() << 1);
        bytes
    }

    /// Decodes 16 bytes.
    pub fn decode(bytes: &[u8; COMPLETION_BYTES]) -> Self {
        Self {
            dw0: get_u32(bytes, 0),
            dw1: get_u32(bytes, 4),
            sq_head: get_u16(bytes, 8),
            sq_id: get_u16(bytes, 10),
            cid: get_u16(bytes, 12),
            status: NvmeStatus::from_field(get_u16(bytes, 14) >> 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_fields_sit_at_the_offsets_of_figure_88() {
        let mut command = Command::new(IoOpcode::Read as u8, 0xbeef);
        command.nsid = 0x0102_0304;
        command.sgl = SglDescriptor::transport(0x1000);
        command.set_lba_range(0x11_2233_4455, 8);
        let bytes = command.encode();
        assert_eq!(bytes.len(), 64);
        assert_eq!(bytes[0], 0x02);
        assert_eq!(bytes[1] >> 6, 0b01, "PSDT says SGL");
        assert_eq!(&bytes[2..4], &[0xef, 0xbe]);
        assert_eq!(&bytes[4..8], &[0x04, 0x03, 0x02, 0x01]);
        assert_eq!(&bytes[32..36], &[0x00, 0x10, 0x00, 0x00], "SGL length");
        assert_eq!(bytes[39], 0x5a, "SGL identifier: transport data block, transport specific");
        assert_eq!(&bytes[40..48], &[0x55, 0x44, 0x33, 0x22, 0x11, 0, 0, 0], "SLBA in CDW10-11");
        assert_eq!(&bytes[48..50], &[7, 0], "NLB is 0's based");
        assert_eq!(Command::decode(&bytes), command);
        assert_eq!(command.block_count(), 8);
    }

    #[test]
    fn completion_fields_sit_at_the_offsets_of_figure_89() {
        let completion = Completion {
            dw0: 0xaabb_ccdd,
            dw1: 1,
            sq_head: 5,
            sq_id: 2,
            cid: 0x1234,
            status: NvmeStatus::INVALID_FIELD.with_dnr(),
        };
        let bytes = completion.encode();
        assert_eq!(&bytes[0..4], &[0xdd, 0xcc, 0xbb, 0xaa]);
        assert_eq!(&bytes[8..10], &[5, 0]);
        assert_eq!(&bytes[10..12], &[2, 0]);
        assert_eq!(&bytes[12..14], &[0x34, 0x12]);
        let status = u16::from_le_bytes([bytes[14], bytes[15]]);
        assert_eq!((status >> 1) & 0xff, 0x02, "SC in bits 8:1");
        assert_eq!((status >> 9) & 0x7, 0, "SCT in bits 11:9");
        assert_eq!(status >> 15, 1, "DNR in bit 15");
        assert_eq!(Completion::decode(&bytes), completion);
    }
}
