//! Connection settings written in a namespace's address, beside where it is: the Linux kernel's fabrics
//! option names, as `nvme connect` passes them (`hdr_digest`, `data_digest`, `queue_size`,
//! `keep_alive_tmo`, `ctrl_loss_tmo`, `reconnect_delay`), plus `io_timeout`, the kernel's
//! `nvme_core.io_timeout`. Each one given overrides the host's own option for that controller only, so a
//! node's tier, a bench job or a pool command can ask one target for digests or a shorter timeout without a
//! flag of its own. Times are seconds, as the kernel takes them (fractions allowed).

use std::fmt;
use std::time::Duration;

use super::HostOptions;

/// Overrides of [`HostOptions`] for one address; `None` keeps the host's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectSettings {
    /// `hdr_digest`: ask for the NVMe/TCP header digest (HDGST).
    pub header_digest: Option<bool>,
    /// `data_digest`: ask for the NVMe/TCP data digest (DDGST).
    pub data_digest: Option<bool>,
    /// `queue_size`: entries per I/O queue (still capped by what the controller offers).
    pub queue_size: Option<u16>,
    /// `keep_alive_tmo`: the controller's keep-alive timeout (0: none).
    pub keep_alive: Option<Duration>,
    /// `io_timeout`: how long a command may wait for its completion before its queue is reconnected.
    pub io_timeout: Option<Duration>,
    /// `ctrl_loss_tmo`: how long to keep reconnecting a lost controller.
    pub ctrl_loss: Option<Duration>,
    /// `reconnect_delay`: the pause between reconnect attempts.
    pub reconnect_delay: Option<Duration>,
}

/// The longest time a setting takes: a day (a longer one is a typo, and would overflow deadlines).
const LONGEST: Duration = Duration::from_secs(86_400);

/// The keys [`ConnectSettings::set`] takes, for error messages.
pub(super) const KEYS: &str =
    "hdr_digest, data_digest, queue_size, keep_alive_tmo, io_timeout, ctrl_loss_tmo, reconnect_delay";

impl ConnectSettings {
    /// Takes `key=value` if `key` is a setting: `Ok(false)` when it is not one, an error when its value is
    /// not valid. A digest key without a value (`hdr_digest`, as the kernel writes it) turns it on.
    pub(super) fn set(&mut self, key: &str, value: Option<&str>) -> Result<bool, String> {
        match key {
            "hdr_digest" => self.header_digest = Some(switch(key, value)?),
            "data_digest" => self.data_digest = Some(switch(key, value)?),
            "queue_size" => {
                let entries = required(key, value)?;
                let entries = entries.parse::<u16>().ok().filter(|entries| *entries >= 2);
                self.queue_size = Some(entries.ok_or_else(|| "queue_size must be 2 to 65535 entries".to_string())?);
            }
            "keep_alive_tmo" => self.keep_alive = Some(seconds(key, value)?),
            "io_timeout" => self.io_timeout = Some(seconds(key, value)?),
            "ctrl_loss_tmo" => self.ctrl_loss = Some(seconds(key, value)?),
            "reconnect_delay" => self.reconnect_delay = Some(seconds(key, value)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Whether a digest was asked for (NVMe/TCP only).
    pub(super) fn wants_digests(&self) -> bool {
        self.header_digest == Some(true) || self.data_digest == Some(true)
    }

    /// `host`, with these settings where given.
    pub fn apply(&self, host: &HostOptions) -> HostOptions {
        let mut options = host.clone();
        options.digests.header = self.header_digest.unwrap_or(host.digests.header);
        options.digests.data = self.data_digest.unwrap_or(host.digests.data);
        options.queue_entries = self.queue_size.unwrap_or(host.queue_entries);
        if let Some(keep_alive) = self.keep_alive {
            options.keep_alive_ms = u32::try_from(keep_alive.as_millis()).unwrap_or(u32::MAX);
        }
        options.command_timeout = self.io_timeout.unwrap_or(host.command_timeout);
        options.controller_loss_timeout = self.ctrl_loss.unwrap_or(host.controller_loss_timeout);
        options.reconnect_delay = self.reconnect_delay.unwrap_or(host.reconnect_delay);
        options
    }
}

impl fmt::Display for ConnectSettings {
    /// The settings given, each as `,key=value`, in the form [`ConnectSettings::set`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let switches = [("hdr_digest", self.header_digest), ("data_digest", self.data_digest)];
        for (key, on) in switches {
            if let Some(on) = on {
                write!(f, ",{key}={}", u8::from(on))?;
            }
        }
        if let Some(entries) = self.queue_size {
            write!(f, ",queue_size={entries}")?;
        }
        let times = [
            ("keep_alive_tmo", self.keep_alive),
            ("io_timeout", self.io_timeout),
            ("ctrl_loss_tmo", self.ctrl_loss),
            ("reconnect_delay", self.reconnect_delay),
        ];
        for (key, time) in times {
            if let Some(time) = time {
                write!(f, ",{key}=")?;
                write_seconds(f, time)?;
            }
        }
        Ok(())
    }
}

fn required<'a>(key: &str, value: Option<&'a str>) -> Result<&'a str, String> {
    value.ok_or_else(|| format!("{key} needs a value ({key}=...)"))
}

fn switch(key: &str, value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("1" | "on" | "true") => Ok(true),
        Some("0" | "off" | "false") => Ok(false),
        Some(other) => Err(format!("{key}={other:?}: expected 1 or 0")),
    }
}

/// Reads seconds written as `S` or `S.FFF` (up to nanoseconds), exactly: no float rounding, so an address
/// printed back reads as the same.
fn seconds(key: &str, value: Option<&str>) -> Result<Duration, String> {
    let text = required(key, value)?;
    let bad = || format!("{key}={text:?}: expected seconds from 0 to {}, e.g. 5 or 0.25", LONGEST.as_secs());
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 9 {
        return Err(bad());
    }
    let secs = whole.parse::<u64>().map_err(|_| bad())?;
    let nanos = format!("{fraction:0<9}").parse::<u32>().map_err(|_| bad())?;
    Some(Duration::new(secs, nanos)).filter(|time| *time <= LONGEST).ok_or_else(bad)
}

/// Writes `time` as [`seconds`] reads it, with no trailing zeros.
fn write_seconds(f: &mut fmt::Formatter<'_>, time: Duration) -> fmt::Result {
    write!(f, "{}", time.as_secs())?;
    if time.subsec_nanos() > 0 {
        let fraction = format!("{:09}", time.subsec_nanos());
        write!(f, ".{}", fraction.trim_end_matches('0'))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(pairs: &[(&str, Option<&str>)]) -> Result<ConnectSettings, String> {
        let mut settings = ConnectSettings::default();
        for (key, value) in pairs {
            assert!(settings.set(key, *value)?, "{key} is a setting");
        }
        Ok(settings)
    }

    #[test]
    fn each_setting_overrides_only_its_own_option() {
        let host = HostOptions::default();
        assert_eq!(format!("{:?}", ConnectSettings::default().apply(&host)), format!("{host:?}"));
        let settings = parsed(&[
            ("hdr_digest", None),
            ("data_digest", Some("1")),
            ("queue_size", Some("64")),
            ("keep_alive_tmo", Some("5")),
            ("io_timeout", Some("0.5")),
            ("ctrl_loss_tmo", Some("600")),
            ("reconnect_delay", Some("2")),
        ])
        .unwrap();
        let options = settings.apply(&host);
        assert!(options.digests.header && options.digests.data);
        assert_eq!(options.queue_entries, 64);
        assert_eq!(options.keep_alive_ms, 5_000);
        assert_eq!(options.command_timeout, Duration::from_millis(500));
        assert_eq!(options.controller_loss_timeout, Duration::from_secs(600));
        assert_eq!(options.reconnect_delay, Duration::from_secs(2));
        assert_eq!((options.hostnqn, options.host_id), (host.hostnqn.clone(), host.host_id));
        let off = parsed(&[("hdr_digest", Some("0"))]).unwrap();
        let digests_on = HostOptions { digests: crate::tcp::Digests { header: true, data: true }, ..host };
        let options = off.apply(&digests_on);
        assert!(!options.digests.header && options.digests.data, "only the header digest turned off");
    }

    #[test]
    fn bad_values_are_refused_and_other_keys_left_alone() {
        let mut settings = ConnectSettings::default();
        assert_eq!(settings.set("subnqn", Some("n")), Ok(false));
        for (key, value) in [
            ("hdr_digest", Some("yes")),
            ("queue_size", Some("1")),
            ("queue_size", Some("70000")),
            ("queue_size", None),
            ("io_timeout", Some("-1")),
            ("io_timeout", Some("NaN")),
            ("io_timeout", Some("1e3")),
            ("io_timeout", Some(".5")),
            ("io_timeout", Some("0.1234567891")),
            ("ctrl_loss_tmo", Some("86401")),
            ("reconnect_delay", None),
        ] {
            assert!(settings.set(key, value).is_err(), "{key}={value:?}");
        }
        assert_eq!(settings, ConnectSettings::default(), "a refused value changes nothing");
    }

    #[test]
    fn seconds_are_read_and_written_exactly() {
        for (text, time) in [
            ("0", Duration::ZERO),
            ("30", Duration::from_secs(30)),
            ("0.3", Duration::from_millis(300)),
            ("0.05", Duration::from_millis(50)),
            ("2.000000001", Duration::new(2, 1)),
            ("86400", LONGEST),
        ] {
            let mut settings = ConnectSettings::default();
            settings.set("io_timeout", Some(text)).unwrap();
            assert_eq!(settings.io_timeout, Some(time), "{text}");
            assert_eq!(settings.to_string(), format!(",io_timeout={text}"));
        }
    }
}
