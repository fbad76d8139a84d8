//! The apply every backend shares: plan one change against what is programmed, fall back
//! to a full sync when nothing is known to be programmed or the plan needs one, write the
//! plan, then commit it to what is programmed — or forget what is programmed when the
//! write fails, so that the next apply is a full sync. Each backend says how it plans,
//! writes and commits ([`Incremental`]); [`apply`] is the order, once.

use kpx_proto::node_context::NodeContext;

use super::{Backend, BackendError};
use crate::state::{ChangeSet, NodeState};

/// What applying one change takes.
pub enum Planned<P> {
    /// A full sync: nothing is known to be programmed, or the change needs one.
    FullSync,
    /// Nothing differs in the kernel.
    Nothing,
    /// This plan, written as one transaction.
    Write(P),
}

impl<P> Planned<P> {
    /// `plan`, unless it `needs_full_sync` or is `empty`.
    pub fn unless(plan: P, needs_full_sync: bool, empty: bool) -> Planned<P> {
        match (needs_full_sync, empty) {
            (true, _) => Planned::FullSync,
            (false, true) => Planned::Nothing,
            (false, false) => Planned::Write(plan),
        }
    }
}

/// A backend that applies a change as a plan over what it programmed.
pub trait Incremental: Backend {
    type Plan;

    /// The plan of `changes` from what is programmed to `desired` in `context`.
    fn plan(
        &mut self,
        desired: &NodeState,
        context: &NodeContext,
        changes: &ChangeSet,
    ) -> Planned<Self::Plan>;

    /// Writes `plan` to the kernel, all or nothing.
    fn write(&mut self, plan: &mut Self::Plan) -> Result<(), BackendError>;

    /// Records a written plan in what is programmed.
    fn commit(&mut self, plan: Self::Plan);

    /// Forgets what is programmed (the kernel may differ from it now).
    fn forget(&mut self);
}

/// [`Backend::apply`] for an [`Incremental`] backend.
pub fn apply<B: Incremental>(
    backend: &mut B,
    desired: &NodeState,
    context: &NodeContext,
    changes: &ChangeSet,
) -> Result<(), BackendError> {
    match backend.plan(desired, context, changes) {
        Planned::FullSync => backend.full_sync(desired, context),
        Planned::Nothing => Ok(()),
        Planned::Write(mut plan) => match backend.write(&mut plan) {
            Ok(()) => {
                backend.commit(plan);
                Ok(())
            }
            Err(e) => {
                backend.forget();
                Err(e)
            }
        },
    }
}
