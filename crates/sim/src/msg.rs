//! The minitransaction protocol's messages on the simulated network, and where each
//! memory node and the manager are.

use crate::world::{Addr, Ctx, Message};
use std::any::Any;
use tutti_wire::{NodeId, Request, Response};

#[derive(Debug, Clone)]
pub(crate) enum Msg {
    Req { id: u64, req: Request },
    Resp { id: u64, resp: Response },
}

impl Message for Msg {
    fn trace_id(&self) -> u64 {
        match self {
            Msg::Req { id, .. } | Msg::Resp { id, .. } => *id,
        }
    }

    /// EXEC&PREPARE and EXECUTE-AHEAD are never duplicated: TCP does not duplicate, and
    /// coordinators never resend one (they retry with a new tid). A participant counts the
    /// items executed ahead, so a duplicate would be counted twice.
    fn duplicate(&self) -> Option<Box<dyn Message>> {
        match self {
            Msg::Req {
                req: Request::ExecPrepare(_) | Request::ExecuteAhead(_),
                ..
            } => None,
            _ => Some(Box::new(self.clone())),
        }
    }
}

/// The message a process of this protocol received (the world carries only `Msg` to it).
pub(crate) fn open(msg: Box<dyn Message>) -> Msg {
    let msg: Box<dyn Any> = msg;
    *msg.downcast()
        .expect("the minitransaction protocol's message")
}

/// A request that expects no reply (message id 0), such as a DECISION.
pub(crate) fn send_one_way(ctx: &mut Ctx<'_>, to: Addr, req: Request) {
    if let Request::Decisions(d) = &req {
        ctx.count("batched_decisions", u64::from(d.len() > 1));
        let with_lsns = d.iter().filter(|d| !d.lsns.is_empty()).count();
        ctx.count("commits_with_lsns", with_lsns as u64);
    }
    ctx.send(to, Msg::Req { id: 0, req });
}

/// Where the memory nodes and the managers are.
#[derive(Debug)]
pub(crate) struct Directory {
    /// Node `i + 1` is served at `nodes[i]`: its first primary, or (`log-repl`) the mirror
    /// that took over, from when it starts its recovery as the node: clients then find it
    /// as real ones find it in the manager's directory.
    pub(crate) nodes: std::cell::RefCell<Vec<Addr>>,
    /// Manager `i + 1` of the group is at `managers[i]`.
    pub(crate) managers: Vec<Addr>,
}

/// Which manager a simulated process asks, as `tutti_wire::Managers` picks one for the
/// real processes: the one last found leading; a `NotLeader` reply moves to the leader it
/// names (the next one if it names none), and a request left unanswered to the next one.
#[derive(Debug)]
pub(crate) struct ManagerRoute {
    managers: Vec<Addr>,
    at: usize,
}

impl ManagerRoute {
    pub(crate) fn new(dir: &Directory) -> ManagerRoute {
        ManagerRoute {
            managers: dir.managers.clone(),
            at: 0,
        }
    }

    pub(crate) fn addr(&self) -> Addr {
        self.managers[self.at]
    }

    /// Notes a reply: true if it is `NotLeader`, which the request must be asked again for.
    pub(crate) fn not_leader(&mut self, resp: &Response) -> bool {
        let Response::NotLeader { leader } = resp else {
            return false;
        };
        let named = (leader.as_deref()).and_then(|l| {
            (1..=self.managers.len() as u64).position(|id| crate::manager::manager_name(id) == l)
        });
        self.at = named.unwrap_or((self.at + 1) % self.managers.len());
        true
    }

    /// A request went unanswered.
    pub(crate) fn silent(&mut self) {
        self.at = (self.at + 1) % self.managers.len();
    }
}

impl Directory {
    pub(crate) fn new(nodes: Vec<Addr>, managers: Vec<Addr>) -> Directory {
        Directory {
            nodes: std::cell::RefCell::new(nodes),
            managers,
        }
    }

    pub(crate) fn node(&self, id: NodeId) -> Addr {
        self.nodes.borrow()[usize::from(id) - 1]
    }

    pub(crate) fn nodes_len(&self) -> usize {
        self.nodes.borrow().len()
    }

    /// Node `id` is served at `addr` from now on.
    pub(crate) fn serve_at(&self, id: NodeId, addr: Addr) {
        self.nodes.borrow_mut()[usize::from(id) - 1] = addr;
    }
}

/// A simulated process's address as placements name it.
pub(crate) fn name_of(addr: Addr) -> String {
    format!("sim-{}", addr.0)
}

/// The process a placement names.
pub(crate) fn addr_named(name: &str) -> Option<Addr> {
    name.strip_prefix("sim-")?.parse().ok().map(Addr)
}
