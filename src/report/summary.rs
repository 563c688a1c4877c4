//! The human summary: a fixed-width table in the manner of `torch.cuda.memory_summary()`, and a
//! per-segment map for the terminal.

use std::fmt;

use super::device::{AllocatorReport, DeviceCounters, DeviceReport};
use super::Report;
use crate::policy::Counter;
use crate::state::{PoolFigures, PoolState, SegmentState, SpanKind};

/// Width of the summary table, in characters.
const TABLE_WIDTH: usize = 79;
/// Width of a segment bar in the summary, in characters.
const MAP_WIDTH: usize = 60;
/// Segments drawn in the summary's map before the rest are counted instead.
const MAP_MAX_SEGMENTS: usize = 32;

/// `bytes` with a binary unit: `512 B`, `1.50 KiB`, `64.00 MiB`, `2.00 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// `bytes` with a binary unit and at most one decimal, none when it is a whole number: `512 B`,
/// `1.5 KiB`, `100 MiB`.
pub fn format_bytes_short(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut scale = 1u64;
    while unit + 1 < UNITS.len() && bytes >= scale * 1024 {
        scale *= 1024;
        unit += 1;
    }
    if bytes.is_multiple_of(scale) {
        format!("{} {}", bytes / scale, UNITS[unit])
    } else {
        format!("{:.1} {}", bytes as f64 / scale as f64, UNITS[unit])
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

/// Writes table rows: `| text ... |`, wrapping text longer than the table.
struct Table<'a, 'b> {
    f: &'a mut fmt::Formatter<'b>,
}

impl Table<'_, '_> {
    fn rule(&mut self, fill: char) -> fmt::Result {
        writeln!(
            self.f,
            "|{}|",
            std::iter::repeat_n(fill, TABLE_WIDTH - 2).collect::<String>()
        )
    }

    /// A free-form row; text wider than the table wraps at spaces onto lines indented by four
    /// more spaces than the text's own indentation.
    fn row(&mut self, text: &str) -> fmt::Result {
        let inner = TABLE_WIDTH - 4;
        let indent = text.len() - text.trim_start().len();
        let mut line = " ".repeat(indent);
        let mut at_start = true;
        for word in text.split_whitespace() {
            if !at_start && line.chars().count() + 1 + word.chars().count() > inner {
                writeln!(self.f, "| {line:<inner$} |")?;
                line = " ".repeat(indent + 4);
                at_start = true;
            }
            if !at_start {
                line.push(' ');
            }
            line.push_str(word);
            at_start = false;
        }
        writeln!(self.f, "| {line:<inner$} |")
    }

    fn centered(&mut self, text: &str) -> fmt::Result {
        let inner = TABLE_WIDTH - 4;
        writeln!(self.f, "| {text:^inner$} |")
    }

    /// A metric row: name, then current / peak / total allocated / total freed.
    fn counter(&mut self, name: &str, counter: &Counter, bytes: bool) -> fmt::Result {
        let cell = |value: u64| {
            if bytes {
                format_bytes(value)
            } else {
                value.to_string()
            }
        };
        writeln!(
            self.f,
            "| {name:<20}| {:>11} | {:>11} | {:>11} | {:>11} |",
            cell(counter.current),
            cell(counter.peak),
            cell(counter.total),
            cell(counter.freed)
        )
    }
}

/// The device's rows: the adapter and its limits, wgpu's allocator report against this crate's
/// buffers, and wgpu's counters.
fn device_rows(table: &mut Table<'_, '_>, device: &DeviceReport) -> fmt::Result {
    adapter_rows(table, device)?;
    allocator_rows(table, device)?;
    counter_row(table, &device.counters)
}

/// The adapter, its driver and the limits that matter to the pool and the kernels.
fn adapter_rows(table: &mut Table<'_, '_>, device: &DeviceReport) -> fmt::Result {
    let adapter = &device.adapter;
    let vendor = match &adapter.vendor_name {
        Some(name) => format!("{name} ({:#x})", adapter.vendor_id),
        None => format!("{:#x}", adapter.vendor_id),
    };
    table.row(&format!("Device: {}", adapter.name))?;
    table.row(&format!(
        "  {} backend, {}, vendor {vendor}, driver {} {}",
        adapter.backend, adapter.device_type, adapter.driver, adapter.driver_info
    ))?;
    let limits = &device.limits;
    table.row(&format!(
        "  max_buffer_size {} | max_storage_buffer_binding_size {}",
        format_bytes(limits.max_buffer_size),
        format_bytes(limits.max_storage_buffer_binding_size)
    ))?;
    table.row(&format!(
        "  min_storage_buffer_offset_alignment {} B | max_storage_buffers_per_shader_stage {}",
        limits.min_storage_buffer_offset_alignment, limits.max_storage_buffers_per_shader_stage
    ))?;
    table.row(&format!(
        "  workgroups: size {}x{}x{}, {} invocations, {} shared, {} per dimension",
        limits.max_compute_workgroup_size_x,
        limits.max_compute_workgroup_size_y,
        limits.max_compute_workgroup_size_z,
        limits.max_compute_invocations_per_workgroup,
        format_bytes(u64::from(limits.max_compute_workgroup_storage_size)),
        limits.max_compute_workgroups_per_dimension
    ))
}

/// wgpu's allocator report, and this crate's buffers on the device set against it.
fn allocator_rows(table: &mut Table<'_, '_>, device: &DeviceReport) -> fmt::Result {
    match &device.allocator {
        AllocatorReport::Present {
            total_allocated_bytes,
            total_reserved_bytes,
            block_count,
            allocation_count,
            ..
        } => table.row(&format!(
            "wgpu allocator report: {} allocated in {allocation_count} allocations, {} reserved in \
             {block_count} memory blocks",
            format_bytes(*total_allocated_bytes),
            format_bytes(*total_reserved_bytes)
        ))?,
        AllocatorReport::Absent { reason } => {
            table.row(&format!("wgpu allocator report: absent: {reason}"))?
        }
    }
    if let Some(accounted) = &device.accounted {
        let roles: Vec<String> = accounted
            .roles
            .iter()
            .filter(|row| row.buffers > 0)
            .map(|row| {
                format!(
                    "{} {} in {}",
                    row.role.name(),
                    format_bytes(row.bytes),
                    row.buffers
                )
            })
            .collect();
        table.row(&format!(
            "This crate's buffers on the device: {} ({})",
            format_bytes(accounted.total_bytes()),
            if roles.is_empty() {
                "none".to_string()
            } else {
                roles.join(", ")
            }
        ))?;
        match device.unaccounted_bytes() {
            Some(difference) => {
                table.row(&format!(
                "  the allocator report {} them by {}: wgpu's own buffers, allocation alignment, \
                 and buffers made outside this crate",
                if difference >= 0 { "exceeds" } else { "falls short of" },
                format_bytes(u64::try_from(difference.unsigned_abs()).unwrap_or(u64::MAX))
            ))?
            }
            None => table.row("  no allocator report to compare them with on this backend")?,
        }
    }
    Ok(())
}

/// wgpu's internal resource counters, or why they are off.
fn counter_row(table: &mut Table<'_, '_>, counters: &DeviceCounters) -> fmt::Result {
    match counters {
        DeviceCounters::Enabled {
            buffers,
            buffer_memory_bytes,
            memory_allocations,
            bind_groups,
            ..
        } => table.row(&format!(
            "wgpu counters: {buffers} buffers, {} buffer memory, {memory_allocations} memory \
             allocations, {bind_groups} bind groups",
            format_bytes(u64::try_from(*buffer_memory_bytes).unwrap_or(0))
        )),
        DeviceCounters::Disabled { reason } => table.row(&format!("wgpu counters: off: {reason}")),
    }
}

/// The pool's rows: its counters, then where its memory is, then its bookkeeping.
fn pool_rows(table: &mut Table<'_, '_>, pool: &PoolFigures) -> fmt::Result {
    counter_rows(table, pool)?;
    memory_rows(table, pool)?;
    bookkeeping_rows(table, pool)
}

/// The metrics as current / peak / total allocated / total freed, between rules.
fn counter_rows(table: &mut Table<'_, '_>, pool: &PoolFigures) -> fmt::Result {
    let stats = &pool.stats;
    writeln!(
        table.f,
        "| {:<20}| {:>11} | {:>11} | {:>11} | {:>11} |",
        "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
    )?;
    table.rule('-')?;
    table.counter("Reserved memory", &stats.reserved_bytes, true)?;
    table.counter("Allocated memory", &stats.allocated_bytes, true)?;
    table.counter("Requested memory", &stats.requested_bytes, true)?;
    table.counter("Allocations", &stats.allocations, false)?;
    table.counter("Segments", &stats.segments, false)?;
    table.rule('-')
}

/// Where the memory is: live, in the largest allocation and free block, against the budget, and
/// lost to fragmentation.
fn memory_rows(table: &mut Table<'_, '_>, pool: &PoolFigures) -> fmt::Result {
    let stats = &pool.stats;
    table.row(&format!(
        "Live allocated memory: {} in {} allocations (allocated memory without {} pending frees \
         of {})",
        format_bytes(stats.live_allocated_bytes()),
        stats.live_allocations(),
        stats.pending_frees,
        format_bytes(stats.pending_free_bytes)
    ))?;
    table.row(&format!(
        "Largest allocation now: {} ({} bindable; max_storage_buffer_binding_size {})",
        format_bytes(pool.largest_allocation_now_bytes),
        format_bytes(pool.largest_bindable_allocation_now_bytes),
        format_bytes(pool.max_storage_buffer_binding_size)
    ))?;
    table.row(&format!(
        "Largest free block: {} of {} free in segments; {} reserved but unallocated",
        format_bytes(pool.largest_free_block_bytes),
        format_bytes(stats.free_bytes),
        format_bytes(
            stats
                .reserved_bytes
                .current
                .saturating_sub(stats.allocated_bytes.current)
        )
    ))?;
    match (pool.budget_bytes, pool.budget_headroom_bytes) {
        (Some(budget), Some(headroom)) => table.row(&format!(
            "Budget: {}, headroom {}",
            format_bytes(budget),
            format_bytes(headroom)
        ))?,
        _ => table.row("Budget: none")?,
    }
    table.row(&format!(
        "Fragmentation: internal {} (rounding), external {} (free memory outside the largest \
         free block, in segments that hold allocations)",
        percent(pool.internal_fragmentation),
        percent(pool.external_fragmentation)
    ))
}

/// The pool's bookkeeping: pending frees, empty segments, calls, the staging buffer, the free
/// blocks by size and the history.
fn bookkeeping_rows(table: &mut Table<'_, '_>, pool: &PoolFigures) -> fmt::Result {
    let stats = &pool.stats;
    table.row(&format!(
        "Pending frees: {} ({}) | empty segments: {} | create_buffer calls: {} | OOMs: {}",
        pool.pending_free_count,
        format_bytes(pool.pending_free_bytes),
        format_bytes(pool.empty_segment_bytes),
        stats.create_segment_calls,
        stats.oom_count
    ))?;
    table.row(&format!(
        "Read-back staging buffer: {} (outside the segments; trim() gives it back)",
        format_bytes(pool.staging_bytes)
    ))?;
    let free_blocks: Vec<String> = pool
        .free_blocks_per_size
        .iter()
        .map(|f| format!("{} x{}", format_bytes(f.size_bytes), f.count))
        .collect();
    table.row(&format!(
        "Free blocks per size: {}",
        if free_blocks.is_empty() {
            "none".to_string()
        } else {
            free_blocks.join(", ")
        }
    ))?;
    if !pool.named_parts.is_empty() {
        let parts: Vec<String> = pool
            .named_parts
            .iter()
            .map(|part| {
                format!(
                    "{} {} in {}",
                    part.name,
                    format_bytes(part.bytes),
                    part.spans
                )
            })
            .collect();
        table.row(&format!("Named parts: {}", parts.join(", ")))?;
    }
    match &pool.history {
        Some(history) => table.row(&format!(
            "History: on, {} of at most {} events held, {} dropped",
            history.events, history.max_events, history.dropped_events
        )),
        None => table.row("History: off"),
    }
}

impl fmt::Display for PoolFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut table = Table { f };
        table.rule('=')?;
        pool_rows(&mut table, self)?;
        table.rule('=')
    }
}

impl fmt::Display for DeviceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut table = Table { f };
        table.rule('=')?;
        device_rows(&mut table, self)?;
        table.rule('=')
    }
}

impl fmt::Display for Report {
    /// The device, the pool's table and a map of the first segments.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut table = Table { f };
        table.rule('=')?;
        table.centered(&format!(
            "wgpu-pool memory summary ({})",
            if self.pool.naive {
                "naive: one buffer per allocation"
            } else {
                "buddy pool"
            }
        ))?;
        table.rule('-')?;
        device_rows(&mut table, &self.device)?;
        if let Some(device) = &self.device_memory {
            table.row(&format!(
                "Device total ({}): {} allocated{} | pool reserved {}",
                device.source,
                format_bytes(device.allocated_bytes),
                device
                    .reserved_bytes
                    .map(|r| format!(", {} reserved", format_bytes(r)))
                    .unwrap_or_default(),
                format_bytes(self.pool.stats.reserved_bytes.current)
            ))?;
        }
        table.rule('=')?;
        pool_rows(&mut table, &self.pool)?;
        table.rule('=')?;
        let shown = self.segments.len().min(MAP_MAX_SEGMENTS);
        if !self.segments.is_empty() {
            writeln!(f, "Segment map ({MAP_LEGEND}):")?;
            for segment in &self.segments[..shown] {
                writeln!(f, "{}", segment_line(segment, MAP_WIDTH))?;
            }
            if shown < self.segments.len() {
                writeln!(f, "... and {} more segments", self.segments.len() - shown)?;
            }
        }
        Ok(())
    }
}

/// What the map's characters mean.
pub const MAP_LEGEND: &str =
    "runs labelled when wide enough; # used, ~ pending free, . free; 1-9: tenths used";

/// Every segment of `state` as one line of about `width` characters:
/// `seg    0   4.00 MiB packed    |--- used 1 MiB ---|------- free 3 MiB -------|`.
pub fn segment_map(state: &PoolState, width: usize) -> String {
    let mut out = String::new();
    for segment in &state.segments {
        out.push_str(&segment_line(segment, width));
        out.push('\n');
    }
    out
}

/// One segment's line.
pub fn segment_line(segment: &SegmentState, width: usize) -> String {
    format!(
        "seg {:>4} {:>10} {:<9} {}",
        segment.id.0,
        format_bytes(segment.size_bytes),
        segment.kind(),
        segment_bar(segment, width.max(8))
    )
}

/// A run of spans of one kind (allocations next to each other are one "used" run).
struct Run {
    kind: SpanKind,
    bytes: u64,
}

fn runs(segment: &SegmentState) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for span in &segment.spans {
        match runs.last_mut() {
            Some(run) if run.kind == span.kind => {
                run.bytes = run.bytes.saturating_add(span.size_bytes);
            }
            _ => runs.push(Run {
                kind: span.kind,
                bytes: span.size_bytes,
            }),
        }
    }
    runs
}

fn fill_char(kind: SpanKind) -> char {
    match kind {
        SpanKind::Allocated => '#',
        SpanKind::PendingFree => '~',
        SpanKind::Free => '.',
    }
}

/// The bar of one segment: labelled runs when they fit, a density strip otherwise.
fn segment_bar(segment: &SegmentState, width: usize) -> String {
    let runs = runs(segment);
    let total: u64 = runs
        .iter()
        .map(|run| run.bytes)
        .fold(0, u64::saturating_add);
    if runs.is_empty() || total == 0 {
        return format!("|{}|", " ".repeat(width - 2));
    }
    // `|` before each run and one at the end; each run at least one character.
    let room = width.saturating_sub(runs.len() + 1);
    if room < runs.len() {
        return density_bar(segment, width);
    }
    let mut widths: Vec<usize> = runs
        .iter()
        .map(|run| ((run.bytes as u128 * room as u128 / total as u128) as usize).max(1))
        .collect();
    // Give or take characters from the widest runs until the bar is exactly `width`.
    while widths.iter().sum::<usize>() > room {
        if let Some(widest) = (0..widths.len()).max_by_key(|&i| widths[i]) {
            widths[widest] -= 1;
        }
    }
    while widths.iter().sum::<usize>() < room {
        if let Some(largest) = (0..runs.len()).max_by_key(|&i| runs[i].bytes) {
            widths[largest] += 1;
        }
    }
    let mut bar = String::from("|");
    for (run, &chars) in runs.iter().zip(&widths) {
        let word = match run.kind {
            SpanKind::Allocated => "used",
            SpanKind::PendingFree => "pending",
            SpanKind::Free => "free",
        };
        // "--- used 100 MiB ---" when it fits, else "### 100 MiB ###" (the fill says the kind),
        // else the fill alone.
        let size = format_bytes_short(run.bytes);
        let text = [
            (format!(" {word} {size} "), '-'),
            (format!(" {size} "), fill_char(run.kind)),
        ]
        .into_iter()
        .find(|(text, _)| text.chars().count() + 2 <= chars);
        match text {
            Some((text, fill)) => {
                let text_chars = text.chars().count();
                let left = (chars - text_chars) / 2;
                let right = chars - text_chars - left;
                bar.extend(std::iter::repeat_n(fill, left));
                bar.push_str(&text);
                bar.extend(std::iter::repeat_n(fill, right));
            }
            None => bar.extend(std::iter::repeat_n(fill_char(run.kind), chars)),
        }
        bar.push('|');
    }
    bar
}

/// One character per `size / width` bytes: `#` all used, `.` all free, `~` pending without free,
/// a digit for tenths used.
fn density_bar(segment: &SegmentState, width: usize) -> String {
    let cells = width.saturating_sub(2).max(1) as u128;
    let size = u128::from(segment.size_bytes.max(1));
    let mut used = vec![0u128; cells as usize];
    let mut pending = vec![0u128; cells as usize];
    for span in &segment.spans {
        if span.kind == SpanKind::Free {
            continue;
        }
        let (start, end) = (u128::from(span.offset_bytes), u128::from(span.end_bytes()));
        let first = (start * cells / size) as usize;
        let last = (((end * cells).div_ceil(size)) as usize).min(cells as usize);
        for cell in first..last {
            let cell_start = cell as u128 * size / cells;
            let cell_end = (cell as u128 + 1) * size / cells;
            let overlap = end.min(cell_end).saturating_sub(start.max(cell_start));
            used[cell] += overlap;
            if span.kind == SpanKind::PendingFree {
                pending[cell] += overlap;
            }
        }
    }
    let mut bar = String::from("|");
    for cell in 0..cells as usize {
        let cell_bytes = (cell as u128 + 1) * size / cells - cell as u128 * size / cells;
        let c = if used[cell] == 0 {
            '.'
        } else if used[cell] >= cell_bytes {
            if pending[cell] * 2 > cell_bytes {
                '~'
            } else {
                '#'
            }
        } else {
            let tenths = (used[cell] * 10 / cell_bytes.max(1)).clamp(1, 9) as u8;
            char::from(b'0' + tenths)
        };
        bar.push(c);
    }
    bar.push('|');
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::SegmentId;
    use crate::state::fixtures::{synthetic, MIB};
    use crate::state::Span;

    #[test]
    fn bytes_are_formatted_with_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(64 * MIB), "64.00 MiB");
        assert_eq!(format_bytes(3 << 30), "3.00 GiB");
        assert_eq!(format_bytes_short(100 * MIB), "100 MiB");
        assert_eq!(format_bytes_short(1536), "1.5 KiB");
        assert_eq!(format_bytes_short(512), "512 B");
    }

    #[test]
    fn the_map_labels_wide_runs_and_keeps_its_width() {
        let segment = SegmentState {
            id: SegmentId(0),
            size_bytes: 300 * MIB,
            class: crate::policy::SegmentClass::Packed,
            spans: vec![
                Span::allocated(0, 100 * MIB, 100 * MIB),
                Span::free(100 * MIB, 50 * MIB),
                Span::allocated(150 * MIB, 150 * MIB, 150 * MIB),
            ],
        };
        let bar = segment_bar(&segment, 100);
        assert_eq!(bar.chars().count(), 100, "{bar}");
        assert!(bar.contains(" used 100 MiB "), "{bar}");
        assert!(bar.contains(" free 50 MiB "), "{bar}");
        let narrow = segment_bar(&segment, 40);
        assert_eq!(narrow.chars().count(), 40, "{narrow}");
        assert!(
            narrow.contains('.'),
            "a free run too narrow for text is dots: {narrow}"
        );
        assert!(bar.starts_with("|-") && bar.ends_with("-|"), "{bar}");
    }

    #[test]
    fn many_runs_become_a_density_strip() {
        let spans: Vec<Span> = (0..100)
            .map(|i| {
                if i % 2 == 0 {
                    Span::allocated(i * 1024, 1024, 1000)
                } else {
                    Span::free(i * 1024, 1024)
                }
            })
            .collect();
        let segment = SegmentState {
            id: SegmentId(1),
            size_bytes: 100 * 1024,
            class: crate::policy::SegmentClass::Packed,
            spans,
        };
        let bar = segment_bar(&segment, 40);
        assert_eq!(bar.chars().count(), 40, "{bar}");
        assert!(bar.chars().any(|c| c.is_ascii_digit()), "{bar}");
    }

    #[test]
    fn the_summary_prints_every_figure() {
        let (state, _) = synthetic();
        let figures = PoolFigures::from_state(&state);
        let text = figures.to_string();
        for needle in [
            "Reserved memory",
            "4.00 MiB",
            "Allocated memory",
            "Requested memory",
            "Largest allocation now",
            "reserved but unallocated",
            "Budget: 8.00 MiB, headroom 4.00 MiB",
            "Pending frees: 1 (256 B)",
            "OOMs: 1",
            "Free blocks per size: 256 B x1",
            "History: off",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        for line in text.lines() {
            assert_eq!(line.chars().count(), TABLE_WIDTH, "{line:?}");
        }
        let map = segment_map(&state, 70);
        assert!(map.starts_with("seg    0   4.00 MiB packed"), "{map}");
    }
}
