//! The allocator's structure checked whole, for tests.

use super::allocator::BuddyAllocator;
use super::bins::{length_bin, BINS, GROUP_BINS, LENGTH_BITS, NIL};
use super::config::Rounding;
use super::run::for_each_piece;

/// What a walk of the regions in address order found.
struct Walk {
    /// Free runs met.
    free_runs: usize,
    /// Units held by allocations.
    held_units: u64,
    /// Regions held by allocations.
    held_regions: u64,
    /// `counts[k]`: the free blocks of order `k` of the free runs.
    counts: [u64; 64],
}

impl BuddyAllocator {
    /// Checks the structure (for tests): the regions tile the capacity with no two free runs side
    /// by side, the bin lists hold exactly the free runs, each in the list of its bin,
    /// the counts match the blocks, no free block has a free buddy, and the counters add up.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let walk = self.check_address_order()?;
        let recorded: Vec<u64> = (0..64).map(|order| self.free_counts.get(order)).collect();
        if walk.counts[..] != recorded[..] {
            return Err(format!(
                "free counts {:?} but the runs hold {:?}",
                &recorded[..=self.max_order as usize],
                &walk.counts[..=self.max_order as usize]
            ));
        }
        let mut listed = 0usize;
        for bin in 0..BINS as u32 {
            self.check_bin(bin, &mut listed, walk.free_runs)?;
        }
        if listed != walk.free_runs {
            return Err(format!(
                "{listed} runs listed but {} free runs",
                walk.free_runs
            ));
        }
        self.check_no_free_buddies()?;
        if walk.held_units != self.allocated_units || walk.held_regions != self.allocation_count {
            return Err(format!(
                "{} held regions of {} units, but the counters say {} and {}",
                walk.held_regions, walk.held_units, self.allocation_count, self.allocated_units
            ));
        }
        Ok(())
    }

    /// Walks the regions in address order from offset 0: they tile the capacity, each linked
    /// back to the one before, with no two free runs side by side.
    fn check_address_order(&self) -> Result<Walk, String> {
        let mut walk = Walk {
            free_runs: 0,
            held_units: 0,
            held_regions: 0,
            counts: [0; 64],
        };
        let mut position = 0u64;
        let mut previous: Option<(u32, bool)> = None;
        let mut index = 0u32;
        let mut walked = 0usize;
        loop {
            walked += 1;
            if walked > self.regions.len() {
                return Err("the address order has a cycle".into());
            }
            let region = &self.regions[index as usize];
            if region.start != position || region.end <= region.start {
                return Err(format!(
                    "region {index} is [{}, {}), expected to start at {position}",
                    region.start, region.end
                ));
            }
            if region.prev != previous.map_or(NIL, |p| p.0) {
                return Err(format!("region {index}: prev link {}", region.prev));
            }
            if region.is_free() {
                if previous.is_some_and(|p| p.1) {
                    return Err(format!("free run {index} follows a free run"));
                }
                walk.free_runs += 1;
                for_each_piece(region.start, region.end, self.max_order, |_, order| {
                    walk.counts[order as usize] += 1
                });
            } else {
                walk.held_units += region.end - region.start;
                walk.held_regions += 1;
            }
            position = region.end;
            previous = Some((index, region.is_free()));
            if region.next == NIL {
                break;
            }
            index = region.next;
        }
        if position != self.capacity_units {
            return Err(format!(
                "the regions end at {position}, not at the capacity {}",
                self.capacity_units
            ));
        }
        Ok(walk)
    }

    /// Checks the list of bin `bin` against the bitmaps, its links and the bin of each run it
    /// lists; `listed` counts the runs listed so far, which must not pass `free_runs`.
    fn check_bin(&self, bin: u32, listed: &mut usize, free_runs: usize) -> Result<(), String> {
        let mut run = self.heads[bin as usize];
        let (group, bit) = (bin >> LENGTH_BITS, bin & (GROUP_BINS - 1));
        if (run != NIL) != (self.bins[group as usize] >> bit & 1 == 1) {
            return Err(format!("bin {bin}: the mask disagrees with the list"));
        }
        if (self.bins[group as usize] != 0) != (self.groups >> group & 1 == 1) {
            return Err(format!("group {group}: the mask disagrees with the bins"));
        }
        let mut list_prev = NIL;
        while run != NIL {
            *listed += 1;
            if *listed > free_runs {
                return Err("the bin lists hold more than the free runs".into());
            }
            let region = &self.regions[run as usize];
            if !region.is_free() || region.list_prev != list_prev {
                return Err(format!("bin {bin}: region {run} is badly linked"));
            }
            let expected = match self.rounding {
                Rounding::Exact => length_bin(region.end - region.start),
                Rounding::PowerOfTwo => region.pieces().top() << LENGTH_BITS,
            };
            if expected != bin {
                return Err(format!(
                    "bin {bin}: run [{}, {}) belongs in bin {expected}",
                    region.start, region.end
                ));
            }
            list_prev = run;
            run = region.list_next;
        }
        if self.tails[bin as usize] != list_prev {
            return Err(format!("bin {bin}: the tail is not the last run listed"));
        }
        Ok(())
    }

    /// Checks that coalescing is complete: no free block has a free buddy.
    fn check_no_free_buddies(&self) -> Result<(), String> {
        let blocks: std::collections::HashSet<(u64, u64)> =
            self.free_blocks().into_iter().collect();
        for &(offset, size) in &blocks {
            if size < self.min_block() << self.max_order && blocks.contains(&(offset ^ size, size))
            {
                return Err(format!(
                    "free blocks at {offset} and {} of {size} bytes are buddies",
                    offset ^ size
                ));
            }
        }
        Ok(())
    }
}
