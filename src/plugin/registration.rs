//! When a plugin registers with kubelet: a pure state machine, unit-tested without sockets,
//! driven by `server`'s loop.
//!
//! kubelet never re-dials a plugin whose ListAndWatch ended (k/k #131013), and a restarted
//! kubelet deletes every socket in its directory and recreates `kubelet.sock`; so a plugin
//! must register again after each of those. A restart is all of them at once, and their
//! events arrive in any order, some before and some after the registration that answers
//! them: counting events registers twice per restart, and kubelet then replaces a client
//! whose stream is live. So the decision compares states, not events: a registration is
//! made against one `kubelet.sock` and one own socket (each known by inode and change time),
//! and only a socket that is not the one registered against, or the end of the current
//! registration's stream, calls for another. Stale events cost nothing.
//!
//! While unregistered the plugin retries with a doubling delay, and any kubelet event cuts
//! the wait short: kubelet admits the pods it finds about 60 ms after its socket appears,
//! and a device pod admitted before the plugin registers is refused for good.

use std::time::Duration;

pub use crate::kubelet::socket::FileId;

/// What kubelet's directory reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `kubelet.sock` created (or moved in).
    KubeletSocket,
    /// The plugin's own socket was deleted (or moved away).
    OwnSocketDeleted,
    /// The ListAndWatch stream of this registration ended.
    StreamEnded(u64),
}

/// The two sockets as they are when an event is judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sockets {
    pub kubelet: Option<FileId>,
    pub own: Option<FileId>,
}

/// What the loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing changed for this plugin: keep waiting (or keep backing off).
    Wait,
    /// Register now (serving the socket again first if it is gone).
    Register,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Current {
    epoch: u64,
    against: Sockets,
}

/// One plugin's registration state.
#[derive(Debug, Clone)]
pub struct Registrar {
    min: Duration,
    max: Duration,
    delay: Duration,
    epoch: u64,
    current: Option<Current>,
}

impl Registrar {
    /// Retries start at `min` and double up to `max`.
    pub fn new(min: Duration, max: Duration) -> Registrar {
        Registrar {
            min,
            max: max.max(min),
            delay: min,
            epoch: 0,
            current: None,
        }
    }

    /// The epoch of the attempt about to be made (ListAndWatch streams carry it).
    pub fn attempt(&mut self) -> u64 {
        self.epoch += 1;
        self.current = None;
        self.epoch
    }

    /// The attempt of `epoch` succeeded against `against`.
    pub fn registered(&mut self, epoch: u64, against: Sockets) {
        self.delay = self.min;
        self.current = Some(Current { epoch, against });
    }

    /// The last attempt failed: how long to wait before the next, unless an event comes.
    pub fn failed(&mut self) -> Duration {
        let wait = self.delay;
        self.delay = (self.delay * 2).min(self.max);
        wait
    }

    pub fn is_registered(&self) -> bool {
        self.current.is_some()
    }

    /// The registration the stream of `epoch` belongs to is the current one.
    pub fn is_current(&self, epoch: u64) -> bool {
        self.current.is_some_and(|c| c.epoch == epoch)
    }

    /// Judges `ev` against the sockets as they are `now`.
    pub fn on_event(&mut self, ev: Event, now: Sockets) -> Action {
        let Some(c) = self.current else {
            // Backing off: a new kubelet socket, or ours gone, is worth an attempt at once,
            // and the delays start over (kubelet is coming back, not still away).
            return match ev {
                Event::KubeletSocket | Event::OwnSocketDeleted => {
                    self.delay = self.min;
                    Action::Register
                }
                Event::StreamEnded(_) => Action::Wait,
            };
        };
        let changed = match ev {
            Event::StreamEnded(e) => e == c.epoch,
            Event::KubeletSocket => now.kubelet != c.against.kubelet,
            Event::OwnSocketDeleted => now.own != c.against.own,
        };
        if changed {
            self.current = None;
            Action::Register
        } else {
            Action::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn socks(kubelet: u64, own: u64) -> Sockets {
        Sockets {
            kubelet: Some(FileId::test(kubelet)),
            own: Some(FileId::test(own)),
        }
    }

    fn registered(kubelet: u64, own: u64) -> (Registrar, u64) {
        let mut r = Registrar::new(50 * MS, 30_000 * MS);
        let e = r.attempt();
        r.registered(e, socks(kubelet, own));
        (r, e)
    }

    /// A kubelet restart as a real kubelet makes it: the stream ends, our socket is deleted,
    /// kubelet.sock is recreated, in any order. Whether the plugin is registered when they
    /// come or is backing off (the old kubelet's end already seen, and its timer may fire
    /// and register before some events are read), exactly one registration succeeds.
    #[test]
    fn one_kubelet_restart_is_one_registration_in_any_event_order() {
        let events = [
            Event::StreamEnded(1),
            Event::OwnSocketDeleted,
            Event::KubeletSocket,
        ];
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        // After the restart: kubelet's new socket (2); ours deleted until served again (11).
        let restarted = Sockets {
            kubelet: Some(FileId::test(2)),
            own: None,
        };
        let served = socks(2, 11);
        for order in orders {
            for backing_off in [false, true] {
                // The backoff timer registers after `timer` events were read (3: never).
                for timer in 0..=3 {
                    if !backing_off && timer < 3 {
                        continue;
                    }
                    let (mut r, e) = registered(1, 10);
                    if backing_off {
                        assert_eq!(
                            r.on_event(Event::StreamEnded(e), socks(1, 10)),
                            Action::Register
                        );
                        r.attempt();
                        r.failed();
                    }
                    let mut world = restarted;
                    let mut registrations = 0;
                    let mut register = |r: &mut Registrar, world: &mut Sockets| {
                        *world = served;
                        let e = r.attempt();
                        r.registered(e, *world);
                        registrations += 1;
                    };
                    for (k, &i) in order.iter().enumerate() {
                        if k == timer && !r.is_registered() {
                            register(&mut r, &mut world);
                        }
                        if r.on_event(events[i], world) == Action::Register {
                            register(&mut r, &mut world);
                        }
                    }
                    assert_eq!(
                        registrations, 1,
                        "order {order:?}, backing off {backing_off}, timer after {timer}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_stream_of_an_older_registration_ending_is_expected() {
        let (mut r, e) = registered(1, 10);
        assert_eq!(
            r.on_event(Event::StreamEnded(e - 1), socks(1, 10)),
            Action::Wait
        );
        assert!(r.is_current(e));
        assert_eq!(
            r.on_event(Event::StreamEnded(e), socks(1, 10)),
            Action::Register
        );
        assert!(!r.is_registered());
    }

    #[test]
    fn events_about_the_sockets_registered_against_are_stale() {
        let (mut r, _) = registered(1, 10);
        assert_eq!(r.on_event(Event::KubeletSocket, socks(1, 10)), Action::Wait);
        assert_eq!(
            r.on_event(Event::OwnSocketDeleted, socks(1, 10)),
            Action::Wait
        );
        // Our socket deleted by someone else: served again and registered again.
        let gone = Sockets {
            own: None,
            ..socks(1, 10)
        };
        assert_eq!(r.on_event(Event::OwnSocketDeleted, gone), Action::Register);
    }

    #[test]
    fn a_socket_recreated_with_the_same_inode_is_another_socket() {
        let (mut r, _) = registered(1, 10);
        let mut again = socks(1, 10);
        again.kubelet = again.kubelet.map(FileId::changed);
        assert_eq!(r.on_event(Event::KubeletSocket, again), Action::Register);
    }

    #[test]
    fn backoff_doubles_to_the_limit_and_a_kubelet_event_cuts_it_short() {
        let mut r = Registrar::new(50 * MS, 400 * MS);
        let waits: Vec<Duration> = (0..6)
            .map(|_| {
                r.attempt();
                r.failed()
            })
            .collect();
        assert_eq!(
            waits,
            [50, 100, 200, 400, 400, 400].map(|m| m * MS).to_vec()
        );
        // kubelet.sock appears while the plugin waits 400 ms: register at once, and the
        // next failure (kubelet bound but not yet listening) waits the shortest delay again.
        assert_eq!(
            r.on_event(Event::KubeletSocket, Sockets::default()),
            Action::Register
        );
        r.attempt();
        assert_eq!(r.failed(), 50 * MS);
        // A stream ending is no news while unregistered.
        assert_eq!(
            r.on_event(Event::StreamEnded(3), Sockets::default()),
            Action::Wait
        );
    }

    #[test]
    fn registering_resets_the_backoff() {
        let mut r = Registrar::new(50 * MS, 400 * MS);
        for _ in 0..4 {
            r.attempt();
            r.failed();
        }
        let e = r.attempt();
        r.registered(e, socks(1, 1));
        assert_eq!(
            r.on_event(Event::StreamEnded(e), socks(1, 1)),
            Action::Register
        );
        r.attempt();
        assert_eq!(r.failed(), 50 * MS);
    }

    #[test]
    fn file_ids_tell_a_recreated_socket_apart() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kubelet.sock");
        assert_eq!(FileId::of(&p), None);
        let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let first = FileId::of(&p).unwrap();
        assert_eq!(FileId::of(&p), Some(first));
        drop(l);
        std::fs::remove_file(&p).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let _l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        assert_ne!(FileId::of(&p), Some(first));
    }
}
