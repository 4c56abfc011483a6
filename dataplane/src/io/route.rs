//! The route refresher: reads the kernel's links, addresses, routes, neighbours and bridge
//! forwarding databases over netlink (`kxdp_kernel::netlink`), builds the immutable
//! [`Fib`](crate::fib::Fib), publishes it through an `ArcSwap`, and rebuilds it whenever the
//! kernel announces a change (netlink multicast groups, bridge FDB changes included). Workers
//! look up per packet without a lock or syscall.
//!
//! A next hop the neighbour table does not know (or knows as INCOMPLETE/FAILED) cannot be
//! addressed yet: a worker holds the frame (`crate::hold`) and the refresher asks the kernel to
//! resolve it (`RTM_NEWNEIGH` with `NTF_USE`, what sending there would trigger); the FIB it
//! publishes once the kernel announces the entry releases the held frames.
//!
//! Next hops kxdp forwards to are kept addressable although the kernel never sends there
//! (`crate::neigh`): STALE neighbours are refreshed before the kernel collects them, a
//! neighbour the kernel flushed keeps its last MAC while it is resolved again, a bridge FDB
//! entry the bridge aged out stays while its port does, and a neighbour behind a bridge whose
//! MAC is on no port is probed so that the bridge learns it.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use kxdp_packet::{Addr, Family};

use kxdp_kernel::netlink;

use crate::fib::Fib;
use crate::neigh::{Ask, Keeper};

/// Reads the calling thread's namespace's tables into a FIB.
pub fn read() -> io::Result<Fib> {
    Ok(Fib::new(netlink::dump_all()?))
}

/// [`read`], completed by `keeper` (`crate::neigh`), whose due next hops are then asked for.
fn read_kept(keeper: &mut Keeper) -> io::Result<Fib> {
    let mut input = netlink::dump_all()?;
    let now = Instant::now();
    keeper.complete(&mut input, now);
    ask_due(keeper, now);
    Ok(Fib::new(input))
}

fn ask_due(keeper: &mut Keeper, now: Instant) {
    for ask in keeper.due(now) {
        let _ = match ask {
            Ask::Use(oif, addr) => netlink::request_resolution(oif, addr),
            Ask::Probe(oif, addr, mac) => netlink::probe_neighbour(oif, addr, mac),
        };
    }
}

/// Asks the kernel to resolve `addr` on `ifindex` (RTM_NEWNEIGH with NTF_USE).
pub fn request_resolution(ifindex: u32, addr: &Addr, family: Family) -> io::Result<()> {
    netlink::request_resolution(ifindex, addr.to_ip(family))
}

/// A change counter threads wait on (the route table's: bumped after each new `Fib` is stored).
#[derive(Default)]
pub struct Changed {
    count: Mutex<u64>,
    cond: Condvar,
}

impl Changed {
    pub fn bump(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.cond.notify_all();
    }

    /// The count now.
    pub fn current(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the count differs from `seen` or `timeout` passes; returns the count.
    pub fn wait_newer(&self, seen: u64, timeout: Duration) -> u64 {
        let count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let (count, _) = self
            .cond
            .wait_timeout_while(count, timeout, |c| *c == seen)
            .unwrap_or_else(|e| e.into_inner());
        *count
    }
}

/// The published route table and the thread that keeps it current.
pub struct Routes {
    pub table: Arc<ArcSwap<Fib>>,
    /// Bumped after every new table: the link manager and the XDP-map refresh wait on it.
    pub changed: Arc<Changed>,
    /// Next hops workers could not address; the refresher asks the kernel to resolve them.
    pub unresolved: crossbeam::channel::Sender<(u32, Addr, Family)>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Routes {
    /// Reads the tables and starts the refresher (in the calling thread's namespace).
    pub fn start() -> io::Result<Routes> {
        // Subscribe before the first read so that no change is missed in between.
        let events = netlink::Events::subscribe()?;
        let mut keeper = Keeper::default();
        let first = read_kept(&mut keeper)?;
        // Resolve the next hops we already know of, so that the first packet toward a pod or
        // gateway the node has not talked to yet is not dropped for want of a MAC address.
        for (oif, a, f) in first.unresolved_next_hops() {
            let _ = request_resolution(oif, &a, f);
        }
        let table = Arc::new(ArcSwap::from_pointee(first));
        let (tx, rx) = crossbeam::channel::bounded::<(u32, Addr, Family)>(1024);
        let stop = Arc::new(AtomicBool::new(false));
        let changed = Arc::new(Changed::default());
        let (t2, s2, c2) = (table.clone(), stop.clone(), changed.clone());
        let thread = std::thread::Builder::new()
            .name("kxdp-routes".into())
            .spawn(move || refresher(events, keeper, &t2, &c2, &rx, &s2))?;
        Ok(Routes {
            table,
            changed,
            unresolved: tx,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Routes {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn refresher(
    mut events: netlink::Events,
    mut keeper: Keeper,
    table: &ArcSwap<Fib>,
    changed: &Changed,
    unresolved: &crossbeam::channel::Receiver<(u32, Addr, Family)>,
    stop: &AtomicBool,
) {
    let mut asked: HashMap<(u32, u128), std::time::Instant> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        if events.wait(Duration::from_millis(100)) {
            match read_kept(&mut keeper) {
                Ok(t) => {
                    // A neighbour the kernel now has is asked for again as soon as it goes
                    // missing (flushed, expired): a frame waiting for it would otherwise wait
                    // out the pause below with nobody resolving it.
                    asked.retain(|&(oif, a), _| !t.has_neighbour(oif, a));
                    let now = std::time::Instant::now();
                    for (oif, a, f) in t.unresolved_next_hops() {
                        let key = (oif, a.as_u128());
                        if asked
                            .get(&key)
                            .is_none_or(|t| now.duration_since(*t) >= Duration::from_secs(5))
                        {
                            asked.insert(key, now);
                            let _ = request_resolution(oif, &a, f);
                        }
                    }
                    table.store(Arc::new(t));
                    changed.bump();
                }
                Err(e) => tracing::warn!("kxdp: reading routes and neighbours: {e}"),
            }
        } else {
            // Quiet tables: a kept or STALE neighbour the kernel did nothing about is asked
            // for again on time.
            ask_due(&mut keeper, Instant::now());
        }
        while let Ok((oif, addr, family)) = unresolved.try_recv() {
            let now = std::time::Instant::now();
            let key = (oif, addr.as_u128());
            if asked
                .get(&key)
                .is_some_and(|t| now.duration_since(*t) < Duration::from_millis(500))
            {
                continue;
            }
            asked.insert(key, now);
            let _ = request_resolution(oif, &addr, family);
        }
        if asked.len() > 4096 {
            asked.clear();
        }
    }
}
