//! A sandbox's connection log: the newest connections, in a ring of fixed
//! size, each with its verdict and the rule that gave it.

use std::collections::VecDeque;

/// How many connections a log keeps unless told otherwise.
pub const DEFAULT_LOG_ENTRIES: usize = 1000;

/// What the policy made of a connection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Allowed, by this rule.
    Allowed {
        /// The allow rule, as written.
        rule: String,
    },
    /// Denied, and why (naming the rule, or the missing one).
    Denied {
        /// The reason, as [`crate::Denial`] says it.
        reason: String,
    },
}

/// One connection a sandbox asked for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Connection {
    /// When it was asked for, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The host asked for (a name or an IP literal).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// Bytes from the sandbox to the host.
    pub bytes_out: u64,
    /// Bytes from the host to the sandbox.
    pub bytes_in: u64,
    /// The secrets whose values the egress point put in its requests
    /// (by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Allowed or denied, and by what.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The newest connections of one sandbox, at most `capacity` of them;
/// older ones are dropped (and counted).
#[derive(Debug, Clone)]
pub struct ConnectionLog {
    entries: VecDeque<Connection>,
    capacity: usize,
    dropped: u64,
}

impl Default for ConnectionLog {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_LOG_ENTRIES)
    }
}

impl ConnectionLog {
    /// A log that keeps the newest `capacity` connections (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        ConnectionLog {
            entries: VecDeque::with_capacity(capacity.min(DEFAULT_LOG_ENTRIES)),
            capacity,
            dropped: 0,
        }
    }

    /// A log of the default size holding `connections` (the newest, if
    /// more), which count after `dropped` older ones.
    pub fn restored(connections: Vec<Connection>, dropped: u64) -> Self {
        let mut log = ConnectionLog {
            dropped,
            ..Self::default()
        };
        for connection in connections {
            log.record(connection);
        }
        log
    }

    /// Records a connection, dropping the oldest when full. Returns its
    /// sequence number (the count of connections ever recorded, minus
    /// one), by which [`ConnectionLog::update`] finds it again.
    pub fn record(&mut self, connection: Connection) -> u64 {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(connection);
        self.dropped + self.entries.len() as u64 - 1
    }

    /// Adds bytes to the connection recorded as `sequence`, if the log
    /// still holds it.
    pub fn update(&mut self, sequence: u64, bytes_out: u64, bytes_in: u64) {
        if let Some(entry) = self.get_mut(sequence) {
            entry.bytes_out += bytes_out;
            entry.bytes_in += bytes_in;
        }
    }

    /// Marks the connection recorded as `sequence` denied after all (by a
    /// check made after the policy's), if the log still holds it.
    pub fn deny(&mut self, sequence: u64, reason: String) {
        if let Some(entry) = self.get_mut(sequence) {
            entry.verdict = Verdict::Denied { reason };
        }
    }

    /// Notes the secrets sent on the connection recorded as `sequence`.
    pub fn note_secrets(&mut self, sequence: u64, names: Vec<String>) {
        if let Some(entry) = self.get_mut(sequence) {
            entry.secrets = names;
        }
    }

    fn get_mut(&mut self, sequence: u64) -> Option<&mut Connection> {
        let index = usize::try_from(sequence.checked_sub(self.dropped)?).ok()?;
        self.entries.get_mut(index)
    }

    /// The connections held, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &Connection> {
        self.entries.iter()
    }

    /// How many older connections were dropped to keep the log bounded.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn connection(i: u64) -> Connection {
        Connection {
            at_ms: i,
            host: format!("h{i}.test"),
            port: 443,
            bytes_out: 0,
            bytes_in: 0,
            secrets: Vec::new(),
            verdict: Verdict::Allowed {
                rule: "*.test".into(),
            },
        }
    }

    /// The log holds the newest `capacity` connections in order, counts
    /// the rest as dropped, and bytes reach the entry they belong to.
    #[test]
    fn the_log_keeps_the_newest_connections_and_counts_the_rest() {
        let mut rng = StdRng::seed_from_u64(0x106);
        for _ in 0..200 {
            let capacity = rng.gen_range(1..20);
            let mut log = ConnectionLog::with_capacity(capacity);
            let n = rng.gen_range(0..60u64);
            let mut sent = vec![0u64; n as usize];
            for i in 0..n {
                assert_eq!(log.record(connection(i)), i);
                for _ in 0..rng.gen_range(0..3) {
                    let which = rng.gen_range(0..=i);
                    let bytes = rng.gen_range(0..1000);
                    log.update(which, bytes, 1);
                    if which + capacity as u64 > i {
                        sent[which as usize] += bytes;
                    }
                }
            }
            let held: Vec<&Connection> = log.entries().collect();
            assert_eq!(held.len() as u64, n.min(capacity as u64));
            assert_eq!(log.dropped(), n - held.len() as u64);
            for (k, entry) in held.iter().enumerate() {
                let i = log.dropped() + k as u64;
                assert_eq!(entry.at_ms, i);
                assert_eq!(entry.bytes_out, sent[i as usize], "entry {i}");
            }
        }
    }

    #[test]
    fn a_denied_connection_reads_with_its_reason() {
        let mut entry = connection(1);
        entry.verdict = Verdict::Denied {
            reason: "no --allow-host rule names h1.test".into(),
        };
        let json = serde_json::to_value(&entry).unwrap();
        assert_eq!(json["verdict"], "denied");
        assert_eq!(json["reason"], "no --allow-host rule names h1.test");
        assert_eq!(serde_json::from_value::<Connection>(json).unwrap(), entry);
    }

    /// A log saved and restored goes on as if never stopped: the same
    /// entries, the same count of dropped ones, the same sequence numbers
    /// for what follows.
    #[test]
    fn a_restored_log_goes_on_where_the_saved_one_stopped() {
        let mut rng = StdRng::seed_from_u64(51);
        for _ in 0..50 {
            let mut log = ConnectionLog::default();
            for i in 0..rng.gen_range(0..2500u64) {
                log.record(connection(i));
            }
            let mut restored =
                ConnectionLog::restored(log.entries().cloned().collect(), log.dropped());
            assert_eq!(restored.dropped(), log.dropped());
            assert!(restored.entries().eq(log.entries()));
            assert_eq!(restored.record(connection(9)), log.record(connection(9)));
        }
    }
}
