//! A protocol the simulator has never heard of joins the world by implementing `Process`:
//! a pinger resends each ping until its pong arrives, to a ponger the world crashes,
//! partitions and slows down. Every ping gets through, and a seed replays exactly.

use std::any::Any;
use tutti_sim::world::{Addr, Ctx, Faults, Message, Process, Timer, World};

#[derive(Debug, Clone)]
enum Echo {
    Ping(u64),
    Pong(u64),
}

impl Message for Echo {
    fn trace_id(&self) -> u64 {
        match self {
            Echo::Ping(n) | Echo::Pong(n) => *n,
        }
    }

    fn duplicate(&self) -> Option<Box<dyn Message>> {
        Some(Box::new(self.clone()))
    }
}

fn open(msg: Box<dyn Message>) -> Echo {
    let msg: Box<dyn Any> = msg;
    *msg.downcast().expect("an echo message")
}

#[derive(Debug)]
struct Resend;

struct Pinger {
    to: Addr,
    next: u64,
    pings: u64,
}

impl Process for Pinger {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, _from: Addr, msg: Box<dyn Message>) {
        if let Echo::Pong(n) = open(msg) {
            if n == self.next && self.next < self.pings {
                self.next += 1;
                ctx.count("pongs", 1);
                self.ping(ctx);
            }
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, _timer: Box<dyn Timer>) {
        if self.next < self.pings {
            self.ping(ctx);
        }
    }

    fn on_crash(&mut self, _ctx: &mut Ctx<'_>, _power_loss: bool) {}

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        self.ping(ctx);
    }

    fn settled(&self) -> bool {
        self.next == self.pings
    }

    fn describe(&self) -> String {
        format!("pinger at ping {}", self.next)
    }
}

impl Pinger {
    fn ping(&mut self, ctx: &mut Ctx<'_>) {
        if self.next < self.pings {
            ctx.send(self.to, Echo::Ping(self.next));
            ctx.set_timer(10_000, Resend);
        }
    }
}

struct Ponger;

impl Process for Ponger {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Box<dyn Message>) {
        if let Echo::Ping(n) = open(msg) {
            ctx.send(from, Echo::Pong(n));
        }
    }

    fn on_timer(&mut self, _ctx: &mut Ctx<'_>, _timer: Box<dyn Timer>) {}
    fn on_crash(&mut self, _ctx: &mut Ctx<'_>, _power_loss: bool) {}
    fn on_restart(&mut self, _ctx: &mut Ctx<'_>) {}

    fn settled(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        "ponger".into()
    }
}

fn run(seed: u64) -> (u64, u64, u64) {
    let faults = Faults {
        drop_probability: 0.1,
        duplicate_probability: 0.05,
        delay_us: (20, 2_000),
        crash_interval_us: 50_000,
        partition_interval_us: 100_000,
        slow_interval_us: 100_000,
        faults_until_us: 1_000_000,
        liveness_bound_us: 1_000_000,
    };
    let mut world = World::new(seed, faults);
    let ponger = world.spawn(Box::new(Ponger), true);
    let pinger = Pinger {
        to: ponger,
        next: 0,
        pings: 500,
    };
    let pinger = world.spawn(Box::new(pinger), false);
    world.start(ponger);
    world.start(pinger);
    world.run();
    assert!(world.settled(), "seed {seed}: {:?}", world.unsettled());
    assert!(world.counter("crashes") > 0, "the ponger was crashed");
    (world.counter("pongs"), world.trace_hash(), world.events())
}

#[test]
fn a_new_protocol_runs_in_the_world() {
    for seed in 0..20 {
        let first = run(seed);
        assert_eq!(first.0, 500, "every ping answered");
        assert_eq!(first, run(seed), "seed {seed} replays");
    }
}
