//! A namespace's reservation (NVMe Base Specification 2.0, 8.19): its registrants (a key per host, hosts
//! named by their Host Identifier from Connect), its holder and type, and the access check every I/O
//! command passes. One state per namespace, shared by every controller of the subsystem: registrations
//! belong to hosts, not to connections, so they outlive a controller's loss, which is what lets a host
//! that takes a namespace over fence out one that died or was cut off.
//!
//! The state sits behind a mutex taken by the Reservation commands, and by I/O commands only while a
//! reservation is held: `held` lets reads and writes of an unreserved namespace skip the lock.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::spec::{
    AcquireAction, NvmeStatus, RegisterAction, Registrant, ReleaseAction, ReservationStatus, ReservationType,
};

/// A Host Identifier.
pub(crate) type HostId = [u8; 16];

struct Entry {
    host: HostId,
    key: u64,
    cntlid: u16,
}

struct Holder {
    rtype: ReservationType,
    host: HostId,
}

#[derive(Default)]
struct State {
    registrants: Vec<Entry>,
    holder: Option<Holder>,
    generation: u32,
}

impl State {
    fn entry(&self, host: &HostId) -> Option<&Entry> {
        self.registrants.iter().find(|entry| entry.host == *host)
    }

    fn holds(&self, host: &HostId) -> bool {
        match &self.holder {
            Some(holder) if holder.rtype.all_registrants() => self.entry(host).is_some(),
            Some(holder) => holder.host == *host,
            None => false,
        }
    }

    /// The caller's registration, its key checked unless `ignore_existing_key`.
    fn registered(&self, host: &HostId, ignore_existing_key: bool, key: u64) -> Result<u64, NvmeStatus> {
        match self.entry(host) {
            Some(entry) if ignore_existing_key || entry.key == key => Ok(entry.key),
            _ => Err(NvmeStatus::RESERVATION_CONFLICT),
        }
    }

    /// Unregisters every other host whose key is `key`; how many.
    fn unregister_others(&mut self, host: &HostId, key: u64) -> usize {
        let before = self.registrants.len();
        self.registrants.retain(|entry| entry.host == *host || entry.key != key);
        before - self.registrants.len()
    }

    /// After registrants left: a holder that is no longer registered holds nothing.
    fn settle_holder(&mut self) {
        let gone = match &self.holder {
            Some(holder) if holder.rtype.all_registrants() => self.registrants.is_empty(),
            Some(holder) => self.entry(&holder.host).is_none(),
            None => false,
        };
        if gone {
            self.holder = None;
        }
    }
}

/// A namespace's reservation.
#[derive(Default)]
pub(crate) struct Reservations {
    held: AtomicBool,
    state: Mutex<State>,
}

impl Reservations {
    fn with<T>(&self, change: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = change(&mut state);
        self.held.store(state.holder.is_some(), Ordering::SeqCst);
        result
    }

    /// Whether `host` may read (or `write`) now.
    pub(crate) fn check(&self, host: &HostId, write: bool) -> Result<(), NvmeStatus> {
        if !self.held.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.with(|state| {
            let Some(holder) = &state.holder else { return Ok(()) };
            let allowed = state.holds(host) || holder.rtype.allows(state.entry(host).is_some(), write);
            if allowed { Ok(()) } else { Err(NvmeStatus::RESERVATION_CONFLICT) }
        })
    }

    /// Reservation Register. `cptpl` 3 (persist through power loss) is refused: nothing persists here.
    pub(crate) fn register(
        &self,
        (host, cntlid): (&HostId, u16),
        (action, ignore_existing_key, cptpl): (u8, bool, u8),
        (current, new): (u64, u64),
    ) -> Result<(), NvmeStatus> {
        if cptpl == 1 || cptpl == 3 {
            return Err(NvmeStatus::INVALID_FIELD.with_dnr());
        }
        self.with(|state| {
            match action {
                a if a == RegisterAction::Register as u8 => {
                    if let Some(entry) = state.entry(host) {
                        // Registering the key it holds is a no-op; another key is a conflict.
                        return if entry.key == new { Ok(()) } else { Err(NvmeStatus::RESERVATION_CONFLICT) };
                    }
                    state.registrants.push(Entry { host: *host, key: new, cntlid });
                }
                a if a == RegisterAction::Unregister as u8 => {
                    state.registered(host, ignore_existing_key, current)?;
                    state.registrants.retain(|entry| entry.host != *host);
                    state.settle_holder();
                }
                a if a == RegisterAction::Replace as u8 => match state.registrants.iter_mut().find(|e| e.host == *host)
                {
                    Some(entry) if ignore_existing_key || entry.key == current => entry.key = new,
                    Some(_) => return Err(NvmeStatus::RESERVATION_CONFLICT),
                    None if ignore_existing_key => state.registrants.push(Entry { host: *host, key: new, cntlid }),
                    None => return Err(NvmeStatus::RESERVATION_CONFLICT),
                },
                _ => return Err(NvmeStatus::INVALID_FIELD.with_dnr()),
            }
            state.generation = state.generation.wrapping_add(1);
            Ok(())
        })
    }

    /// Reservation Acquire: acquire, or preempt the registrants of key `preempt` (Preempt and Abort
    /// aborts nothing in flight: the preempted hosts' next commands fail the access check).
    pub(crate) fn acquire(
        &self,
        host: &HostId,
        (action, ignore_existing_key, rtype): (u8, bool, u8),
        (current, preempt): (u64, u64),
    ) -> Result<(), NvmeStatus> {
        let rtype = ReservationType::from_u8(rtype).ok_or(NvmeStatus::INVALID_FIELD.with_dnr())?;
        self.with(|state| {
            state.registered(host, ignore_existing_key, current)?;
            if action == AcquireAction::Acquire as u8 {
                return match &state.holder {
                    None => {
                        state.holder = Some(Holder { rtype, host: *host });
                        Ok(())
                    }
                    Some(holder) if holder.rtype == rtype && state.holds(host) => Ok(()),
                    Some(_) => Err(NvmeStatus::RESERVATION_CONFLICT),
                };
            }
            if action != AcquireAction::Preempt as u8 && action != AcquireAction::PreemptAndAbort as u8 {
                return Err(NvmeStatus::INVALID_FIELD.with_dnr());
            }
            let take_over = match &state.holder {
                None => false,
                Some(holder) if holder.rtype.all_registrants() => preempt == 0,
                Some(holder) => state.entry(&holder.host).is_some_and(|entry| entry.key == preempt),
            };
            if take_over {
                match preempt {
                    0 => state.registrants.retain(|entry| entry.host == *host),
                    key => {
                        state.unregister_others(host, key);
                    }
                }
                state.holder = Some(Holder { rtype, host: *host });
            } else {
                if preempt == 0 {
                    return Err(NvmeStatus::INVALID_FIELD.with_dnr());
                }
                if state.unregister_others(host, preempt) == 0 {
                    return Err(NvmeStatus::RESERVATION_CONFLICT);
                }
                state.settle_holder();
            }
            state.generation = state.generation.wrapping_add(1);
            Ok(())
        })
    }

    /// Reservation Release: release (the type must be the one held) or clear.
    pub(crate) fn release(
        &self,
        host: &HostId,
        (action, ignore_existing_key, rtype): (u8, bool, u8),
        current: u64,
    ) -> Result<(), NvmeStatus> {
        self.with(|state| {
            state.registered(host, ignore_existing_key, current)?;
            match action {
                a if a == ReleaseAction::Release as u8 => {
                    if state.holds(host) {
                        if state.holder.as_ref().is_some_and(|holder| holder.rtype as u8 != rtype) {
                            return Err(NvmeStatus::INVALID_FIELD.with_dnr());
                        }
                        state.holder = None;
                    }
                    Ok(())
                }
                a if a == ReleaseAction::Clear as u8 => {
                    state.registrants.clear();
                    state.holder = None;
                    state.generation = state.generation.wrapping_add(1);
                    Ok(())
                }
                _ => Err(NvmeStatus::INVALID_FIELD.with_dnr()),
            }
        })
    }

    /// Reservation Report's data.
    pub(crate) fn report(&self) -> ReservationStatus {
        self.with(|state| ReservationStatus {
            generation: state.generation,
            rtype: state.holder.as_ref().map(|holder| holder.rtype),
            registrants: state
                .registrants
                .iter()
                .map(|entry| Registrant {
                    cntlid: entry.cntlid,
                    holds: state.holds(&entry.host),
                    key: entry.key,
                    host_id: entry.host,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: HostId = [1; 16];
    const B: HostId = [2; 16];
    const C: HostId = [3; 16];
    const EA_RO: u8 = ReservationType::ExclusiveAccessRegistrantsOnly as u8;
    const WE: u8 = ReservationType::WriteExclusive as u8;

    fn register(reservations: &Reservations, host: &HostId, key: u64) {
        reservations.register((host, 1), (0, false, 0), (0, key)).expect("register");
    }

    #[test]
    fn a_survivor_preempts_the_dead_owner_and_fences_it() {
        let namespace = Reservations::default();
        register(&namespace, &A, 0xa);
        register(&namespace, &B, 0xb);
        namespace.acquire(&A, (0, false, EA_RO), (0xa, 0)).expect("A takes the namespace");
        assert_eq!(namespace.check(&C, false), Err(NvmeStatus::RESERVATION_CONFLICT), "not a registrant");
        assert_eq!(namespace.check(&B, true), Ok(()), "registrants only: B is one");
        assert_eq!(namespace.acquire(&B, (0, false, EA_RO), (0xb, 0)), Err(NvmeStatus::RESERVATION_CONFLICT));
        // B preempts A's key: A is unregistered, B holds, and A can neither read nor write.
        namespace.acquire(&B, (1, false, EA_RO), (0xb, 0xa)).expect("preempt");
        assert_eq!(namespace.check(&A, true), Err(NvmeStatus::RESERVATION_CONFLICT));
        assert_eq!(namespace.check(&A, false), Err(NvmeStatus::RESERVATION_CONFLICT));
        assert_eq!(namespace.check(&B, true), Ok(()));
        // A, back, cannot act with its old key.
        assert_eq!(namespace.acquire(&A, (1, false, EA_RO), (0xa, 0xb)), Err(NvmeStatus::RESERVATION_CONFLICT));
        let report = namespace.report();
        assert_eq!(report.rtype, Some(ReservationType::ExclusiveAccessRegistrantsOnly));
        assert_eq!(report.registrants.iter().map(|r| (r.host_id, r.holds)).collect::<Vec<_>>(), vec![(B, true)]);
        assert_eq!(report.generation, 3, "two registrations and a preemption");
    }

    #[test]
    fn keys_are_checked_and_registering_twice_is_idempotent() {
        let namespace = Reservations::default();
        register(&namespace, &A, 5);
        register(&namespace, &A, 5);
        assert_eq!(namespace.register((&A, 1), (0, false, 0), (0, 6)), Err(NvmeStatus::RESERVATION_CONFLICT));
        assert_eq!(namespace.register((&A, 1), (2, false, 0), (4, 6)), Err(NvmeStatus::RESERVATION_CONFLICT));
        namespace.register((&A, 1), (2, false, 0), (5, 6)).expect("replace with the right key");
        namespace.register((&A, 1), (2, true, 0), (0, 7)).expect("replace ignoring the key");
        assert_eq!(namespace.register((&A, 1), (0, false, 3), (0, 7)), Err(NvmeStatus::INVALID_FIELD.with_dnr()));
        assert_eq!(namespace.report().registrants[0].key, 7);
        assert_eq!(namespace.report().generation, 3);
    }

    #[test]
    fn write_exclusive_lets_anyone_read_and_release_needs_the_type() {
        let namespace = Reservations::default();
        register(&namespace, &A, 1);
        namespace.acquire(&A, (0, false, WE), (1, 0)).expect("acquire");
        assert_eq!(
            (namespace.check(&B, false), namespace.check(&B, true)),
            (Ok(()), Err(NvmeStatus::RESERVATION_CONFLICT))
        );
        assert_eq!(namespace.release(&A, (0, false, EA_RO), 1), Err(NvmeStatus::INVALID_FIELD.with_dnr()));
        namespace.release(&A, (0, false, WE), 1).expect("release");
        assert_eq!(namespace.check(&B, true), Ok(()));
        // Unregistering the holder releases too; clear removes everyone.
        namespace.acquire(&A, (0, false, WE), (1, 0)).expect("again");
        namespace.register((&A, 1), (1, false, 0), (1, 0)).expect("unregister");
        assert_eq!(namespace.report().rtype, None);
        register(&namespace, &B, 2);
        namespace.release(&B, (1, false, 0), 2).expect("clear");
        assert!(namespace.report().registrants.is_empty());
    }
}
