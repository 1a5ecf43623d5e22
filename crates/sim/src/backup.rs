//! A simulated `tutti backup create`: at random times it takes a consistent cut of every
//! memory node with `BackupRun` (the code the real backup runs) over the simulated network,
//! and keeps each cut's images with the workload as it stood when the backup began, for the
//! check at the end of the run (`Bank::check_cut`). A backup that fails (a lost reply, a
//! node that crashed and forgot its cut) is taken again. Each backup is incremental from the
//! last one that completed: a node that gives only the pages written since has them laid
//! over that backup's image, as a restore does.

use crate::msg::{self, Directory, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use rand::Rng;
use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;
use tutti_client::backup::{BackupActions, BackupConfig, BackupRun};
use tutti_wire::{NodeId, Request};

/// How long a call waits for its reply before it counts as lost.
const REPLY_TIMEOUT_US: u64 = 50_000;
/// Pause before a failed backup is taken again.
const RETRY_US: u64 = 20_000;

/// A cut that was read whole: each node's image as of the cut, and the workload as it stood
/// when the backup began.
pub(crate) struct Cut<W> {
    pub(crate) before: W,
    pub(crate) images: Vec<Vec<u8>>,
}

#[derive(Debug)]
enum BackupTimer {
    Start,
    /// Send the call the run asked for at a later time.
    Send,
    /// The reply to call `id` is overdue.
    Overdue(u64),
}

struct Running<W> {
    id: u64,
    run: BackupRun,
    before: W,
    images: Vec<Vec<u8>>,
    /// The call waiting for its time (`BackupTimer::Send`).
    pending: Option<(NodeId, Request)>,
    /// The message id of the call in flight.
    in_flight: Option<u64>,
}

pub(crate) struct SimBackup<W> {
    dir: Rc<Directory>,
    workload: Rc<RefCell<W>>,
    nodes: NodeId,
    space_bytes: u64,
    /// Backups to take; start times are drawn below `start_before_us`.
    wanted: usize,
    start_before_us: u64,
    running: Option<Running<W>>,
    /// The last backup that completed, and its images.
    base: Option<(u64, Vec<Vec<u8>>)>,
    cuts: Rc<RefCell<Vec<Cut<W>>>>,
}

impl<W: Clone + 'static> SimBackup<W> {
    pub(crate) fn new(
        dir: Rc<Directory>,
        workload: Rc<RefCell<W>>,
        space_bytes: u64,
        wanted: usize,
        start_before_us: u64,
        cuts: Rc<RefCell<Vec<Cut<W>>>>,
    ) -> SimBackup<W> {
        SimBackup {
            nodes: dir.nodes_len() as NodeId,
            dir,
            workload,
            space_bytes,
            wanted,
            start_before_us,
            running: None,
            base: None,
            cuts,
        }
    }

    fn schedule_start(&self, ctx: &mut Ctx<'_>) {
        if self.cuts.borrow().len() < self.wanted {
            let delay = ctx.rng().gen_range(0..self.start_before_us.max(1));
            ctx.set_timer(delay, BackupTimer::Start);
        }
    }

    fn start(&mut self, ctx: &mut Ctx<'_>) {
        let cfg = BackupConfig {
            lock_timeout_us: 200_000,
            lock_poll_us: 1_000,
            read_bytes: 4096,
        };
        let id = ctx.rng().gen();
        let since = self.base.as_ref().map(|(id, _)| *id);
        let mut run = BackupRun::new(id, (1..=self.nodes).collect(), cfg, since);
        let acts = run.start(ctx.now_us());
        let images = match &self.base {
            Some((_, images)) => images.clone(),
            None => vec![vec![0; self.space_bytes as usize]; usize::from(self.nodes)],
        };
        self.running = Some(Running {
            id,
            run,
            before: self.workload.borrow().clone(),
            images,
            pending: None,
            in_flight: None,
        });
        self.apply(ctx, acts);
    }

    fn apply(&mut self, ctx: &mut Ctx<'_>, acts: BackupActions) {
        let r = self.running.as_mut().expect("a backup runs");
        if acts.cut_taken {
            for image in r.run.images().into_iter().filter(|i| !i.incremental) {
                r.images[usize::from(image.node) - 1].fill(0);
            }
            let incremental = r.run.images().iter().filter(|i| i.incremental).count();
            ctx.count("incremental_images", incremental as u64);
        }
        if let Some((node, runs)) = acts.chunk {
            let image = &mut r.images[usize::from(node) - 1];
            for (offset, bytes) in runs {
                image[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
            }
        }
        if let Some(done) = acts.done {
            let r = self.running.take().expect("a backup runs");
            match done {
                Ok(_) => {
                    ctx.count("backups", 1);
                    self.base = Some((r.id, r.images.clone()));
                    let cut = Cut {
                        before: r.before,
                        images: r.images,
                    };
                    self.cuts.borrow_mut().push(cut);
                    self.schedule_start(ctx);
                }
                Err(_) => {
                    ctx.count("backups_failed", 1);
                    ctx.set_timer(RETRY_US, BackupTimer::Start);
                }
            }
            return;
        }
        let call = acts.call.expect("a call until done");
        if acts.at_us > ctx.now_us() {
            r.pending = Some(call);
            ctx.set_timer(acts.at_us - ctx.now_us(), BackupTimer::Send);
        } else {
            self.send(ctx, call);
        }
    }

    fn send(&mut self, ctx: &mut Ctx<'_>, (node, req): (NodeId, Request)) {
        let id = ctx.new_id();
        self.running.as_mut().expect("a backup runs").in_flight = Some(id);
        ctx.send(self.dir.node(node), Msg::Req { id, req });
        ctx.set_timer(REPLY_TIMEOUT_US, BackupTimer::Overdue(id));
    }
}

impl<W: Clone + 'static> Process for SimBackup<W> {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, _from: Addr, msg: Box<dyn Message>) {
        let Msg::Resp { id, resp } = msg::open(msg) else {
            return;
        };
        let Some(r) = self.running.as_mut() else {
            return;
        };
        if r.in_flight == Some(id) {
            r.in_flight = None;
            let acts = r.run.on_reply(ctx.now_us(), Ok(resp));
            self.apply(ctx, acts);
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>) {
        let timer: Box<dyn Any> = timer;
        match *timer.downcast::<BackupTimer>().expect("a backup timer") {
            BackupTimer::Start => self.start(ctx),
            BackupTimer::Send => {
                let call = self.running.as_mut().and_then(|r| r.pending.take());
                if let Some(call) = call {
                    self.send(ctx, call);
                }
            }
            BackupTimer::Overdue(id) => {
                let Some(r) = self.running.as_mut() else {
                    return;
                };
                if r.in_flight == Some(id) {
                    r.in_flight = None;
                    let acts = r.run.on_reply(ctx.now_us(), Err("no reply".into()));
                    self.apply(ctx, acts);
                }
            }
        }
    }

    fn on_crash(&mut self, _ctx: &mut Ctx<'_>, _power_loss: bool) {
        unreachable!("the backup process is not faulty")
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        self.schedule_start(ctx);
    }

    fn settled(&self) -> bool {
        self.cuts.borrow().len() >= self.wanted
    }

    fn describe(&self) -> String {
        format!(
            "backup: {} of {} cuts taken{}",
            self.cuts.borrow().len(),
            self.wanted,
            if self.running.is_some() {
                ", one running"
            } else {
                ""
            }
        )
    }
}
