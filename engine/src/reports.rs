//! What parts of a node outside its shards (its cluster membership) report in `/metrics` and `/healthz`.
//! The node serves the reports; the parts set them from their own threads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One part's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Prometheus text-format lines, `# HELP` and `# TYPE` included.
    pub metrics: String,
    /// Why the part is degraded, if it is: `/healthz` says so, and stays 200 while the shards serve.
    pub degraded: Option<String>,
}

/// The reports by part name. Clones share them.
#[derive(Clone, Debug, Default)]
pub struct Reports(Arc<Mutex<BTreeMap<&'static str, Report>>>);

impl Reports {
    /// Sets `part`'s report, replacing the one before.
    pub fn set(&self, part: &'static str, report: Report) {
        if let Ok(mut reports) = self.0.lock() {
            reports.insert(part, report);
        }
    }

    /// Every part's metrics, in part order.
    pub fn metrics(&self) -> String {
        self.0
            .lock()
            .map(|reports| reports.values().map(|report| report.metrics.as_str()).collect())
            .unwrap_or_default()
    }

    /// `part: why` for every degraded part.
    pub fn degraded(&self) -> Vec<String> {
        let Ok(reports) = self.0.lock() else { return Vec::new() };
        reports.iter().filter_map(|(part, report)| Some(format!("{part}: {}", report.degraded.as_ref()?))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_replaces_its_report_and_only_degraded_parts_are_listed() {
        let reports = Reports::default();
        let shared = reports.clone();
        shared.set("cluster", Report { metrics: "a 1\n".into(), degraded: Some("etcd unreachable".into()) });
        shared.set("other", Report { metrics: "b 2\n".into(), degraded: None });
        assert_eq!(reports.metrics(), "a 1\nb 2\n");
        assert_eq!(reports.degraded(), vec!["cluster: etcd unreachable".to_string()]);
        shared.set("cluster", Report { metrics: "a 0\n".into(), degraded: None });
        assert!(reports.degraded().is_empty());
        assert_eq!(reports.metrics(), "a 0\nb 2\n");
    }
}
