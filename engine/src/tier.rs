//! The NVMe tier's namespaces at start-up: each one's pool superblock and tier header checked (or written,
//! for a new or erased tier), and their regions dealt to the shards. Generic over the device, so that the
//! node (over any `strata-nvme` device) and the simulation (over memory namespaces) format alike.

use strata_nvme::superblock::{
    NamespaceRole, PoolSuperblock, SuperblockError, read_at, read_superblock, uuid_text, write_block0, write_padded,
};
use strata_nvme::{BlockDevice, BlockError};

use crate::config::EngineConfig;
use crate::log::{RegionBuffer, RegionInfo, RegionLog, RegionState};
use crate::record::{FIRST_REGION_OFFSET, FormatError, TIER_HEADER_BYTES, TIER_HEADER_OFFSET, TierHeader};

/// Why a namespace cannot hold the tier.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The namespace could not be opened.
    #[error("{name}: {source}")]
    Open {
        /// The namespace.
        name: String,
        /// Why.
        #[source]
        source: strata_nvme::OpenError,
    },
    /// A read or write of the namespace failed.
    #[error("{name}: {source}")]
    Io {
        /// The namespace.
        name: String,
        /// The device's error (operation, device, offset).
        #[source]
        source: BlockError,
    },
    /// The namespace belongs to another pool than the pool description's.
    #[error("{name} belongs to pool {pool_name:?} ({found}), not to the pool description's ({expected})")]
    WrongPool {
        /// The namespace.
        name: String,
        /// The pool it belongs to.
        pool_name: String,
        /// That pool's UUID.
        found: String,
        /// The UUID the description names.
        expected: String,
    },
    /// A pool description names the namespace, but it holds no pool superblock.
    #[error("{name} is not formatted into a pool: run strata-pool create (or add) first")]
    NotInPool {
        /// The namespace.
        name: String,
    },
    /// The pool superblock is damaged or of another version.
    #[error("{name}: {source}; run strata-pool create --force to reformat it")]
    Superblock {
        /// The namespace.
        name: String,
        /// What is wrong with it.
        #[source]
        source: SuperblockError,
    },
    /// The tier was formatted for another number of shards.
    #[error(
        "{name} holds a tier formatted for {found} shards; start with {found} cores (--cores), or erase it with --format"
    )]
    ShardCount {
        /// The namespace.
        name: String,
        /// Shards it was formatted for.
        found: u32,
    },
    /// The tier was formatted with another region size.
    #[error(
        "{name} holds a tier with {} MiB regions; start with --region-size {}MiB, or erase it with --format",
        found >> 20,
        found >> 20
    )]
    RegionSize {
        /// The namespace.
        name: String,
        /// Its region size.
        found: u64,
    },
    /// The namespace cannot hold one region.
    #[error("{name} holds {capacity_bytes} bytes: too small for one {} KiB region after the first MiB", region_bytes >> 10)]
    TooSmall {
        /// The namespace.
        name: String,
        /// Its capacity.
        capacity_bytes: u64,
        /// The region size.
        region_bytes: u64,
    },
    /// The tier header is damaged.
    #[error("{name}: the tier header is damaged ({source}); start with --format to erase the tier")]
    Damaged {
        /// The namespace.
        name: String,
        /// How.
        #[source]
        source: FormatError,
    },
    /// The tier has no region for a shard.
    #[error("the NVMe tier has no region for shard {shard}: give it more capacity")]
    NoRegion {
        /// The shard.
        shard: u32,
    },
}

/// The identities a namespace formatted now is given: the pool of a namespace that belongs to none, and
/// the tier's format id (what seeds its record checksums). The node draws them at random; the simulation
/// from its seed.
#[derive(Clone, Copy, Debug)]
pub struct FreshIds {
    /// The pool UUID written into a namespace that has no pool superblock.
    pub pool_uuid: [u8; 16],
    /// The format id of a tier formatted now.
    pub format_id: u64,
}

/// Which namespace of how many, and its name for messages.
#[derive(Clone, Copy, Debug)]
pub struct NamespaceSlot<'a> {
    /// Its name (a path, `memory:N`, an NVMe-oF address).
    pub name: &'a str,
    /// Its index in the tier.
    pub index: u32,
    /// Namespaces in the tier.
    pub count: u32,
}

/// Checks namespace `slot`'s pool superblock and tier header, formatting what is new (or the tier, with
/// `config.format`); returns its tier header and its capacity.
pub async fn prepare_namespace<D: BlockDevice>(
    device: &D,
    slot: NamespaceSlot<'_>,
    config: &EngineConfig,
    fresh: FreshIds,
) -> Result<(TierHeader, u64), TierError> {
    let name = slot.name;
    let io = |source: BlockError| TierError::Io { name: name.to_string(), source };
    check_pool(device, slot, config, fresh).await?;
    let geometry = device.geometry();
    let block = geometry.logical_block_bytes as usize;
    let tier_len = block.max(TIER_HEADER_BYTES).next_multiple_of(block);
    let existing = TierHeader::decode(read_at(device, TIER_HEADER_OFFSET, tier_len).await.map_err(io)?.as_slice());
    let shard_count = config.cpus.len() as u32;
    let header = match existing {
        Ok(found) if !config.format => {
            if found.shard_count != shard_count {
                return Err(TierError::ShardCount { name: name.to_string(), found: found.shard_count });
            }
            if found.region_bytes != config.region_bytes {
                return Err(TierError::RegionSize { name: name.to_string(), found: found.region_bytes });
            }
            TierHeader { epoch: found.epoch + 1, namespace_index: slot.index, ..found }
        }
        Ok(_) | Err(FormatError::NoMagic) => {
            let region_count = geometry.capacity_bytes.saturating_sub(FIRST_REGION_OFFSET) / config.region_bytes;
            if region_count == 0 {
                return Err(TierError::TooSmall {
                    name: name.to_string(),
                    capacity_bytes: geometry.capacity_bytes,
                    region_bytes: config.region_bytes,
                });
            }
            let header = TierHeader {
                shard_count,
                namespace_index: slot.index,
                region_bytes: config.region_bytes,
                first_region_offset: FIRST_REGION_OFFSET,
                region_count,
                format_id: fresh.format_id,
                epoch: 1,
            };
            zero_region_headers(device, &header, block).await.map_err(io)?;
            header
        }
        Err(source) => return Err(TierError::Damaged { name: name.to_string(), source }),
    };
    write_padded(device, TIER_HEADER_OFFSET, &header.encode(), tier_len).await.map_err(io)?;
    Ok((header, geometry.capacity_bytes))
}

/// Checks that the namespace belongs to the configured pool, or writes a local pool's superblock into a
/// namespace that belongs to none (when no pool is configured).
async fn check_pool<D: BlockDevice>(
    device: &D,
    slot: NamespaceSlot<'_>,
    config: &EngineConfig,
    fresh: FreshIds,
) -> Result<(), TierError> {
    let name = slot.name.to_string();
    let geometry = device.geometry();
    match read_superblock(device).await {
        Err(source) => Err(TierError::Io { name, source }),
        Ok(Ok(found)) => match config.pool_uuid {
            Some(expected) if found.pool_uuid != expected => Err(TierError::WrongPool {
                name,
                pool_name: found.pool_name,
                found: uuid_text(&found.pool_uuid),
                expected: uuid_text(&expected),
            }),
            _ => Ok(()),
        },
        Ok(Err(SuperblockError::NotFormatted)) if config.pool_uuid.is_none() => {
            let superblock = PoolSuperblock {
                pool_name: "strata-node-local".into(),
                pool_uuid: fresh.pool_uuid,
                index: slot.index,
                count: slot.count,
                role: NamespaceRole::Data,
                block_bytes: geometry.logical_block_bytes,
                capacity_bytes: geometry.capacity_bytes,
                formatted_at: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_secs()),
            };
            write_block0(device, &superblock.encode()).await.map_err(|source| TierError::Io { name, source })
        }
        Ok(Err(SuperblockError::NotFormatted)) => Err(TierError::NotInPool { name }),
        Ok(Err(source)) => Err(TierError::Superblock { name, source }),
    }
}

/// Zeroes the first block of every region of a tier being formatted: recovery takes a region whose header
/// is neither zeros nor intact for damage, and what an earlier format left there (another region size)
/// would be neither.
async fn zero_region_headers<D: BlockDevice>(
    device: &D,
    header: &TierHeader,
    block: usize,
) -> strata_nvme::BlockResult<()> {
    for region in 0..header.region_count {
        let mut zeros = device.alloc_buffer(block);
        zeros.as_mut_slice().fill(0);
        device.write(zeros, header.first_region_offset + region * header.region_bytes).await.1?;
    }
    device.flush().await
}

/// Region `r` of namespace `k` belongs to shard `(r + k) % shards`; a shard's regions are listed by `r`
/// then `k`, so consecutive regions of one shard alternate between namespaces.
pub fn regions_of_shard(headers: &[(TierHeader, u64)], shard: u32, shard_count: u32) -> Vec<RegionInfo> {
    let most = headers.iter().map(|(header, _)| header.region_count).max().unwrap_or(0);
    let mut regions = Vec::new();
    for r in 0..most {
        for (k, (header, _)) in headers.iter().enumerate() {
            if r < header.region_count && (r + k as u64) % u64::from(shard_count) == u64::from(shard) {
                regions.push(RegionInfo {
                    device: k,
                    device_offset: header.first_region_offset + r * header.region_bytes,
                    seq: 0,
                    state: RegionState::Free,
                    sealed: None,
                });
            }
        }
    }
    regions
}

/// Shard `shard`'s region log over its share of the tier's regions, with buffers from its `devices`;
/// `None` without a tier.
pub fn region_log<D: BlockDevice>(
    devices: &[D],
    tier: &[(TierHeader, u64)],
    shard: u32,
    config: &EngineConfig,
) -> Result<Option<RegionLog>, TierError> {
    let (Some(first_device), Some(&(first, _))) = (devices.first(), tier.first()) else { return Ok(None) };
    let regions = regions_of_shard(tier, shard, config.cpus.len() as u32);
    if regions.is_empty() {
        return Err(TierError::NoRegion { shard });
    }
    let chunk_bytes =
        devices.iter().map(|device| device.geometry().max_transfer_bytes).min().unwrap_or(1 << 20).min(1 << 20)
            as usize;
    let block_bytes = devices.iter().map(|device| device.geometry().logical_block_bytes).max().unwrap_or(4096) as usize;
    let spare =
        (0..config.region_buffers).map(|_| RegionBuffer::new(first_device, config.region_bytes, chunk_bytes)).collect();
    Ok(Some(RegionLog {
        region_bytes: config.region_bytes,
        chunk_bytes,
        block_bytes,
        free: (0..regions.len() as u32).collect(),
        regions,
        sealed: Default::default(),
        open: None,
        spare,
        next_seq: 1,
        shard,
        format_id: first.format_id,
        epoch: first.epoch,
        closed: false,
    }))
}
