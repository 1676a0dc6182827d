//! A forked child's heap starts as its parent's: the child's trace has a
//! FORK record naming the parent's trace (beside it), the forking image and
//! the fork's time in the parent's clock. Reading the child's trace reads
//! the parent's up to that time first and hands the child's visitor what it
//! needs to start from the parent's heap ([`Inherited`]), not as the
//! child's own calls. A parent that was itself forked inherits the same way.
//!
//! The parent's history is replayed, not just its live blocks, so that a
//! model following more than the blocks (glibc's tcaches and arenas, the
//! program's trims) starts where the parent's stood.

use std::path::{Path, PathBuf};

use memgap_trace::records::{Fork, Metrics, Process, Snapshot, Thread};

use crate::{LiveSet, ThreadEvent, Visitor};

/// One item of the parent's history up to a fork, for the child's visitor.
#[derive(Debug, Clone, Copy)]
pub enum Inherited<'a> {
    /// A heap event of the parent before the fork, stamped with the
    /// child's start time (the parent's clock is not the child's).
    Event(&'a ThreadEvent),
    /// A thread of the parent: its stack is still mapped in the child.
    Thread(&'a Thread),
    /// The parent's own figures before the fork (its `malloc_trim` calls).
    Metrics(&'a Metrics),
    /// A snapshot of the parent before the fork.
    Snapshot(&'a Snapshot),
    /// The parent's heap at the fork is complete; the child's own items follow.
    End,
}

/// Forks followed from one trace back to its first ancestor at most: a
/// chain longer than this (or a trace naming itself) is not followed.
pub(crate) const MAX_GENERATIONS: u32 = 64;

/// Where a trace sits among the traces of its run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lineage {
    /// The trace's directory: a parent's trace is beside its child's.
    pub dir: PathBuf,
    pub run_id: u64,
    /// Parents followed to get here (0: the trace asked for).
    pub generation: u32,
    /// The image being read: (pid, start_time, start_monotonic_ns).
    pub image: Option<(u32, u64, u64)>,
    /// Reading a parent up to a fork: where to stop.
    pub cut: Option<Cut>,
    /// Why a parent's heap could not be read, from a generation further up.
    pub failure: Option<String>,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cut {
    pub parent_pid: u32,
    pub image_start_ns: u64,
    /// The fork's time: items of this time or earlier are inherited.
    pub time: u64,
    /// The forking image is being read.
    pub active: bool,
    /// The forking image was seen at all.
    pub found: bool,
    /// Everything up to the fork was handed on: the rest is not read.
    pub reached: bool,
}

impl Cut {
    pub fn of(fork: &Fork) -> Cut {
        Cut { parent_pid: fork.parent_pid, image_start_ns: fork.parent_image_start_ns, time: fork.time, ..Cut::default() }
    }

    pub fn is_forking_image(&self, process: &Process) -> bool {
        process.pid == self.parent_pid && process.start_monotonic_ns == self.image_start_ns
    }

    /// Items before this time are inherited.
    pub fn limit(&self) -> u64 {
        self.time.saturating_add(1)
    }
}

/// The parent's trace named by `fork`, beside the child's in `dir`; or why
/// it cannot be read.
pub(crate) fn parent_trace(dir: &Path, fork: &Fork) -> Result<PathBuf, String> {
    let name = fork.parent_trace.as_str();
    let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
    if plain { Ok(dir.join(name)) } else { Err(format!("process {}'s trace is not named", fork.parent_pid)) }
}

/// The visitor of a parent's replay: hands the child's visitor the parent's
/// forking image as [`Inherited`] items, and nothing of its other images.
pub(crate) struct Inheriting<'a> {
    pub target: &'a mut dyn Visitor,
    pub cut: Cut,
    /// The child's start: inherited events carry it.
    pub child_start_time: u64,
    /// Figures of the parent recorded after this (the child's start, right
    /// after the fork) are not the child's.
    pub child_start_ns: u64,
    active: bool,
}

impl<'a> Inheriting<'a> {
    pub fn new(target: &'a mut dyn Visitor, cut: Cut, child_start_time: u64, child_start_ns: u64) -> Inheriting<'a> {
        Inheriting { target, cut, child_start_time, child_start_ns, active: false }
    }
}

impl Visitor for Inheriting<'_> {
    fn process(&mut self, process: &Process) {
        self.active = self.cut.is_forking_image(process);
    }

    fn event(&mut self, event: &ThreadEvent) {
        if self.active {
            let mut event = *event;
            event.event.time = self.child_start_time;
            self.target.inherited(Inherited::Event(&event));
        }
    }

    fn thread(&mut self, thread: &Thread) {
        if self.active {
            self.target.inherited(Inherited::Thread(thread));
        }
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if self.active && metrics.monotonic_ns < self.child_start_ns {
            self.target.inherited(Inherited::Metrics(metrics));
        }
    }

    fn snapshot(&mut self, snapshot: &Snapshot) {
        if self.active {
            self.target.inherited(Inherited::Snapshot(snapshot));
        }
    }

    /// Stack ids are shared with the child's replay: every one is told,
    /// whichever image defined it first.
    fn stack(&mut self, id: u32, frames: &std::sync::Arc<[u64]>) {
        self.target.stack(id, frames);
    }

    /// The code objects the parent's stacks name, like its stacks.
    fn python_code(&mut self, image: u32, code: &memgap_trace::python::PythonCode) {
        self.target.python_code(image, code);
    }

    /// A grandparent's history, when the parent's forking image is its first.
    fn inherited(&mut self, item: Inherited<'_>) {
        match item {
            Inherited::End => {}
            Inherited::Event(event) if self.active => {
                let mut event = *event;
                event.event.time = self.child_start_time;
                self.target.inherited(Inherited::Event(&event));
            }
            Inherited::Metrics(metrics) if self.active && metrics.monotonic_ns >= self.child_start_ns => {}
            item if self.active => self.target.inherited(item),
            _ => {}
        }
    }

    fn live_set(&self) -> Option<&LiveSet> {
        self.target.live_set()
    }
}
