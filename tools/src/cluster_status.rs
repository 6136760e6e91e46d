//! `strata-pool cluster status`: a cluster's members, and who holds each NVMe tier on shared namespaces
//! (owner, state, fencing epoch), as etcd holds them, as a table or as JSON.

use std::fmt::Write;
use std::time::Duration;

use anyhow::Context;
use strata_cluster::{Member, TierRecord, TierRecords, TierSpace, View, WatchConfig, etcd_endpoints, read_members};

/// What etcd holds of a cluster: its members, and its tier records.
pub struct Status {
    /// The members.
    pub view: View,
    /// Who holds each node's NVMe tier on shared namespaces.
    pub tiers: Vec<TierRecord>,
}

/// Reads cluster `cluster`'s members and tier records from the etcd that `etcd` (`etcd://…`) names.
pub fn read(etcd: &str, cluster: &str) -> anyhow::Result<Status> {
    let endpoints = etcd_endpoints(etcd).context("--cluster")?;
    let limit = Duration::from_secs(5);
    let config = WatchConfig { timeout: limit, ..WatchConfig::new(endpoints.clone(), cluster) };
    let view = read_members(&config).with_context(|| format!("reading cluster {cluster:?} from {etcd}"))?;
    let tiers = TierRecords::connect(&endpoints, cluster, limit)
        .and_then(|mut records| records.read())
        .with_context(|| format!("reading cluster {cluster:?}'s tier records from {etcd}"))?;
    Ok(Status { view, tiers: tiers.into_iter().map(|(record, _)| record).collect() })
}

/// The status as JSON: the cluster, the epoch and revision read at, each member's entry (the document a
/// node answers MEMBERS with), and `tiers`, the tier records.
pub fn to_json(cluster: &str, status: &Status) -> serde_json::Value {
    let mut json = serde_json::to_value(status.view.document(cluster)).unwrap_or_default();
    if let Some(object) = json.as_object_mut() {
        object.insert("tiers".into(), serde_json::to_value(&status.tiers).unwrap_or_default());
    }
    json
}

/// The status as tables: the members, one line each, then the tiers on shared namespaces, if any.
pub fn format(cluster: &str, status: &Status) -> String {
    let mut out = format_members(cluster, &status.view);
    if !status.tiers.is_empty() {
        let _ = writeln!(out, "\nNVMe tiers on shared namespaces (taken over when their node dies):");
        let _ = writeln!(out, "{:<16} {:<16} {:<12} {:>6}  NAMESPACES", "NODE", "HELD BY", "STATE", "EPOCH");
        for tier in &status.tiers {
            let state = serde_json::to_value(tier.state).ok().and_then(|value| value.as_str().map(str::to_string));
            let _ = writeln!(
                out,
                "{:<16} {:<16} {:<12} {:>6}  {}",
                tier.node,
                tier.owner.as_deref().unwrap_or("-"),
                state.unwrap_or_default(),
                tier.epoch,
                tier.namespaces.join(" ")
            );
        }
    }
    out
}

/// The members as a table, one line each.
fn format_members(cluster: &str, view: &View) -> String {
    let serving = view.serving().count();
    let mut out = format!(
        "cluster {cluster}: {} members, {serving} serving (etcd revision {})\n",
        view.members.len(),
        view.revision
    );
    let _ = writeln!(
        out,
        "{:<16} {:<9} {:<10} {:>10} {:>6} {:>21} {:>21} {:>12}",
        "ID", "STATE", "ZONE", "EPOCH", "SHARDS", "DRAM USED/SIZE", "NVME USED/SIZE", "KEYS"
    );
    for member in &view.members {
        let _ = writeln!(out, "{}", row(member));
    }
    out
}

fn row(member: &Member) -> String {
    let state = serde_json::to_value(member.state).ok().and_then(|value| value.as_str().map(str::to_string));
    format!(
        "{:<16} {:<9} {:<10} {:>10} {:>6} {:>21} {:>21} {:>12}",
        member.id,
        state.unwrap_or_default(),
        if member.zone.is_empty() { "-" } else { &member.zone },
        member.epoch,
        member.shards.len(),
        used_of(member.dram),
        used_of(member.nvme),
        member.keys
    )
}

/// `used/size` in binary units.
fn used_of(tier: TierSpace) -> String {
    if tier.capacity == 0 {
        return "-".to_string();
    }
    format!("{}/{}", bytes(tier.capacity.saturating_sub(tier.free)), bytes(tier.capacity))
}

fn bytes(count: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = count as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{count}B") } else { format!("{value:.1}{}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_cluster::MemberState;

    #[test]
    fn a_member_is_one_line() {
        let member = Member {
            id: "n1".into(),
            shards: vec!["127.0.0.1:7600".parse().unwrap(), "127.0.0.1:7601".parse().unwrap()],
            zone: String::new(),
            state: MemberState::Draining,
            epoch: 42,
            dram: TierSpace { capacity: 4 << 30, free: 3 << 30 },
            nvme: TierSpace::default(),
            keys: 1234,
        };
        let view = View { epoch: 42, revision: 50, members: vec![member] };
        let tier = TierRecord {
            node: "n2".into(),
            namespaces: vec!["nvmf:trtype=tcp,traddr=127.0.0.1,trsvcid=4420,subnqn=nqn.p:a,ns=2".into()],
            shards: 1,
            region_bytes: 16 << 20,
            owner: Some("n1".into()),
            epoch: 3,
            state: strata_cluster::TierState::TakingOver,
        };
        let status = Status { view, tiers: vec![tier] };
        let table = format("prod", &status);
        assert!(table.starts_with("cluster prod: 1 members, 0 serving (etcd revision 50)\n"), "{table}");
        let line = table.lines().nth(2).unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields, ["n1", "draining", "-", "42", "2", "1.0GiB/4.0GiB", "-", "1234"]);
        let tier_line: Vec<&str> = table.lines().last().unwrap().split_whitespace().collect();
        assert_eq!(tier_line[..4], ["n2", "n1", "taking_over", "3"]);
        let json = to_json("prod", &status);
        assert_eq!(json["members"][0]["keys"], 1234);
        assert_eq!((json["tiers"][0]["owner"].as_str(), json["tiers"][0]["epoch"].as_u64()), (Some("n1"), Some(3)));
    }
}
