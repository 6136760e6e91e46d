//! `strata-pool cluster status`: a cluster's members as etcd holds them, as a table or as JSON.

use std::fmt::Write;
use std::time::Duration;

use anyhow::Context;
use strata_cluster::{Member, TierSpace, View, WatchConfig, etcd_endpoints, read_members};

/// Reads cluster `cluster`'s members from the etcd that `etcd` (`etcd://…`) names.
pub fn read(etcd: &str, cluster: &str) -> anyhow::Result<View> {
    let endpoints = etcd_endpoints(etcd).context("--cluster")?;
    let config = WatchConfig { timeout: Duration::from_secs(5), ..WatchConfig::new(endpoints, cluster) };
    read_members(&config).with_context(|| format!("reading cluster {cluster:?} from {etcd}"))
}

/// The members as JSON: the cluster, the epoch and revision read at, and each member's entry (the
/// document a node answers MEMBERS with).
pub fn to_json(cluster: &str, view: &View) -> serde_json::Value {
    serde_json::to_value(view.document(cluster)).unwrap_or_default()
}

/// The members as a table, one line each.
pub fn format(cluster: &str, view: &View) -> String {
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
        let table = format("prod", &view);
        assert!(table.starts_with("cluster prod: 1 members, 0 serving (etcd revision 50)\n"), "{table}");
        let line = table.lines().nth(2).unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields, ["n1", "draining", "-", "42", "2", "1.0GiB/4.0GiB", "-", "1234"]);
        assert_eq!(to_json("prod", &view)["members"][0]["keys"], 1234);
    }
}
