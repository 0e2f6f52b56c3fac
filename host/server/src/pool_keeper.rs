//! Warm pools the server keeps full: members made in the background and
//! kept open (started, their agent attached), so that a claim hands over a
//! running sandbox instead of making one.
//!
//! One loop looks at the home's pools every few seconds, and at once when
//! woken (a claim, a new pool): it finishes claims a killed process left
//! half done, opens members on record it does not hold (after a server
//! restart), makes members up to each pool's size ([`MAKE_AT_ONCE`] at a
//! time), and checks each idle member's workspace is there and empty
//! ([`CHECK_EVERY`]); a member that fails is removed and replaced. A
//! member being checked or opened is not in the ready list, so no claim
//! gets it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth::sandbox::{PoolSpec, Pools, Sandbox};

/// How many members of one pool are made at once.
pub(crate) const MAKE_AT_ONCE: usize = 2;

/// How often an idle member is checked, and the home's pools read again.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);

/// A member started and open, ready to be handed over.
pub(crate) struct Ready {
    /// Its member name.
    pub(crate) member: String,
    /// The running sandbox.
    pub(crate) sandbox: Sandbox,
    checked: Instant,
}

/// What the keeper holds of one pool.
#[derive(Default)]
struct Slots {
    ready: VecDeque<Ready>,
    /// Members being made, opened or checked: not ready, not to be opened
    /// again.
    busy: HashSet<String>,
    /// Of `busy`, those being made (a member being made may be on record
    /// already, or not yet).
    making: HashSet<String>,
}

/// The pools this server keeps full.
pub(crate) struct PoolKeeper {
    pools: Pools,
    slots: Mutex<HashMap<String, Slots>>,
    wake: tokio::sync::Notify,
    running: AtomicBool,
}

impl PoolKeeper {
    pub(crate) fn new(pools: Pools) -> Self {
        PoolKeeper {
            pools,
            slots: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            running: AtomicBool::new(false),
        }
    }

    pub(crate) fn pools(&self) -> &Pools {
        &self.pools
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slots>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the keeping loop, once, on the current runtime.
    pub(crate) fn start(self: &Arc<Self>) {
        if !self.running.swap(true, Ordering::SeqCst) {
            let keeper = self.clone();
            tokio::spawn(async move { keeper.run().await });
        }
    }

    /// Looks at the pools now.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// A ready member of `pool`, out of the list (the caller hands it over
    /// or drops it; a dropped member is opened again from its record).
    pub(crate) fn take(&self, pool: &str) -> Option<Ready> {
        self.slots().get_mut(pool)?.ready.pop_front()
    }

    /// `pool`'s ready members and those being made.
    pub(crate) fn counts(&self, pool: &str) -> (usize, usize) {
        self.slots()
            .get(pool)
            .map(|s| (s.ready.len(), s.making.len()))
            .unwrap_or_default()
    }

    /// Lets go of `pool`'s open members (before it is removed): they close
    /// as they drop.
    pub(crate) fn release(&self, pool: &str) {
        let released = self.slots().remove(pool);
        drop(released);
    }

    /// Whether the home has a pool: a server keeping one does not exit
    /// when idle.
    pub(crate) fn keeps_any(&self) -> bool {
        !self.pools.list().is_empty()
    }

    async fn run(self: Arc<Self>) {
        loop {
            self.round();
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
        }
    }

    /// One look at every pool; the work it finds runs in tasks of its own.
    fn round(self: &Arc<Self>) {
        let pools = self.pools.list();
        {
            let mut slots = self.slots();
            slots.retain(|name, _| pools.iter().any(|p| p.spec.name == *name));
        }
        for status in pools {
            let pool = status.spec.name.clone();
            let mut to_open = Vec::new();
            let mut to_check = Vec::new();
            let to_make;
            {
                let mut slots = self.slots();
                let slot = slots.entry(pool.clone()).or_default();
                let held: HashSet<&str> = slot
                    .ready
                    .iter()
                    .map(|r| r.member.as_str())
                    .chain(slot.busy.iter().map(String::as_str))
                    .collect();
                for member in &status.members {
                    if !held.contains(member.as_str()) {
                        to_open.push(member.clone());
                    }
                }
                let on_record = status.members.len()
                    + slot
                        .making
                        .iter()
                        .filter(|m| !status.members.contains(m))
                        .count();
                let wanted = (status.spec.size as usize)
                    .saturating_sub(on_record)
                    .min(MAKE_AT_ONCE.saturating_sub(slot.making.len()));
                to_make = (0..wanted)
                    .map(|_| Pools::new_member_name(&pool))
                    .collect::<Vec<_>>();
                for member in &to_make {
                    slot.making.insert(member.clone());
                    slot.busy.insert(member.clone());
                }
                let now = Instant::now();
                while slot
                    .ready
                    .front()
                    .is_some_and(|r| now.duration_since(r.checked) >= CHECK_EVERY)
                {
                    if let Some(r) = slot.ready.pop_front() {
                        slot.busy.insert(r.member.clone());
                        to_check.push(r);
                    }
                }
                for member in &to_open {
                    slot.busy.insert(member.clone());
                }
            }
            for member in to_open {
                let keeper = self.clone();
                let pool = pool.clone();
                tokio::spawn(async move { keeper.open(&pool, member).await });
            }
            for ready in to_check {
                let keeper = self.clone();
                let pool = pool.clone();
                tokio::spawn(async move { keeper.check(&pool, ready).await });
            }
            for member in to_make {
                let keeper = self.clone();
                let spec = status.spec.clone();
                tokio::spawn(async move { keeper.make(spec, member).await });
            }
        }
    }

    /// Back into the ready list; a member of a pool removed meanwhile is
    /// removed too.
    async fn ready(&self, pool: &str, member: String, sandbox: Sandbox) {
        let orphan = {
            let mut slots = self.slots();
            match slots.get_mut(pool) {
                Some(slot) if self.pools.load(pool).is_ok() => {
                    slot.busy.remove(&member);
                    slot.ready.push_back(Ready {
                        member,
                        sandbox,
                        checked: Instant::now(),
                    });
                    None
                }
                _ => Some((member, sandbox)),
            }
        };
        if let Some((member, sandbox)) = orphan {
            drop(sandbox);
            self.pools.remove_member(pool, &member).await;
        }
    }

    fn not_busy(&self, pool: &str, member: &str) {
        if let Some(slot) = self.slots().get_mut(pool) {
            slot.busy.remove(member);
        }
    }

    async fn make(self: Arc<Self>, spec: PoolSpec, member: String) {
        let made = async {
            let (_, sandbox) = self.pools.add_member(&spec, &member).await?;
            // Its first helper call brings up what commands need (on
            // Docker, the agent copied in and its session opened): done
            // now, not on the claim's time.
            check_fresh(&sandbox).await?;
            Ok::<_, berth::sandbox::PoolError>(((), sandbox))
        }
        .await;
        if let Some(slot) = self.slots().get_mut(&spec.name) {
            slot.making.remove(&member);
        }
        match made {
            Ok((_, sandbox)) => {
                tracing::info!(pool = %spec.name, member, "pool member ready");
                self.ready(&spec.name, member, sandbox).await;
                self.wake();
            }
            Err(e) => {
                tracing::warn!(pool = %spec.name, error = %e, "making a pool member failed; trying again in {}s", CHECK_EVERY.as_secs());
                // Whatever of it was made.
                self.pools.remove_member(&spec.name, &member).await;
                self.not_busy(&spec.name, &member);
            }
        }
    }

    async fn open(self: Arc<Self>, pool: &str, member: String) {
        let opened = async {
            let members = self.pools.members(pool)?;
            let record = members.load(&member)?;
            let mut sandbox = members.resume(&record, |_| {}).await?;
            sandbox.attach().await?;
            check_fresh(&sandbox).await?;
            Ok::<_, berth::sandbox::PoolError>(sandbox)
        }
        .await;
        match opened {
            Ok(sandbox) => self.ready(pool, member, sandbox).await,
            Err(e) => {
                tracing::warn!(pool, member, error = %e, "a pool member did not open; replacing it");
                self.pools.remove_member(pool, &member).await;
                self.not_busy(pool, &member);
                self.wake();
            }
        }
    }

    async fn check(self: Arc<Self>, pool: &str, ready: Ready) {
        match check_fresh(&ready.sandbox).await {
            Ok(()) => self.ready(pool, ready.member, ready.sandbox).await,
            Err(e) => {
                tracing::warn!(pool, member = %ready.member, error = %e, "a pool member failed its check; replacing it");
                drop(ready.sandbox);
                self.pools.remove_member(pool, &ready.member).await;
                self.not_busy(pool, &ready.member);
                self.wake();
            }
        }
    }
}

/// A member's workspace is there and empty.
async fn check_fresh(sandbox: &Sandbox) -> Result<(), berth::sandbox::PoolError> {
    let found = sandbox
        .files()
        .list(".")
        .await
        .map_err(berth::sandbox::PoolError::Sandbox)?;
    if found.is_empty() {
        Ok(())
    } else {
        Err(berth::SandboxError::NotFresh {
            entries: found.len(),
        }
        .into())
    }
}

/// The reply's view of a pool.
pub(crate) fn pool_view(
    keeper: &PoolKeeper,
    spec: &PoolSpec,
    members: usize,
) -> crate::api_pools::Pool {
    let (ready, making) = keeper.counts(&spec.name);
    crate::api_pools::Pool {
        name: spec.name.clone(),
        size: spec.size,
        ready: ready as u32,
        members: members as u32,
        making: making as u32,
        template: serde_json::to_value(spec).unwrap_or_default(),
    }
}
