//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, section 3.6): the common header, each PDU type's
//! specific header, header and data digests, and the data offset rules.
//!
//! The codec works on byte slices so that it can be fuzzed and reasoned about apart from sockets. A PDU is
//! received in two steps: [`header_stage_len`] tells, from the 8-byte common header, how many bytes make
//! up the header stage (common header, PDU-specific header, header digest, padding up to PDO), then
//! [`Decoder::decode_header`] checks and decodes those bytes and says how many data bytes follow; the
//! caller decides where the data goes (straight into an I/O buffer) and checks the data digest with
//! [`data_digest`]. Every length is checked against the negotiated bounds before anything is allocated.

use crate::spec::{COMMAND_BYTES, COMPLETION_BYTES, Command, Completion, get_u16, get_u32, put_u16, put_u32};

/// Size of the common header.
pub const COMMON_HEADER_BYTES: usize = 8;
/// Size of a digest.
pub const DIGEST_BYTES: usize = 4;
/// The most header-stage bytes a PDU can have: PDO is one byte.
pub const MAX_HEADER_STAGE_BYTES: usize = 255;
/// The most data a TermReq carries: the header of the PDU in error (NVMe/TCP 1.0, 3.6.2.9).
pub const MAX_TERM_DATA_BYTES: usize = 152;

/// PDU types (NVMe/TCP 1.0, figure 15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PduType {
    /// 00h: Initialize Connection Request.
    ICReq = 0x00,
    /// 01h: Initialize Connection Response.
    ICResp = 0x01,
    /// 02h: Host to Controller Terminate Connection Request.
    H2CTermReq = 0x02,
    /// 03h: Controller to Host Terminate Connection Request.
    C2HTermReq = 0x03,
    /// 04h: Command Capsule.
    CapsuleCmd = 0x04,
    /// 05h: Response Capsule.
    CapsuleResp = 0x05,
    /// 06h: Host to Controller Data.
    H2CData = 0x06,
    /// 07h: Controller to Host Data.
    C2HData = 0x07,
    /// 09h: Ready to Transfer.
    R2T = 0x09,
}

impl PduType {
    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            0x00 => Self::ICReq,
            0x01 => Self::ICResp,
            0x02 => Self::H2CTermReq,
            0x03 => Self::C2HTermReq,
            0x04 => Self::CapsuleCmd,
            0x05 => Self::CapsuleResp,
            0x06 => Self::H2CData,
            0x07 => Self::C2HData,
            0x09 => Self::R2T,
            _ => return None,
        })
    }

    /// HLEN: the length of the common plus PDU-specific header.
    pub fn header_len(self) -> usize {
        match self {
            Self::ICReq | Self::ICResp => 128,
            Self::CapsuleCmd => COMMON_HEADER_BYTES + COMMAND_BYTES,
            Self::CapsuleResp => COMMON_HEADER_BYTES + COMPLETION_BYTES,
            Self::H2CTermReq | Self::C2HTermReq | Self::H2CData | Self::C2HData | Self::R2T => 24,
        }
    }

    /// Whether a host sends this type (otherwise a controller does).
    pub fn from_host(self) -> bool {
        matches!(self, Self::ICReq | Self::H2CTermReq | Self::CapsuleCmd | Self::H2CData)
    }

    /// Whether this type carries a header digest once digests are negotiated.
    fn digested(self) -> bool {
        !matches!(self, Self::ICReq | Self::ICResp | Self::H2CTermReq | Self::C2HTermReq)
    }

    /// Whether this type may carry data (and so a data digest).
    fn carries_data(self) -> bool {
        matches!(self, Self::CapsuleCmd | Self::H2CData | Self::C2HData | Self::H2CTermReq | Self::C2HTermReq)
    }
}

/// Common header flags (NVMe/TCP 1.0, figure 16 and the PDU figures).
pub mod flags {
    /// HDGSTF: a header digest follows the header.
    pub const HEADER_DIGEST: u8 = 1 << 0;
    /// DDGSTF: a data digest follows the data.
    pub const DATA_DIGEST: u8 = 1 << 1;
    /// LAST_PDU (H2CData, C2HData): the last data PDU of the command or R2T.
    pub const LAST_PDU: u8 = 1 << 2;
    /// SUCCESS (C2HData): the command succeeded; no response capsule follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// The digests a connection uses, as negotiated by ICReq / ICResp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    /// Header digest (HDGST).
    pub header: bool,
    /// Data digest (DDGST).
    pub data: bool,
}

impl Digests {
    fn to_byte(self) -> u8 {
        u8::from(self.header) | (u8::from(self.data) << 1)
    }

    fn from_byte(byte: u8) -> Self {
        Self { header: byte & 1 != 0, data: byte & 2 != 0 }
    }
}

/// Fatal error status of a TermReq (NVMe/TCP 1.0, figure 27).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FatalError {
    /// 01h: Invalid PDU Header Field (FEI: the byte offset of the field).
    InvalidHeaderField = 0x01,
    /// 02h: PDU Sequence Error.
    SequenceError = 0x02,
    /// 03h: Header Digest Error.
    HeaderDigest = 0x03,
    /// 04h: Data Transfer Out of Range.
    DataOutOfRange = 0x04,
    /// 05h: Data Transfer Limit Exceeded.
    DataLimitExceeded = 0x05,
    /// 06h: Unsupported Parameter (FEI: the byte offset of the parameter).
    UnsupportedParameter = 0x06,
}

impl FatalError {
    fn from_code(code: u16) -> Option<Self> {
        Some(match code {
            0x01 => Self::InvalidHeaderField,
            0x02 => Self::SequenceError,
            0x03 => Self::HeaderDigest,
            0x04 => Self::DataOutOfRange,
            0x05 => Self::DataLimitExceeded,
            0x06 => Self::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// Why a received PDU was refused. Each maps to the TermReq the receiver sends before closing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// A header field has a value the specification or this connection does not allow.
    #[error("invalid PDU header field at byte {offset}: {what}")]
    InvalidField {
        /// Byte offset of the field within the PDU.
        offset: u32,
        /// What is wrong.
        what: &'static str,
    },
    /// A valid PDU that may not arrive now (e.g. anything before ICReq, or an H2CData nobody asked for).
    #[error("PDU sequence error: {0}")]
    Sequence(&'static str),
    /// The header digest does not match the header.
    #[error("header digest mismatch: PDU says {received:#010x}, header computes to {computed:#010x}")]
    HeaderDigest {
        /// Digest in the PDU.
        received: u32,
        /// Digest of the bytes received.
        computed: u32,
    },
    /// The data digest does not match the data.
    #[error("data digest mismatch: PDU says {received:#010x}, data computes to {computed:#010x}")]
    DataDigest {
        /// Digest in the PDU.
        received: u32,
        /// Digest of the bytes received.
        computed: u32,
    },
    /// Data placed outside the command's buffer.
    #[error("data transfer out of range: {offset}+{len} outside the command's {expected} bytes")]
    DataOutOfRange {
        /// Offset of the data.
        offset: u32,
        /// Length of the data.
        len: u32,
        /// Bytes the command transfers.
        expected: u32,
    },
    /// More data in one PDU than negotiated.
    #[error("data transfer limit exceeded: {len} bytes in one PDU, at most {limit}")]
    DataLimitExceeded {
        /// Length received.
        len: u32,
        /// The bound.
        limit: u32,
    },
    /// A parameter this implementation does not support (e.g. an ICReq PFV other than 0).
    #[error("unsupported parameter at byte {offset}: {what}")]
    Unsupported {
        /// Byte offset of the parameter.
        offset: u32,
        /// What is unsupported.
        what: &'static str,
    },
    /// The peer terminated the connection with a TermReq.
    #[error("peer terminated the connection: {fes:?}, information {fei:#x}")]
    Terminated {
        /// Its fatal error status.
        fes: Option<FatalError>,
        /// Its fatal error information.
        fei: u32,
    },
}

impl PduError {
    /// The TermReq's fatal error status and information for this error. `None` for a received TermReq
    /// (answered by closing) and for a data digest error, which is not a fatal transport error: the whole
    /// PDU was consumed, the stream is still in step, and the receiver fails only the command the data
    /// belongs to (the controller with Transient Transport Error), as SPDK and the Linux host do.
    pub fn term_request(&self) -> Option<(FatalError, u32)> {
        Some(match self {
            Self::InvalidField { offset, .. } => (FatalError::InvalidHeaderField, *offset),
            Self::Sequence(_) => (FatalError::SequenceError, 0),
            Self::HeaderDigest { .. } => (FatalError::HeaderDigest, 0),
            Self::DataOutOfRange { .. } => (FatalError::DataOutOfRange, 0),
            Self::DataLimitExceeded { .. } => (FatalError::DataLimitExceeded, 0),
            Self::Unsupported { offset, .. } => (FatalError::UnsupportedParameter, *offset),
            Self::Terminated { .. } | Self::DataDigest { .. } => return None,
        })
    }
}

/// A decoded PDU header (everything but the data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PduHeader {
    /// ICReq.
    InitRequest {
        /// PDU format version (0).
        pfv: u16,
        /// Host PDU data alignment, in dwords minus one: C2H data starts at a multiple of (HPDA+1)*4.
        hpda: u8,
        /// Digests the host asks for.
        digests: Digests,
        /// Maximum outstanding R2Ts per command, 0's based.
        maxr2t: u32,
    },
    /// ICResp.
    InitResponse {
        /// PDU format version (0).
        pfv: u16,
        /// Controller PDU data alignment: H2C data starts at a multiple of (CPDA+1)*4.
        cpda: u8,
        /// Digests enabled.
        digests: Digests,
        /// Most data bytes in one H2CData PDU.
        maxh2cdata: u32,
    },
    /// H2CTermReq or C2HTermReq; the data is the offending PDU header.
    TermRequest {
        /// H2C (true) or C2H.
        from_host: bool,
        /// Fatal error status.
        fes: u16,
        /// Fatal error information.
        fei: u32,
    },
    /// CapsuleCmd; data, when present, is in-capsule data.
    Command(Command),
    /// CapsuleResp.
    Response(Completion),
    /// H2CData.
    HostData {
        /// The command the data belongs to.
        cccid: u16,
        /// The R2T's transfer tag.
        ttag: u16,
        /// Offset of the data in the command's transfer.
        offset: u32,
        /// LAST_PDU flag.
        last: bool,
    },
    /// C2HData.
    ControllerData {
        /// The command the data belongs to.
        cccid: u16,
        /// Offset of the data in the command's transfer.
        offset: u32,
        /// LAST_PDU flag.
        last: bool,
        /// SUCCESS flag: the command completed successfully and no CapsuleResp follows.
        success: bool,
    },
    /// R2T.
    ReadyToTransfer {
        /// The command asking for data.
        cccid: u16,
        /// Transfer tag to put in the H2CData PDUs.
        ttag: u16,
        /// Offset of the requested data.
        offset: u32,
        /// Length of the requested data.
        len: u32,
    },
}

impl PduHeader {
    /// The PDU type.
    pub fn pdu_type(&self) -> PduType {
        match self {
            Self::InitRequest { .. } => PduType::ICReq,
            Self::InitResponse { .. } => PduType::ICResp,
            Self::TermRequest { from_host: true, .. } => PduType::H2CTermReq,
            Self::TermRequest { from_host: false, .. } => PduType::C2HTermReq,
            Self::Command(_) => PduType::CapsuleCmd,
            Self::Response(_) => PduType::CapsuleResp,
            Self::HostData { .. } => PduType::H2CData,
            Self::ControllerData { .. } => PduType::C2HData,
            Self::ReadyToTransfer { .. } => PduType::R2T,
        }
    }
}

/// A decoded header and the data that follows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedHeader {
    /// The header.
    pub header: PduHeader,
    /// Data bytes after the header stage (0 when none).
    pub data_len: u32,
    /// Whether a data digest follows the data.
    pub data_digest: bool,
}

/// The bounds and options of one side of a connection, used to check what it receives.
#[derive(Clone, Copy, Debug)]
pub struct Decoder {
    /// Whether this side is the controller (it receives host PDUs) or the host.
    pub controller: bool,
    /// Digests in force (all off until the IC exchange).
    pub digests: Digests,
    /// Most data bytes accepted in one PDU: MAXH2CDATA / in-capsule size for a controller, the largest
    /// transfer for a host.
    pub max_data_bytes: u32,
}

/// CRC32C of the bytes, as NVMe/TCP digests use it (and the crate's other crc32c: the pool superblock,
/// the target's identifiers). `crc-fast`, as the KV protocol's checksum: about twice the `crc32c` crate's
/// rate on a PDU's data here (docs of `strata_proto::checksum`), and the same function (tested below).
pub fn data_digest(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// Reads the common header's type, HLEN, PDO and PLEN and returns the number of bytes of the header
/// stage (common header through the padding before PDO). Called with the first 8 bytes of a PDU.
pub fn header_stage_len(decoder: &Decoder, common: &[u8; COMMON_HEADER_BYTES]) -> Result<usize, PduError> {
    let pdu_type =
        PduType::from_byte(common[0]).ok_or(PduError::InvalidField { offset: 0, what: "unknown PDU type" })?;
    if pdu_type.from_host() != decoder.controller {
        return Err(PduError::InvalidField { offset: 0, what: "PDU type sent in the wrong direction" });
    }
    let hlen = usize::from(common[2]);
    if hlen != pdu_type.header_len() {
        return Err(PduError::InvalidField { offset: 2, what: "HLEN does not match the PDU type" });
    }
    let digest_flag = common[1] & flags::HEADER_DIGEST != 0;
    if pdu_type.digested() && digest_flag != decoder.digests.header {
        return Err(PduError::InvalidField { offset: 1, what: "HDGSTF does not match the negotiated header digest" });
    }
    let header_end = hlen + if pdu_type.digested() && digest_flag { DIGEST_BYTES } else { 0 };
    let pdo = usize::from(common[3]);
    let plen = get_u32(common, 4) as usize;
    if plen < header_end {
        return Err(PduError::InvalidField { offset: 4, what: "PLEN shorter than the header" });
    }
    let has_data = plen > header_end;
    if !has_data || matches!(pdu_type, PduType::H2CTermReq | PduType::C2HTermReq) {
        return Ok(header_end);
    }
    if !pdu_type.carries_data() {
        return Err(PduError::InvalidField { offset: 4, what: "PLEN leaves data after a PDU type that has none" });
    }
    if pdo < header_end {
        return Err(PduError::InvalidField { offset: 3, what: "PDO points inside the header" });
    }
    Ok(pdo)
}

impl Decoder {
    /// Checks and decodes a header stage (as long as [`header_stage_len`] said).
    pub fn decode_header(&self, stage: &[u8]) -> Result<ReceivedHeader, PduError> {
        let mut common = [0u8; COMMON_HEADER_BYTES];
        common.copy_from_slice(stage.get(..COMMON_HEADER_BYTES).ok_or(PduError::Sequence("truncated header"))?);
        let expected_len = header_stage_len(self, &common)?;
        if stage.len() != expected_len {
            return Err(PduError::Sequence("header stage of the wrong length"));
        }
        let pdu_type = PduType::from_byte(stage[0]).ok_or(PduError::InvalidField { offset: 0, what: "type" })?;
        let pdu_flags = stage[1];
        let hlen = usize::from(stage[2]);
        let plen = get_u32(stage, 4);
        if pdu_type.digested() && pdu_flags & flags::HEADER_DIGEST != 0 {
            let received = get_u32(stage, hlen);
            let computed = data_digest(&stage[..hlen]);
            if received != computed {
                return Err(PduError::HeaderDigest { received, computed });
            }
        }
        let data_digest = pdu_flags & flags::DATA_DIGEST != 0;
        let stage_len = stage.len() as u32;
        let data_len = plen.saturating_sub(stage_len).saturating_sub(if data_digest { DIGEST_BYTES as u32 } else { 0 });
        if data_len > 0 || data_digest {
            if data_digest != self.digests.data && pdu_type.digested() {
                return Err(PduError::InvalidField {
                    offset: 1,
                    what: "DDGSTF does not match the negotiated data digest",
                });
            }
            if data_len == 0 || plen < stage_len + if data_digest { DIGEST_BYTES as u32 } else { 0 } {
                return Err(PduError::InvalidField { offset: 4, what: "PLEN leaves no data before the data digest" });
            }
        }
        let limit = match pdu_type {
            PduType::H2CTermReq | PduType::C2HTermReq => MAX_TERM_DATA_BYTES as u32,
            _ => self.max_data_bytes,
        };
        if data_len > limit {
            return Err(PduError::DataLimitExceeded { len: data_len, limit });
        }
        let header = match pdu_type {
            PduType::ICReq | PduType::ICResp => {
                if plen != 128 {
                    return Err(PduError::InvalidField { offset: 4, what: "PLEN of an IC PDU must be 128" });
                }
                let pfv = get_u16(stage, 8);
                if pfv != 0 {
                    return Err(PduError::Unsupported { offset: 8, what: "PDU format version other than 0" });
                }
                let alignment = stage[10];
                if alignment > 31 {
                    return Err(PduError::InvalidField { offset: 10, what: "PDA above 31" });
                }
                let digests = Digests::from_byte(stage[11]);
                if pdu_type == PduType::ICReq {
                    PduHeader::InitRequest { pfv, hpda: alignment, digests, maxr2t: get_u32(stage, 12) }
                } else {
                    let maxh2cdata = get_u32(stage, 12);
                    if maxh2cdata < 4096 || !maxh2cdata.is_multiple_of(4) {
                        return Err(PduError::InvalidField { offset: 12, what: "MAXH2CDATA below 4096 or unaligned" });
                    }
                    PduHeader::InitResponse { pfv, cpda: alignment, digests, maxh2cdata }
                }
            }
            PduType::H2CTermReq | PduType::C2HTermReq => PduHeader::TermRequest {
                from_host: pdu_type == PduType::H2CTermReq,
                fes: get_u16(stage, 8),
                fei: get_u32(stage, 10),
            },
            PduType::CapsuleCmd => {
                let mut bytes = [0u8; COMMAND_BYTES];
                bytes.copy_from_slice(&stage[COMMON_HEADER_BYTES..COMMON_HEADER_BYTES + COMMAND_BYTES]);
                PduHeader::Command(Command::decode(&bytes))
            }
            PduType::CapsuleResp => {
                let mut bytes = [0u8; COMPLETION_BYTES];
                bytes.copy_from_slice(&stage[COMMON_HEADER_BYTES..COMMON_HEADER_BYTES + COMPLETION_BYTES]);
                PduHeader::Response(Completion::decode(&bytes))
            }
            PduType::H2CData | PduType::C2HData => {
                let datal = get_u32(stage, 16);
                if datal != data_len {
                    return Err(PduError::InvalidField { offset: 16, what: "DATAL disagrees with PLEN" });
                }
                let last = pdu_flags & flags::LAST_PDU != 0;
                if pdu_type == PduType::H2CData {
                    PduHeader::HostData {
                        cccid: get_u16(stage, 8),
                        ttag: get_u16(stage, 10),
                        offset: get_u32(stage, 12),
                        last,
                    }
                } else {
                    let success = pdu_flags & flags::SUCCESS != 0;
                    if success && !last {
                        return Err(PduError::InvalidField { offset: 1, what: "SUCCESS without LAST_PDU" });
                    }
                    PduHeader::ControllerData { cccid: get_u16(stage, 8), offset: get_u32(stage, 12), last, success }
                }
            }
            PduType::R2T => PduHeader::ReadyToTransfer {
                cccid: get_u16(stage, 8),
                ttag: get_u16(stage, 10),
                offset: get_u32(stage, 12),
                len: get_u32(stage, 16),
            },
        };
        Ok(ReceivedHeader { header, data_len, data_digest: data_digest && data_len > 0 })
    }

    /// The fatal error a received TermReq reports.
    pub fn term_error(fes: u16, fei: u32) -> PduError {
        PduError::Terminated { fes: FatalError::from_code(fes), fei }
    }
}

/// Encodes the header stage of a PDU carrying `data_len` data bytes: common header, specific header,
/// header digest (when negotiated and the type has one), and padding so the data starts at a multiple of
/// `data_alignment` (the receiver's PDA as bytes). Appends to `out` and returns nothing; the data and
/// its digest are appended by the caller ([`data_digest`]).
pub fn encode_header(out: &mut Vec<u8>, header: &PduHeader, digests: Digests, data_len: u32, data_alignment: usize) {
    let pdu_type = header.pdu_type();
    let hlen = pdu_type.header_len();
    let start = out.len();
    out.resize(start + hlen, 0);
    let mut pdu_flags = 0u8;
    let bytes = &mut out[start..];
    bytes[0] = pdu_type as u8;
    bytes[2] = hlen as u8;
    match header {
        PduHeader::InitRequest { pfv, hpda, digests, maxr2t } => {
            put_u16(bytes, 8, *pfv);
            bytes[10] = *hpda;
            bytes[11] = digests.to_byte();
            put_u32(bytes, 12, *maxr2t);
        }
        PduHeader::InitResponse { pfv, cpda, digests, maxh2cdata } => {
            put_u16(bytes, 8, *pfv);
            bytes[10] = *cpda;
            bytes[11] = digests.to_byte();
            put_u32(bytes, 12, *maxh2cdata);
        }
        PduHeader::TermRequest { fes, fei, .. } => {
            put_u16(bytes, 8, *fes);
            put_u32(bytes, 10, *fei);
        }
        PduHeader::Command(command) => {
            bytes[COMMON_HEADER_BYTES..COMMON_HEADER_BYTES + COMMAND_BYTES].copy_from_slice(&command.encode())
        }
        PduHeader::Response(completion) => {
            bytes[COMMON_HEADER_BYTES..COMMON_HEADER_BYTES + COMPLETION_BYTES].copy_from_slice(&completion.encode())
        }
        PduHeader::HostData { cccid, ttag, offset, last } => {
            put_u16(bytes, 8, *cccid);
            put_u16(bytes, 10, *ttag);
            put_u32(bytes, 12, *offset);
            put_u32(bytes, 16, data_len);
            if *last {
                pdu_flags |= flags::LAST_PDU;
            }
        }
        PduHeader::ControllerData { cccid, offset, last, success } => {
            put_u16(bytes, 8, *cccid);
            put_u32(bytes, 12, *offset);
            put_u32(bytes, 16, data_len);
            if *last {
                pdu_flags |= flags::LAST_PDU;
            }
            if *success {
                pdu_flags |= flags::SUCCESS;
            }
        }
        PduHeader::ReadyToTransfer { cccid, ttag, offset, len } => {
            put_u16(bytes, 8, *cccid);
            put_u16(bytes, 10, *ttag);
            put_u32(bytes, 12, *offset);
            put_u32(bytes, 16, *len);
        }
    }
    let header_digest = digests.header && pdu_type.digested();
    let with_data_digest = digests.data && pdu_type.digested() && data_len > 0;
    if header_digest {
        pdu_flags |= flags::HEADER_DIGEST;
    }
    if with_data_digest {
        pdu_flags |= flags::DATA_DIGEST;
    }
    out[start + 1] = pdu_flags;
    let mut stage_len = hlen + if header_digest { DIGEST_BYTES } else { 0 };
    let term = matches!(pdu_type, PduType::H2CTermReq | PduType::C2HTermReq);
    let pdo = if data_len > 0 && !term {
        stage_len = stage_len.next_multiple_of(data_alignment.max(4));
        stage_len
    } else {
        0
    };
    let plen = stage_len as u32 + data_len + if with_data_digest { DIGEST_BYTES as u32 } else { 0 };
    out[start + 3] = pdo as u8;
    put_u32(&mut out[start..], 4, plen);
    if header_digest {
        let digest = data_digest(&out[start..start + hlen]);
        out.extend_from_slice(&digest.to_le_bytes());
    }
    out.resize(start + stage_len, 0);
}

/// Appends a data digest for the `data` of a PDU with `header` when the connection uses data digests and
/// the PDU type carries them (TermReq PDUs never do).
pub fn encode_data_digest(out: &mut Vec<u8>, header: &PduHeader, digests: Digests, data: &[u8]) {
    if digests.data && !data.is_empty() && header.pdu_type().digested() {
        out.extend_from_slice(&data_digest(data).to_le_bytes());
    }
}

/// Decodes one whole PDU from `bytes`: its header, its data, and the number of bytes it used. For tests,
/// fuzzing and tools; connections decode in two steps to place data without a copy.
pub fn decode_pdu<'a>(decoder: &Decoder, bytes: &'a [u8]) -> Result<(ReceivedHeader, &'a [u8], usize), PduError> {
    let common: [u8; COMMON_HEADER_BYTES] = bytes
        .get(..COMMON_HEADER_BYTES)
        .and_then(|slice| slice.try_into().ok())
        .ok_or(PduError::Sequence("truncated PDU"))?;
    let stage_len = header_stage_len(decoder, &common)?;
    let stage = bytes.get(..stage_len).ok_or(PduError::Sequence("truncated PDU"))?;
    let received = decoder.decode_header(stage)?;
    let data_end = stage_len + received.data_len as usize;
    let data = bytes.get(stage_len..data_end).ok_or(PduError::Sequence("truncated PDU"))?;
    let mut used = data_end;
    if received.data_digest {
        let digest = bytes.get(data_end..data_end + DIGEST_BYTES).ok_or(PduError::Sequence("truncated PDU"))?;
        let received_digest = get_u32(digest, 0);
        let computed = data_digest(data);
        if received_digest != computed {
            return Err(PduError::DataDigest { received: received_digest, computed });
        }
        used += DIGEST_BYTES;
    }
    Ok((received, data, used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{IoOpcode, NvmeStatus, SglDescriptor};

    const BOTH: Digests = Digests { header: true, data: true };

    fn controller(digests: Digests) -> Decoder {
        Decoder { controller: true, digests, max_data_bytes: 1 << 20 }
    }

    fn host(digests: Digests) -> Decoder {
        Decoder { controller: false, digests, max_data_bytes: 1 << 20 }
    }

    fn pdu(header: &PduHeader, digests: Digests, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_header(&mut out, header, digests, data.len() as u32, 4);
        out.extend_from_slice(data);
        encode_data_digest(&mut out, header, digests, data);
        out
    }

    #[test]
    fn icreq_and_icresp_have_the_layout_of_figures_20_and_21() {
        let request = PduHeader::InitRequest { pfv: 0, hpda: 0, digests: BOTH, maxr2t: 0 };
        let bytes = pdu(&request, Digests::default(), &[]);
        assert_eq!(bytes.len(), 128);
        assert_eq!(&bytes[..8], &[0x00, 0x00, 128, 0, 128, 0, 0, 0]);
        assert_eq!(bytes[11], 0b11, "DGST: header and data digest");
        let (decoded, data, used) = decode_pdu(&controller(Digests::default()), &bytes).unwrap();
        assert_eq!((decoded.header, data.len(), used), (request, 0, 128));

        let response = PduHeader::InitResponse { pfv: 0, cpda: 0, digests: BOTH, maxh2cdata: 128 << 10 };
        let bytes = pdu(&response, Digests::default(), &[]);
        assert_eq!(&bytes[12..16], &(128u32 << 10).to_le_bytes(), "MAXH2CDATA");
        assert_eq!(decode_pdu(&host(Digests::default()), &bytes).unwrap().0.header, response);
    }

    #[test]
    fn the_digest_is_crc32c_at_every_length_and_alignment() {
        assert_eq!(data_digest(b"123456789"), 0xE306_9283, "the CRC-32C check value");
        let bytes: Vec<u8> = (0..9000u32).map(|at| (at.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for start in 0..17 {
            for len in (0..300).chain([4095, 4096, 4097, 8192, 8983 - start]) {
                let slice = &bytes[start..start + len];
                assert_eq!(data_digest(slice), crc32c::crc32c(slice), "{len} bytes from {start}");
            }
        }
    }

    #[test]
    fn a_capsule_with_in_capsule_data_and_digests_round_trips() {
        let mut command = Command::new(IoOpcode::Write as u8, 7);
        command.sgl = SglDescriptor::in_capsule(512);
        let data = vec![0x5a; 512];
        let bytes = pdu(&PduHeader::Command(command), BOTH, &data);
        assert_eq!(bytes[0], 0x04);
        assert_eq!(bytes[1], flags::HEADER_DIGEST | flags::DATA_DIGEST);
        assert_eq!(bytes[2], 72, "HLEN");
        assert_eq!(bytes[3], 76, "PDO: after the header digest");
        assert_eq!(get_u32(&bytes, 4), 72 + 4 + 512 + 4, "PLEN");
        assert_eq!(get_u32(&bytes, 72), crc32c::crc32c(&bytes[..72]), "HDGST covers the header");
        assert_eq!(get_u32(&bytes, 76 + 512), crc32c::crc32c(&data), "DDGST covers the data");
        let (decoded, received, used) = decode_pdu(&controller(BOTH), &bytes).unwrap();
        assert_eq!(decoded.header, PduHeader::Command(command));
        assert_eq!(received, &data[..]);
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn data_pdus_place_fields_at_their_offsets() {
        let header = PduHeader::ControllerData { cccid: 9, offset: 4096, last: true, success: true };
        let bytes = pdu(&header, Digests::default(), &[1; 100]);
        assert_eq!(&bytes[..4], &[0x07, flags::LAST_PDU | flags::SUCCESS, 24, 24]);
        assert_eq!(get_u16(&bytes, 8), 9);
        assert_eq!(get_u32(&bytes, 12), 4096, "DATAO");
        assert_eq!(get_u32(&bytes, 16), 100, "DATAL");
        assert_eq!(decode_pdu(&host(Digests::default()), &bytes).unwrap().0.header, header);

        let r2t = PduHeader::ReadyToTransfer { cccid: 3, ttag: 4, offset: 0, len: 65536 };
        let bytes = pdu(&r2t, BOTH, &[]);
        assert_eq!(bytes.len(), 28, "R2T: header and its digest, no data");
        assert_eq!(decode_pdu(&host(BOTH), &bytes).unwrap().0.header, r2t);

        let response = PduHeader::Response(Completion::new(3, NvmeStatus::SUCCESS));
        let bytes = pdu(&response, Digests::default(), &[]);
        assert_eq!(&bytes[..8], &[0x05, 0, 24, 0, 24, 0, 0, 0]);
    }

    #[test]
    fn hostile_headers_are_refused_with_the_right_fatal_error() {
        let command = PduHeader::Command(Command::new(IoOpcode::Read as u8, 1));
        let good = pdu(&command, BOTH, &[]);

        let mut corrupt = good.clone();
        corrupt[20] ^= 1;
        let error = decode_pdu(&controller(BOTH), &corrupt).unwrap_err();
        assert!(matches!(error, PduError::HeaderDigest { .. }));
        assert_eq!(error.term_request().unwrap().0, FatalError::HeaderDigest);

        let mut wrong_hlen = good.clone();
        wrong_hlen[2] = 70;
        assert_eq!(
            decode_pdu(&controller(BOTH), &wrong_hlen).unwrap_err().term_request(),
            Some((FatalError::InvalidHeaderField, 2))
        );

        assert!(decode_pdu(&host(BOTH), &good).is_err(), "a host refuses a command capsule");
        assert!(decode_pdu(&controller(Digests::default()), &good).is_err(), "digest not negotiated");

        let data = vec![0u8; 8192];
        let big = pdu(&PduHeader::HostData { cccid: 1, ttag: 1, offset: 0, last: true }, BOTH, &data);
        let small = Decoder { controller: true, digests: BOTH, max_data_bytes: 4096 };
        assert!(matches!(decode_pdu(&small, &big).unwrap_err(), PduError::DataLimitExceeded { len: 8192, .. }));

        let mut bad_data = big.clone();
        let last = bad_data.len() - 10;
        bad_data[last] ^= 0xff;
        assert!(matches!(decode_pdu(&controller(BOTH), &bad_data).unwrap_err(), PduError::DataDigest { .. }));

        let mut lying_datal = big;
        put_u32(&mut lying_datal, 16, 4096);
        let digest = data_digest(&lying_datal[..24]);
        put_u32(&mut lying_datal, 24, digest);
        assert!(matches!(
            decode_pdu(&controller(BOTH), &lying_datal).unwrap_err(),
            PduError::InvalidField { offset: 16, .. }
        ));
    }

    #[test]
    fn a_huge_plen_is_refused_before_anything_is_read() {
        let mut bytes =
            pdu(&PduHeader::HostData { cccid: 1, ttag: 1, offset: 0, last: true }, Digests::default(), &[0; 16]);
        put_u32(&mut bytes, 4, u32::MAX);
        put_u32(&mut bytes, 16, u32::MAX - 24);
        let decoder = controller(Digests::default());
        let stage = header_stage_len(&decoder, &bytes[..8].try_into().unwrap()).unwrap();
        assert!(matches!(decoder.decode_header(&bytes[..stage]).unwrap_err(), PduError::DataLimitExceeded { .. }));
    }
}
