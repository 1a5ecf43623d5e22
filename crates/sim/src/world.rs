//! The simulated world, knowing no protocol: processes (anything implementing [`Process`])
//! exchange messages over a network that drops, duplicates, delays and reorders them and
//! cuts processes off; the world kills and restarts the processes marked faulty, and slows
//! their links. Time is simulated and every choice comes from one seeded ChaCha8 generator,
//! so a seed replays the same run exactly. A new protocol joins by implementing `Process`
//! for its actors and `Message` for what they send.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::rc::Rc;
use tutti_workload::Violation;

/// A process's address in the world: the order in which it was spawned.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct Addr(pub u32);

/// What travels over the simulated network.
pub trait Message: Any + Debug {
    /// Mixed into the trace hash when delivered.
    fn trace_id(&self) -> u64;
    /// A copy the network may deliver a second time, or `None` for a message the real
    /// transport never delivers twice and its sender never resends.
    fn duplicate(&self) -> Option<Box<dyn Message>>;
}

/// What a process sets to be woken up; it gets the same value back.
pub trait Timer: Any + Debug {}

impl<T: Any + Debug> Timer for T {}

/// An actor of the simulation: it reacts to messages, its own timers and faults, and acts
/// only through its [`Ctx`] (sending, setting timers, drawing random numbers).
pub trait Process: Any {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Box<dyn Message>);
    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>);
    /// Killed: with `power_loss`, what was written but not synced is gone too. Timers set
    /// before the crash never fire and messages to a crashed process are lost.
    fn on_crash(&mut self, ctx: &mut Ctx<'_>, power_loss: bool);
    /// Its disk replaced while it was down (right after `on_crash`): everything it ever
    /// wrote is gone. Only processes the guard of [`World::lose_disks`] lets lose their
    /// disk are told; the others keep theirs.
    fn on_disk_lost(&mut self, _ctx: &mut Ctx<'_>) {
        panic!("this process has no disk the fault schedule may take");
    }
    /// Starts: once when the world starts it, and again after every crash.
    fn on_restart(&mut self, ctx: &mut Ctx<'_>);
    /// Done with its work and holding nothing up: the run ends when every process is.
    fn settled(&self) -> bool;
    /// Says why it is not settled (for the liveness report).
    fn describe(&self) -> String;
}

/// Network and fault parameters. Times are in simulated microseconds.
#[derive(Clone, Debug)]
pub struct Faults {
    pub drop_probability: f64,
    pub duplicate_probability: f64,
    pub delay_us: (u64, u64),
    /// Mean time between crashes of a faulty process (half of them lose power).
    pub crash_interval_us: u64,
    pub partition_interval_us: u64,
    /// Mean time between slow episodes (one process's messages take 1–20 ms longer).
    pub slow_interval_us: u64,
    /// Faults stop here; every process must then settle within `liveness_bound_us`.
    pub faults_until_us: u64,
    pub liveness_bound_us: u64,
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: Addr,
        to: Addr,
        msg: Box<dyn Message>,
    },
    Timer {
        to: Addr,
        incarnation: u64,
        timer: Box<dyn Timer>,
    },
    Crash,
    Restart(Addr),
    Partition,
    Cut(Addr),
    Restore(Addr),
    Heal,
    SlowDown,
    SpeedUp(Addr),
}

/// Everything of the world but its processes, so that a process can act on it while the
/// world holds the process.
struct Core {
    faults: Faults,
    rng: ChaCha8Rng,
    now_us: u64,
    queue: BTreeMap<(u64, u64), Event>,
    seq: u64,
    next_id: u64,
    trace: u64,
    /// Cut off from everyone (a partition, or a swizzle in progress).
    cut: BTreeSet<Addr>,
    /// Every message from or to these takes 1–20 ms longer.
    slow: BTreeSet<Addr>,
    counters: BTreeMap<&'static str, u64>,
    /// Found by checks that run during the run (a node that recovered without a commit).
    violations: Vec<Violation>,
    /// A process's request to crash itself, carried out once its handler returns.
    crash_request: Option<(Addr, u64)>,
    /// A process's request to pause, carried out once its handler returns.
    pause_request: Option<(Addr, u64)>,
}

const FNV_PRIME: u64 = 0x100_0000_01b3;

impl Core {
    fn faults_on(&self) -> bool {
        self.now_us < self.faults.faults_until_us
    }

    fn at(&mut self, delay_us: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((self.now_us + delay_us, self.seq), event);
    }

    fn mix(&mut self, value: u64) {
        for byte in value.to_le_bytes() {
            self.trace ^= u64::from(byte);
            self.trace = self.trace.wrapping_mul(FNV_PRIME);
        }
    }

    fn send(&mut self, from: Addr, to: Addr, msg: Box<dyn Message>) {
        let touches = |set: &BTreeSet<Addr>| set.contains(&from) || set.contains(&to);
        let (cut, slow) = (touches(&self.cut), touches(&self.slow));
        if cut || (self.faults_on() && self.rng.gen_bool(self.faults.drop_probability)) {
            return;
        }
        let (lo, hi) = self.faults.delay_us;
        let (lo, hi) = if slow {
            (lo + 1_000, hi + 20_000)
        } else {
            (lo, hi)
        };
        if let Some(copy) = msg.duplicate() {
            if self.faults_on() && self.rng.gen_bool(self.faults.duplicate_probability) {
                let delay = self.rng.gen_range(lo..=hi);
                self.at(
                    delay,
                    Event::Deliver {
                        from,
                        to,
                        msg: copy,
                    },
                );
            }
        }
        let delay = self.rng.gen_range(lo..=hi);
        self.at(delay, Event::Deliver { from, to, msg });
    }
}

/// A process's handle on the world while it handles one event.
pub struct Ctx<'a> {
    core: &'a mut Core,
    me: Addr,
    incarnation: u64,
}

impl Ctx<'_> {
    pub fn me(&self) -> Addr {
        self.me
    }

    pub fn now_us(&self) -> u64 {
        self.core.now_us
    }

    /// Whether faults are still being injected (a process's own faults, too, stop then).
    pub fn faults_on(&self) -> bool {
        self.core.faults_on()
    }

    /// The world's generator: every random choice of a process comes from it.
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.core.rng
    }

    /// A number unique in the run (message ids).
    pub fn new_id(&mut self) -> u64 {
        self.core.next_id += 1;
        self.core.next_id
    }

    pub fn send(&mut self, to: Addr, msg: impl Message) {
        self.core.send(self.me, to, Box::new(msg));
    }

    /// Wakes this process with `timer` after `delay_us`, unless it crashes first.
    pub fn set_timer(&mut self, delay_us: u64, timer: impl Timer) {
        let event = Event::Timer {
            to: self.me,
            incarnation: self.incarnation,
            timer: Box::new(timer),
        };
        self.core.at(delay_us, event);
    }

    /// Counts something for the run's report.
    pub fn count(&mut self, what: &'static str, n: u64) {
        *self.core.counters.entry(what).or_default() += n;
    }

    /// Records an invariant found broken during the run.
    pub fn report(&mut self, violation: Violation) {
        self.core.violations.push(violation);
    }

    /// Dies once this handler returns, and restarts after `down_us`.
    pub fn crash_me(&mut self, down_us: u64) {
        self.core.crash_request = Some((self.me, down_us));
    }

    /// Handles nothing for `us` (a stalled process): events for it wait until then.
    pub fn pause_me(&mut self, us: u64) {
        self.core.pause_request = Some((self.me, us));
    }
}

struct Slot {
    process: Box<dyn Process>,
    up: bool,
    /// Bumped on every crash, so that timers set before it never fire.
    incarnation: u64,
    /// Handles nothing before this time.
    paused_until_us: u64,
    /// Crashed and restarted by the world's fault schedule.
    faulty: bool,
}

/// Whether the fault schedule may crash a process, or cut it off, now, given the world: a
/// run's fault model beyond "any faulty process, any time" (`ram-repl` survives the loss
/// of one copy of a node while the managers see the other, and no more).
pub type FaultGuard = Rc<dyn Fn(&World, Addr) -> bool>;

/// Processes, the network between them, and the faults.
pub struct World {
    core: Core,
    slots: Vec<Slot>,
    fault_guard: Option<FaultGuard>,
    /// The share of crashes that also take the process's disk, where the guard allows it.
    disk_loss: Option<(f64, FaultGuard)>,
    events: u64,
    /// `TUTTI_SIM_TRACE=1` prints every event (for debugging one seed).
    print_trace: bool,
    /// A check that looks at the whole world after every event (`after_each_event`).
    after_event: Option<EventCheck>,
}

/// What `World::after_each_event` runs.
type EventCheck = Box<dyn FnMut(&World)>;

impl World {
    pub fn new(seed: u64, faults: Faults) -> World {
        World {
            core: Core {
                faults,
                rng: ChaCha8Rng::seed_from_u64(seed),
                now_us: 0,
                queue: BTreeMap::new(),
                seq: 0,
                next_id: 1,
                trace: 0xcbf2_9ce4_8422_2325,
                cut: BTreeSet::new(),
                slow: BTreeSet::new(),
                counters: BTreeMap::new(),
                violations: Vec::new(),
                crash_request: None,
                pause_request: None,
            },
            slots: Vec::new(),
            fault_guard: None,
            disk_loss: None,
            events: 0,
            print_trace: std::env::var_os("TUTTI_SIM_TRACE").is_some(),
            after_event: None,
        }
    }

    /// Runs `check` after every event, at the instant the event happened: for checks of
    /// what a process answered against the state of the others at that moment.
    pub fn after_each_event(&mut self, check: impl FnMut(&World) + 'static) {
        self.after_event = Some(Box::new(check));
    }

    /// From now on the fault schedule crashes a process, or cuts it off, only if `guard`
    /// allows it.
    pub fn guard_faults(&mut self, guard: FaultGuard) {
        self.fault_guard = Some(guard);
    }

    /// From now on a crash of the schedule also takes the process's disk (a replaced disk:
    /// `Process::on_disk_lost`) with `probability`, where `guard` allows it at the crash.
    pub fn lose_disks(&mut self, probability: f64, guard: FaultGuard) {
        self.disk_loss = Some((probability, guard));
    }

    /// Whether the process at `addr` is up (not crashed).
    pub fn is_up(&self, addr: Addr) -> bool {
        self.slots[addr.0 as usize].up
    }

    /// Whether the process at `addr` is cut off from every other.
    pub fn is_cut(&self, addr: Addr) -> bool {
        self.core.cut.contains(&addr)
    }

    /// Whether the fault guard lets the schedule crash or cut off `addr` now.
    fn spared(&self, addr: Addr) -> bool {
        let guard = self.fault_guard.clone();
        guard.is_some_and(|may| !may(self, addr))
    }

    /// The address the next spawned process gets.
    pub fn next_addr(&self) -> Addr {
        Addr(self.slots.len() as u32)
    }

    /// Adds a process; a `faulty` one is crashed, partitioned and slowed by the world.
    pub fn spawn(&mut self, process: Box<dyn Process>, faulty: bool) -> Addr {
        let addr = self.next_addr();
        self.slots.push(Slot {
            process,
            up: true,
            incarnation: 1,
            paused_until_us: 0,
            faulty,
        });
        addr
    }

    /// Lets a process act before anything is delivered (sets its first timers, sends).
    pub fn start(&mut self, addr: Addr) {
        self.with(addr, |p, ctx| p.on_restart(ctx));
    }

    pub fn now_us(&self) -> u64 {
        self.core.now_us
    }

    /// FNV-1a over every event processed: equal for equal runs.
    pub fn trace_hash(&self) -> u64 {
        self.core.trace
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn counter(&self, what: &str) -> u64 {
        self.core.counters.get(what).copied().unwrap_or(0)
    }

    /// What processes found broken during the run.
    pub fn violations(&self) -> &[Violation] {
        &self.core.violations
    }

    /// The process at `addr`, as its concrete type.
    pub fn process<P: Process>(&self, addr: Addr) -> &P {
        let process: &dyn Any = &*self.slots[addr.0 as usize].process;
        process
            .downcast_ref()
            .expect("the process type spawned there")
    }

    /// Every process up and settled, faults over, nobody cut off.
    pub fn settled(&self) -> bool {
        !self.core.faults_on()
            && self.core.cut.is_empty()
            && self.slots.iter().all(|s| s.up && s.process.settled())
    }

    /// Why the world has not settled.
    pub fn unsettled(&self) -> Vec<String> {
        (self.slots.iter().enumerate())
            .filter(|(_, s)| !s.up || !s.process.settled())
            .map(|(i, s)| match s.up {
                true => format!("process {i}: {}", s.process.describe()),
                false => format!("process {i}: down"),
            })
            .collect()
    }

    /// Runs until every process settles after the faults, or the liveness bound passes.
    pub fn run(&mut self) {
        let f = &self.core.faults;
        let (crash, partition, slow) = (
            f.crash_interval_us,
            f.partition_interval_us,
            f.slow_interval_us,
        );
        let deadline = f.faults_until_us + f.liveness_bound_us;
        if self.slots.iter().any(|s| s.faulty) {
            let first_crash = self.core.rng.gen_range(0..crash * 2);
            self.core.at(first_crash, Event::Crash);
            let first_partition = self.core.rng.gen_range(0..partition * 2);
            self.core.at(first_partition, Event::Partition);
            let first_slow = self.core.rng.gen_range(0..slow * 2);
            self.core.at(first_slow, Event::SlowDown);
        }
        while let Some(((at, _), event)) = self.core.queue.pop_first() {
            self.core.now_us = at;
            if self.settled() || at > deadline {
                break;
            }
            self.events += 1;
            self.core.mix(at);
            if self.print_trace {
                eprintln!("{at:>10} {event:?}");
            }
            self.handle(event);
            if let Some(mut check) = self.after_event.take() {
                check(self);
                self.after_event = Some(check);
            }
        }
    }

    /// Runs `f` on the process at `addr` with its context, then carries out what it asked
    /// of the world itself.
    fn with(&mut self, addr: Addr, f: impl FnOnce(&mut dyn Process, &mut Ctx<'_>)) {
        let slot = &mut self.slots[addr.0 as usize];
        let mut ctx = Ctx {
            core: &mut self.core,
            me: addr,
            incarnation: slot.incarnation,
        };
        f(&mut *slot.process, &mut ctx);
        if let Some((who, us)) = self.core.pause_request.take() {
            self.slots[who.0 as usize].paused_until_us = self.core.now_us + us;
        }
        if let Some((who, down_us)) = self.core.crash_request.take() {
            self.crash(who, false);
            self.core.at(down_us, Event::Restart(who));
        }
    }

    /// A paused process handles nothing before it resumes: `Some(event)` back when this
    /// one was put off until then.
    fn defer(&mut self, to: Addr, event: Event) -> Option<Event> {
        let until = self.slots[to.0 as usize].paused_until_us;
        if self.core.now_us >= until {
            return Some(event);
        }
        self.core.at(until - self.core.now_us, event);
        None
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver { from, to, msg } => {
                self.core.mix(msg.trace_id());
                if !self.slots[to.0 as usize].up {
                    return;
                }
                if let Some(Event::Deliver { from, to, msg }) =
                    self.defer(to, Event::Deliver { from, to, msg })
                {
                    self.with(to, |p, ctx| p.on_message(ctx, from, msg));
                }
            }
            Event::Timer {
                to,
                incarnation,
                timer,
            } => {
                let slot = &self.slots[to.0 as usize];
                if !slot.up || slot.incarnation != incarnation {
                    return;
                }
                let event = Event::Timer {
                    to,
                    incarnation,
                    timer,
                };
                if let Some(Event::Timer { timer, .. }) = self.defer(to, event) {
                    self.with(to, |p, ctx| p.on_timer(ctx, timer));
                }
            }
            Event::Crash => {
                if self.core.faults_on() {
                    let victim = self.pick_faulty();
                    let power_loss = self.core.rng.gen_bool(0.5);
                    self.core.mix(u64::from(victim.0));
                    if self.slots[victim.0 as usize].up && !self.spared(victim) {
                        // Drawn only where disks may be lost, so that other runs keep their
                        // schedules. The guard looks at the world before the crash.
                        let disk_lost = self.disk_loss.clone().is_some_and(|(p, guard)| {
                            self.core.rng.gen_bool(p) && guard(self, victim)
                        });
                        self.crash(victim, power_loss);
                        if self.print_trace {
                            // The event's own line does not say whom it took.
                            eprintln!(
                                "{:>10} crashed {victim:?} (power lost: {power_loss}, disk lost: \
                                 {disk_lost})",
                                ""
                            );
                        }
                        *self.core.counters.entry("crashes").or_default() += 1;
                        if disk_lost {
                            self.with(victim, |p, ctx| p.on_disk_lost(ctx));
                            *self.core.counters.entry("disks_lost").or_default() += 1;
                        }
                    }
                    let down = self.core.rng.gen_range(5_000..200_000);
                    self.core.at(down, Event::Restart(victim));
                    let next = self
                        .core
                        .rng
                        .gen_range(0..self.core.faults.crash_interval_us * 2);
                    self.core.at(next, Event::Crash);
                }
            }
            Event::Restart(addr) => {
                let slot = &mut self.slots[addr.0 as usize];
                if !slot.up {
                    slot.up = true;
                    self.with(addr, |p, ctx| p.on_restart(ctx));
                }
            }
            Event::Partition => {
                if self.core.faults_on() {
                    self.partition();
                }
            }
            Event::Cut(addr) => {
                if !self.spared(addr) {
                    self.core.cut.insert(addr);
                }
            }
            Event::Restore(addr) => {
                self.core.cut.remove(&addr);
            }
            Event::SlowDown => {
                if self.core.faults_on() {
                    let victim = self.pick_faulty();
                    self.core.slow.insert(victim);
                    let length = self.core.rng.gen_range(50_000..300_000);
                    self.core.at(length, Event::SpeedUp(victim));
                    let next = self
                        .core
                        .rng
                        .gen_range(0..self.core.faults.slow_interval_us * 2);
                    self.core.at(next, Event::SlowDown);
                }
            }
            Event::SpeedUp(addr) => {
                self.core.slow.remove(&addr);
            }
            Event::Heal => {
                self.core.cut.clear();
                if self.core.faults_on() {
                    let next = self
                        .core
                        .rng
                        .gen_range(0..self.core.faults.partition_interval_us * 2);
                    self.core.at(next, Event::Partition);
                }
            }
        }
    }

    fn faulty(&self) -> Vec<Addr> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].faulty)
            .map(|i| Addr(i as u32))
            .collect()
    }

    fn pick_faulty(&mut self) -> Addr {
        let faulty = self.faulty();
        faulty[self.core.rng.gen_range(0..faulty.len())]
    }

    fn crash(&mut self, addr: Addr, power_loss: bool) {
        self.with(addr, |p, ctx| p.on_crash(ctx, power_loss));
        let slot = &mut self.slots[addr.0 as usize];
        slot.up = false;
        slot.incarnation += 1;
        slot.paused_until_us = 0;
    }

    /// Either one process cut off for a while, or a swizzle (FoundationDB): a random subset
    /// of the faulty processes cut off one by one, then restored one by one in another
    /// random order.
    fn partition(&mut self) {
        use rand::seq::SliceRandom;
        let rng = &mut self.core.rng;
        if rng.gen_bool(0.5) {
            let victim = self.pick_faulty();
            if !self.spared(victim) {
                self.core.cut.insert(victim);
            }
            let length = self.core.rng.gen_range(20_000..200_000);
            self.core.at(length, Event::Heal);
            return;
        }
        let mut victims = self.faulty();
        let rng = &mut self.core.rng;
        victims.shuffle(rng);
        victims.truncate(rng.gen_range(1..=victims.len()));
        let mut at = 0;
        for &victim in &victims {
            at += self.core.rng.gen_range(5_000..30_000);
            self.core.at(at, Event::Cut(victim));
        }
        victims.shuffle(&mut self.core.rng);
        for &victim in &victims {
            at += self.core.rng.gen_range(5_000..30_000);
            self.core.at(at, Event::Restore(victim));
        }
        self.core.at(at + 1, Event::Heal);
    }
}
