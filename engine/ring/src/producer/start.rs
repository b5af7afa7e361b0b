//! The loader's side of `serve --resume auto` (see `crate::start`).

use super::Producer;
use crate::layout::RunStart;
use crate::start::{self, StartRequest};

impl Producer {
    /// Each rank's start request, None for a rank that made none yet.
    pub fn start_requests(&self) -> Vec<(u32, Option<StartRequest>)> {
        (0..self.view.layout().geometry.world_size)
            .map(|r| (r, start::requested(self.view.rank(r))))
            .collect()
    }

    /// Writes the start the ranks agreed on, then START_KNOWN, before any
    /// batch is published: a trainer that has a batch knows where its run
    /// started.
    pub fn publish_start(&self, start: RunStart) {
        start::publish_start(self.view.header(), start);
    }
}
